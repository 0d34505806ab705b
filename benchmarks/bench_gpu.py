"""CUDA tensors through fray on every backend, beside the engines used directly and the device's own limits, in
one run (issue 27). Needs a CUDA GPU; elsewhere it says so and exits 0.

    python benchmarks/bench_gpu.py                     # limits, then every installed backend (a subprocess each)
    python benchmarks/bench_gpu.py --backend ray       # one backend (and its raw engine)
    python benchmarks/bench_gpu.py --sizes 256 1024    # MiB (default 256 and 1024)
    python benchmarks/bench_gpu.py --quick             # 16 MiB, 3 samples (a smoke run)

Each row: p50 and p90 (ms) of `--repeats` samples after `--warmup` runs, one float32 CUDA tensor of each size:
- limits (this process): device-to-device copy, pinned device->host and host->device, pageable device->host;
- fray, per backend: put -> get; a task makes it -> the driver has it; the driver's tensor -> a task (which
  returns its sum); actor -> actor (one actor makes it, the other gets it as an argument);
- raw Ray (its object store, as Ray users pass tensors): put -> get, task -> driver, driver -> task; Ray Direct
  Transport `cuda_ipc` actor -> actor (RDT's one same-host GPU path);
- raw Monarch: an endpoint's result -> driver (Monarch returns it on the CPU), an argument -> an actor, and
  RDMABuffer.read_into of CUDA memory.
A row that cannot run says why (n/a: ...) and the others go on: the GPU machine's time is scarce.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import percentile, under_socket_guard

MiB = 1 << 20
SPECS = {"in_memory": "in_memory", "ray": "ray?num_cpus=4&log_to_driver=false", "monarch": "monarch?procs=1"}
ON_GPU: dict[str, float] = {"CPU": 0.5, "GPU": 0.25}  # every task and actor here shares the one device

Row = tuple[str, list[float] | str]  # (name, samples in seconds, or why it could not run)


ROW_SECONDS = 30.0  # a row stops sampling after this long (3 samples at least): raw object stores take seconds


def _samples(fn: Callable[[], object], repeats: int, warmup: int) -> list[float] | str:
    try:
        for _ in range(warmup):
            fn()
        out: list[float] = []
        began = time.perf_counter()
        while len(out) < repeats and (len(out) < 3 or time.perf_counter() - began < ROW_SECONDS):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return out
    except Exception as exc:  # one peer failing must not cost the run
        return _not_measured(exc)


def _not_measured(exc: Exception) -> str:
    """A row's place when it could not run: why (one peer failing must not cost the run)."""
    return f"n/a: {type(exc).__name__}: {str(exc)[:120]}"


def _row(name: str, samples: list[float] | str) -> Row:
    """A measured row, printed at once as well (a run cut short by its time limit still says what it measured)."""
    shown = samples
    if not isinstance(samples, str):
        shown = f"p50 {percentile(samples, 50) * 1e3:.2f} ms, p90 {percentile(samples, 90) * 1e3:.2f} ms"
    print(f"  measured: {name}: {shown}", flush=True)
    return (name, samples)


def _sync(value: Any = None) -> Any:
    import torch

    torch.cuda.synchronize()
    return value


# ---------------------------------------------------------------- what runs in tasks and actors
def make(n: int) -> Any:
    import torch

    return torch.ones(n, device="cuda")


def total(t: Any) -> float:
    return float(t.sum().item())


class Maker:
    def make(self, n: int) -> Any:
        return make(n)


class Taker:
    def take(self, t: Any) -> float:
        return total(t)


def _ipc_taker(inbox: Any, outbox: Any) -> None:
    """A warm process that takes its own copy of each CUDA tensor it is sent (torch CUDA IPC): the same-host limit."""
    import torch

    torch.cuda.init()
    while (t := inbox.get()) is not None:
        kept = t.clone()
        torch.cuda.synchronize()
        del t, kept
        outbox.put(True)


