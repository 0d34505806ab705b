"""Large values between two hosts that are separate machines to fray, beside a plain TCP socket between them.

    sudo python benchmarks/bench_hosts.py [--sizes 100M,1G] [--repeats 10] [--json PATH] [--insecure]
                                          [--transport tls]

Three hosts on this machine, each its own network namespace (own address, hostname, loopback and /dev/shm;
tests/_netns.py): the driver in host 0, a host worker (`python -m fray_monarch.worker`) in hosts 1 and 2, and
`fray.init("monarch?hosts=...")` attached to them over TLS (an authority made for the run; --insecure: TCP).
For each size, in steady state (one warm-up, then --repeats loops):

- fray-monarch, host A -> host B: an actor on host 1 makes a numpy array (float32), then an actor on host 2 reads
  it (returns its length and first element). Timed: the read call, from the driver, after the value was made:
  the pull from host 1's store into host 2's (fray's direct TCP, `tcp-direct`: the bytes tagged with a GMAC,
  or with `--transport tls` inside TLS, encrypted) and one call round trip.
- plain socket: the same number of bytes over one TCP connection from host 1 to host 2 (`sendall` from a
  memoryview, `recv_into` a preallocated buffer; one request byte per transfer), measured before and after the
  fray loops in the same run: the network's limit between those two namespaces (a veth pair and a bridge).
- memcpy: np.copyto of the size into preallocated memory, in the driver: the machine's memory limit.

Reported: p50 and p90 seconds, GB/s, and fray's rate as a fraction of the socket's (target >= 0.8 at 100 MiB and
1 GiB). Needs root and iproute2 (network namespaces); not run in CI. `--driver` is the part that runs in host 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the namespaced hosts (tests/_netns.py)
sys.path.insert(0, str(HERE))

from _common import memcpy_seconds, percentile, under_socket_guard  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
TIMEOUT = 900.0
PORT = 29500


class Sink:
    """A fray actor that makes values and reads them (sent by value: it is defined in __main__)."""

    def make(self, n: int) -> Any:
        return np.full(n, 1.5, dtype=np.float32)

    def read(self, x: Any) -> tuple[int, float]:
        return int(x.shape[0]), float(x[0])

    def where(self) -> str:
        import socket

        return socket.gethostname()


def driver(spec: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    """Runs in host 0: the fray loops and memcpy; returns their samples."""
    import fray

    ctx = fray.init(spec)
    out: dict[str, Any] = {"fray": {}, "memcpy": {}}
    try:
        pair = ctx.create_actor_group(Sink, 2, placement="spread")
        out["where"] = ctx.get(pair.where(), timeout=TIMEOUT)
        maker, reader = pair[0], pair[1]
        for size in sizes:
            n = size // 4
            times = []
            for i in range(repeats + 1):
                ref = maker.make(n)
                ctx.wait([ref], timeout=TIMEOUT)
                start = time.perf_counter()
                length, first = ctx.get(reader.read(ref), timeout=TIMEOUT)
                if i:
                    times.append(time.perf_counter() - start)
                assert length == n and first == 1.5
                del ref
            out["fray"][size] = times
            out["memcpy"][size] = memcpy_seconds(size, repeats)
        out["paths"] = {p: [s.count, s.bytes] for p, s in ctx.transfer_stats().items()}
    finally:
        fray.shutdown()
    return out


def measure(sizes: list[int], repeats: int, insecure: bool = False, transport: str = "") -> dict[str, Any]:
    """Make the hosts, run the socket baseline, the fray loops (in host 0) and the socket baseline again."""
    from _netns import namespaced_hosts, plain_socket_rate, unavailable

    why = unavailable()
    if why is not None:
        raise SystemExit(f"bench_hosts: namespaced hosts cannot be made here: {why}")
    scheme, flags = ("tcp", ["--insecure"]) if insecure else ("tls", [])
    with namespaced_hosts(3) as hosts, tempfile.TemporaryDirectory(prefix="bench-hosts-") as tls_dir:
        env = {**os.environ, "FRAY_TLS_DIR": os.path.join(tls_dir, "tls")}  # an authority of this run's own
        workers = [
            h.popen(
                [sys.executable, "-m", "fray_monarch.worker", "--address", f"{scheme}://{h.name}:{PORT}", *flags],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # Monarch's host agent prints its log banner
                env=env,
            )
            for h in hosts[1:]
        ]
        try:
            socket_before = {size: plain_socket_rate(hosts[1], hosts[2], size, repeats) for size in sizes}
            spec = f"monarch?hosts={scheme}://{hosts[1].name}:{PORT},{scheme}://{hosts[2].name}:{PORT}&procs=1"
            spec += "&insecure=true" if insecure else ""
            spec += f"&transport={transport}" if transport else ""
            args = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--driver",
                spec,
                "--sizes",
                ",".join(map(str, sizes)),
                "--repeats",
                str(repeats),
            ]
            run = hosts[0].run(args, timeout=TIMEOUT * 2, capture_output=True, text=True, cwd=HERE, env=env)
            if run.returncode != 0:
                raise SystemExit(f"bench_hosts: the driver in host 0 failed:\n{run.stderr[-4000:]}")
            fray_out = json.loads(run.stdout.strip().splitlines()[-1])
            socket_after = {size: plain_socket_rate(hosts[1], hosts[2], size, repeats) for size in sizes}
        finally:
            for w in workers:
                w.kill()
                w.wait(15)
    fray_out["socket"] = {size: socket_before[size] + socket_after[size] for size in sizes}
    fray_out["hosts"] = [h.name for h in hosts]
    fray_out["transport"] = transport
    return fray_out


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def label(size: int) -> str:
    return f"{size // GiB} GiB" if size >= GiB else f"{size // MiB} MiB"


def report(out: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        cells = {
            name: out[name][str(size)] if str(size) in out[name] else out[name][size]
            for name in ("fray", "socket", "memcpy")
        }
        row: dict[str, Any] = {"size": size}
        for name, samples in cells.items():
            p50, p90 = percentile(samples, 50), percentile(samples, 90)
            row[name] = {"p50_s": p50, "p90_s": p90, "gbps_p50": size / p50 / 1e9, "n": len(samples)}
        row["fray_rate_vs_socket_p50"] = row["socket"]["p50_s"] / row["fray"]["p50_s"]
        row["fray_rate_vs_memcpy_p50"] = row["memcpy"]["p50_s"] / row["fray"]["p50_s"]
        rows.append(row)
    print(f"\nHost A -> host B (separate network namespaces), p50 / p90 of steady-state loops; hosts {out['hosts']}")
    print(f"data plane: transport={out.get('transport') or 'auto'}")
    print(f"{'size':>8} {'path':>22} {'p50':>10} {'p90':>10} {'GB/s p50':>9} {'x socket':>9}")
    for row in rows:
        for name, what in (("socket", "plain TCP socket"), ("fray", "fray-monarch actor A->B"), ("memcpy", "memcpy")):
            cell = row[name]
            ratio = row["socket"]["p50_s"] / cell["p50_s"]
            print(
                f"{label(row['size']):>8} {what:>22} {cell['p50_s'] * 1e3:>8.1f}ms {cell['p90_s'] * 1e3:>8.1f}ms "
                f"{cell['gbps_p50']:>9.2f} {ratio:>9.2f}"
            )
    target = all(r["fray_rate_vs_socket_p50"] >= 0.8 for r in rows if r["size"] >= 100 * MiB)
    print(f"target (100 MiB and 1 GiB at >= 0.8x the socket's rate, p50): {'met' if target else 'NOT met'}")
    print(f"transfer_stats: {out.get('paths')}; actors on {out.get('where')}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100M,1G")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default=None)
    parser.add_argument("--insecure", action="store_true", help="plain TCP between the hosts instead of TLS")
    parser.add_argument("--transport", default="", help="the spec's transport= (tls: the data plane encrypted)")
    parser.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    sizes = [parse_size(s) for s in opts.sizes.split(",") if s.strip()]
    if opts.driver:
        print(json.dumps(driver(opts.driver, sizes, opts.repeats)), flush=True)
        return
    out = measure(sizes, opts.repeats, opts.insecure, opts.transport)
    rows = report(out, sizes)
    if opts.json:
        Path(opts.json).write_text(json.dumps({"rows": rows, "raw": out, "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    under_socket_guard()
    main()
