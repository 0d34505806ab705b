"""bench_dataplane.py's constants, results and sampling helpers (nothing here runs in a worker)."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20
GiB = 1 << 30
TIMEOUT = 900.0  # seconds for any one get / wait
RDMA_BUDGET = 60.0  # seconds for one RDMABuffer cell
RAY_STORE = 4 * GiB
BACKENDS = ("in_memory", "ray", "monarch", "rdma")
KINDS = ("numpy", "torch")
PUT_TASK, GET_ONLY, CREATE_GET, ACTOR_ARG = (
    "put -> task",
    "task -> get (get only)",
    "task -> get (create+get)",
    "actor arg",
)
RDMA_READ = "RDMABuffer read_into"
CASE_ORDER = (PUT_TASK, GET_ONLY, CREATE_GET, ACTOR_ARG, RDMA_READ, "np.copyto")
SYSTEM_ORDER = ("memcpy", "in_memory", "fray-ray", "raw-ray", "fray-monarch", "raw-monarch", "raw-rdma")
PAIRS = {"fray-ray": "raw-ray", "fray-monarch": "raw-monarch"}


# ---------------------------------------------------------------- results
class Results:
    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, str, int], list[float]] = {}
        self.notes: list[str] = []
        self.rss: list[dict[str, Any]] = []
        self.stats: dict[str, dict[str, dict[str, float]]] = {}

    def add(self, system: str, case: str, kind: str, size: int, seconds: float) -> None:
        self.samples.setdefault((system, case, kind, size), []).append(seconds)

    def note(self, text: str) -> None:
        self.notes.append(text)
        log(f"NOTE: {text}")

    def cell(self, system: str, case: str, kind: str, size: int) -> list[float] | None:
        return self.samples.get((system, case, kind, size))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def size_label(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} B"


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": MiB, "G": GiB}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 10:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def rss_kib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":")
            out[key] = int(value.split()[0])
    return out


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def settle_rss(limit: float = 10.0) -> None:
    """Wait (up to limit seconds) until the RSS moves by less than 1 MiB in 0.5 s."""
    deadline = time.monotonic() + limit
    last = rss_kib()["VmRSS"]
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_kib()["VmRSS"]
        if abs(now - last) < 1024:
            return
        last = now


def stats_snapshot(ctx: Any) -> dict[str, dict[str, float]]:
    return {
        path: {"count": ps.count, "bytes": ps.bytes, "seconds": ps.seconds} for path, ps in ctx.transfer_stats().items()
    }


def stats_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, int]:
    """Bytes moved per path between two snapshots."""
    return {
        path: int(v["bytes"] - before.get(path, {}).get("bytes", 0))
        for path, v in after.items()
        if v["bytes"] - before.get(path, {}).get("bytes", 0) > 0
    }


def values_for(n_bytes: int) -> dict[str, Any]:
    import torch

    n = n_bytes // 4
    return {"numpy": np.full(n, 1.5, dtype=np.float32), "torch": torch.full((n,), 1.5, dtype=torch.float32)}


def check(result: Any, n: int) -> None:
    if tuple(result) != (n, 1.5):
        raise AssertionError(f"reader returned {result!r}, expected ({n}, 1.5)")


# ---------------------------------------------------------------- sampling
def interleave(
    res: Results, kind: str, size: int, ops: list[tuple[str, Callable[[], dict[str, float]]]], repeats: int, warmup: int
) -> None:
    """Run each system's op once per round, alternating which goes first; record every round after the warm-up.
    An op returns {case: seconds} and drops its values before returning (stores do not fill up)."""
    for round_ in range(warmup + repeats):
        for system, op in ops if round_ % 2 == 0 else ops[::-1]:
            out = op()
            if round_ >= warmup:
                for case, seconds in out.items():
                    res.add(system, case, kind, size, seconds)
        gc.collect()


def memcpy_samples(res: Results, size: int, repeats: int) -> None:
    src = np.full(size // 4, 1.5, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0)  # fault the pages in: one memcpy is the limit being measured, not page faults
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        res.add("memcpy", "np.copyto", "bytes", size, time.perf_counter() - start)
    del src, dst


def warmup_of(size: int) -> int:
    return 1 if size < GiB else 0