# ---------------------------------------------------------------- the rows
def limit_rows(nbytes: int, repeats: int, warmup: int) -> list[Row]:
    import torch

    src = torch.ones(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    pinned = torch.empty(nbytes // 4, pin_memory=True)
    pageable = torch.empty(nbytes // 4)
    return [
        _row("device copy", _samples(lambda: _sync(dst.copy_(src)), repeats, warmup)),
        _row("pinned device->host", _samples(lambda: _sync(pinned.copy_(src)), repeats, warmup)),
        _row("pinned host->device", _samples(lambda: _sync(dst.copy_(pinned)), repeats, warmup)),
        _row("pageable device->host", _samples(lambda: _sync(pageable.copy_(src)), repeats, warmup)),
        _row("torch CUDA IPC -> warm process, its copy", _ipc_samples(nbytes, repeats, warmup)),
    ]


def _ipc_samples(nbytes: int, repeats: int, warmup: int) -> list[float] | str:
    """A fresh tensor each time (made before the clock starts), sent by torch.multiprocessing to a process that
    clones it: what the issue calls the machine's own limit for a same-host hop."""
    import torch
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    inbox, outbox = spawn.Queue(), spawn.Queue()
    child = spawn.Process(target=_ipc_taker, args=(inbox, outbox), daemon=True)
    child.start()
    samples: list[float] = []
    try:
        for i in range(warmup + repeats):
            t = _sync(torch.ones(nbytes // 4, device="cuda"))
            start = time.perf_counter()
            inbox.put(t)
            outbox.get(timeout=120)
            if i >= warmup:
                samples.append(time.perf_counter() - start)
            del t
        return samples
    except Exception as exc:
        return _not_measured(exc)
    finally:
        inbox.put(None)
        child.join(30)


def fray_rows(backend: str, nbytes: int, repeats: int, warmup: int) -> list[Row]:
    import torch

    import fray
    from fray import ActorOptions, TaskOptions

    n = nbytes // 4
    ctx = fray.init(SPECS[backend])
    task = TaskOptions(resources=ON_GPU)
    actor = ActorOptions(resources={"GPU": 0.25})
    try:
        t = torch.ones(n, device="cuda")
        maker, taker = ctx.create_actor(Maker, options=actor), ctx.create_actor(Taker, options=actor)

        def task_to_driver() -> object:
            return _sync(ctx.get(ctx.create_task(make, args=(n,), options=task)))

        def driver_to_task() -> object:
            return ctx.get(ctx.create_task(total, args=(t,), options=task))

        rows: list[Row] = [
            _row("put -> get", _samples(lambda: _sync(ctx.get(ctx.put(t))), repeats, warmup)),
            _row("task -> driver", _samples(task_to_driver, repeats, warmup)),
            _row("driver -> task", _samples(driver_to_task, repeats, warmup)),
            _row("actor -> actor", _samples(lambda: ctx.get(taker.take(maker.make(n))), repeats, warmup)),
        ]
        out = torch.empty(n, device="cuda")
        rows.append(_row("put -> get(out=)", _samples(lambda: _sync(ctx.get(ctx.put(t), out=out)), repeats, warmup)))
        paths = {path: stats.count for path, stats in ctx.transfer_stats().items()}
        rows.append((f"(paths: {paths})", "-"))
        return [(f"fray-{backend} {name}", s) for name, s in rows]
    finally:
        fray.shutdown()


def raw_ray_rows(nbytes: int, repeats: int, warmup: int) -> list[Row]:
    import ray
    import torch

    n = nbytes // 4
    ray.init(num_cpus=4, log_to_driver=False)
    try:
        t = torch.ones(n, device="cuda")
        remote_make = ray.remote(num_gpus=0.25)(make)
        remote_total = ray.remote(num_gpus=0.25)(total)
        rows: list[Row] = []
        try:  # first: RDT is the peer the targets name, and raw Ray's object store takes seconds a sample
            rows.append(_row("raw ray RDT cuda_ipc actor -> actor", _rdt_samples(n, repeats, warmup)))
        except Exception as exc:
            rows.append(("raw ray RDT cuda_ipc actor -> actor", _not_measured(exc)))
        rows += [
            _row("raw ray put -> get", _samples(lambda: _sync(ray.get(ray.put(t))), repeats, warmup)),
            _row("raw ray task -> driver", _samples(lambda: _sync(ray.get(remote_make.remote(n))), repeats, warmup)),
            _row("raw ray driver -> task", _samples(lambda: ray.get(remote_total.remote(t)), repeats, warmup)),
        ]
        return rows
    finally:
        ray.shutdown()


def _rdt_samples(n: int, repeats: int, warmup: int) -> list[float] | str:
    import ray

    @ray.remote(num_gpus=0.25, enable_tensor_transport=True)
    class RdtMaker:
        @ray.method(tensor_transport="cuda_ipc")
        def make(self, n: int) -> Any:
            return make(n)

    @ray.remote(num_gpus=0.25)
    class RdtTaker:
        def take(self, t: Any) -> float:
            return total(t)

    maker, taker = RdtMaker.remote(), RdtTaker.remote()  # type: ignore[attr-defined]
    return _samples(lambda: ray.get(taker.take.remote(maker.make.remote(n))), repeats, warmup)


def raw_monarch_rows(nbytes: int, repeats: int, warmup: int) -> list[Row]:
    import torch
    from monarch.actor import Actor, endpoint, this_host

    n = nbytes // 4

    class Endpoints(Actor):
        @endpoint
        def make(self, n: int) -> Any:
            return make(n)

        @endpoint
        def take(self, t: Any) -> float:
            return float(t.sum().item())

        @endpoint
        def buffer(self, n: int) -> Any:
            from monarch.rdma import RDMABuffer

            self.kept = make(n)
            return RDMABuffer(self.kept.view(torch.uint8).flatten())

    procs = this_host().spawn_procs(per_host={"procs": 1})
    actor = procs.spawn("bench_gpu", Endpoints)
    try:
        t = torch.ones(n, device="cuda")
        rows: list[Row] = [
            _row("raw monarch result -> driver", _samples(lambda: actor.make.call_one(n).get(), repeats, warmup)),
            _row("raw monarch argument -> actor", _samples(lambda: actor.take.call_one(t).get(), repeats, warmup)),
        ]
        out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def read() -> None:
            actor.buffer.call_one(n).get().read_into(out).get()
            _sync()

        rows.append(_row("raw monarch RDMABuffer read_into", _samples(read, repeats, warmup)))
        return rows
    finally:
        procs.stop().get()


def run_backend(backend: str, sizes: list[int], repeats: int, warmup: int) -> dict[str, list[Row]]:
    results: dict[str, list[Row]] = {}
    for mib in sizes:
        rows = fray_rows(backend, mib * MiB, repeats, warmup)
        if backend == "ray":
            rows += raw_ray_rows(mib * MiB, repeats, warmup)
        elif backend == "monarch":
            rows += raw_monarch_rows(mib * MiB, repeats, warmup)
        results[str(mib)] = rows
    return results


def print_rows(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    print(f"  {'path':<46} {'p50 ms':>10} {'p90 ms':>10}")
    for name, samples in rows:
        if isinstance(samples, str):
            print(f"  {name:<46} {samples}")
        else:
            p50, p90 = percentile(samples, 50) * 1e3, percentile(samples, 90) * 1e3
            print(f"  {name:<46} {p50:>10.2f} {p90:>10.2f}")


def main() -> int:
    global ROW_SECONDS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=sorted(SPECS), help="which backends (default: all)")
    parser.add_argument("--row-seconds", type=float, default=ROW_SECONDS, help="a row stops sampling after this")
    parser.add_argument("--backend", default=None, help="(internal) measure this one backend in this process")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], help="tensor sizes in MiB")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 3 samples, 1 warm-up (a smoke run)")
    parser.add_argument("--json", default=None, help="(internal) write this backend's rows to this path")
    opts = parser.parse_args()
    if opts.quick:
        opts.sizes, opts.repeats, opts.warmup = [16], 3, 1
    ROW_SECONDS = opts.row_seconds
    try:
        import torch
    except ImportError:
        print("bench_gpu: torch is not installed: nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here (torch.cuda.is_available() is False): nothing to measure")
        return 0
    if opts.backend is not None:
        results = run_backend(opts.backend, opts.sizes, opts.repeats, opts.warmup)
        if opts.json:
            Path(opts.json).write_text(json.dumps(results))
        for mib, rows in results.items():
            print_rows(f"{opts.backend}, {mib} MiB", rows)
        return 0
    print(f"bench_gpu on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    for mib in opts.sizes:
        print_rows(f"device limits, {mib} MiB", limit_rows(mib * MiB, opts.repeats, opts.warmup))
    import fray

    for backend in opts.backends:
        if backend not in fray.available_backends():
            print(f"\n{backend}: not installed")
            continue
        args = [sys.executable, __file__, "--backend", backend, "--sizes", *map(str, opts.sizes)]
        args += ["--repeats", str(opts.repeats), "--warmup", str(opts.warmup), "--row-seconds", str(ROW_SECONDS)]
        sys.stdout.flush()  # the backend's rows stream into this output as they are measured
        proc = subprocess.run(args, stderr=subprocess.PIPE, text=True, timeout=900, env=os.environ, check=False)
        if proc.returncode != 0:
            print(f"\n{backend}: failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return 0


if __name__ == "__main__":
    under_socket_guard()
    sys.exit(main())
