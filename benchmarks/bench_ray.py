"""fray-on-Ray against raw Ray, in the same run, on the same private local cluster.

    python benchmarks/bench_ray.py [--repeats 5] [--quick]
    python benchmarks/bench_ray.py --large [--repeats 7]     # 100 MiB numpy / torch transfers only

Latency cases (round trips, put+get of a fresh object) run raw and fray interleaved one operation at a time and
report the median per-operation time; batch cases (10k tasks, 10k pipelined actor calls) run whole batches back
to back, alternating which goes first, `repeats` times, and report the median. The table shows fray/raw.

--large: 100 MiB numpy and torch values, put -> task (the task returns the shape) and task -> get (the task
returns a value it made on an earlier call, so the time is the transfer), fray and raw Ray interleaved in one
2-CPU cluster while the driver holds a 100 MiB torch tensor and two actors; best and median of `repeats` (7
unless given), with one memcpy of 100 MiB (np.copyto into preallocated memory) timed in the same rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

import fray


def noop() -> None:
    return None


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def cached_value(kind: str, n: int) -> Any:
    """A value of n float64 made once per worker process (on a later call only the transfer is measured)."""
    cache = sys.__dict__.setdefault("_bench_ray_values", {})
    if (kind, n) not in cache:
        import torch

        cache[(kind, n)] = np.ones(n) if kind == "numpy" else torch.ones(n, dtype=torch.float64)
    return cache[(kind, n)]


def timed(fn: Callable[[], Any], ops: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="5 (batch cases) or 7 (--large) unless given")
    parser.add_argument("--quick", action="store_true", help="fewer operations per repeat (a smoke run)")
    parser.add_argument("--num-cpus", type=int, default=4)
    parser.add_argument("--large", action="store_true", help="only the 100 MiB numpy / torch transfer cases")
    parser.add_argument("--object-store-memory", type=int, default=2_000_000_000)
    opts = parser.parse_args()
    if opts.large:
        large_objects(opts.repeats or 7, opts.object_store_memory)
        return
    opts.repeats = opts.repeats or 5
    scale = 10 if opts.quick else 1

    ctx = fray.init(f"ray?num_cpus={opts.num_cpus}&object_store_memory=2000000000&log_to_driver=false")
    raw_noop = ray.remote(noop)
    raw_counter_cls = ray.remote(Counter)
    raw_counter = raw_counter_cls.options(num_cpus=0).remote()
    fray_counter = ctx.create_actor(Counter)
    ray.get(raw_counter.incr.remote())
    ctx.get(fray_counter.incr())

    import torch

    payloads = {
        "numpy 1 MB": np.random.default_rng(0).random(2**17),
        "numpy 100 MB": np.random.default_rng(0).random(100 * 2**17),
        "torch 1 MB": torch.rand(2**18),
        "torch 100 MB": torch.rand(100 * 2**18),
    }

    n_rt, n_many, n_big = 1500 // scale, 10_000 // scale, 15
    # Latency cases: one operation at a time, raw and fray interleaved op by op (alternating which goes first),
    # median of the per-operation times. Batch cases: the whole batch, alternated, median over repeats.
    latency: list[tuple[str, int, Callable[[], Any], Callable[[], Any]]] = [
        ("task round trip", n_rt, lambda: ray.get(raw_noop.remote()), lambda: ctx.get(ctx.create_task(noop))),
        ("actor round trip", n_rt, lambda: ray.get(raw_counter.incr.remote()), lambda: ctx.get(fray_counter.incr())),
    ]
    for label, value in payloads.items():
        n = n_big if "100 MB" in label else 200 // scale
        latency.append(
            (f"put+get {label}", n, lambda v=value: ray.get(ray.put(v)), lambda v=value: ctx.get(ctx.put(v)))
        )
    batch: list[tuple[str, int, Callable[[], Any], Callable[[], Any]]] = [
        (
            f"{n_many} tasks (submit all, get all)",
            n_many,
            lambda: ray.get([raw_noop.remote() for _ in range(n_many)]),
            lambda: ctx.get([ctx.create_task(noop) for _ in range(n_many)]),
        ),
        (
            f"{n_many} pipelined actor calls",
            n_many,
            lambda: ray.get([raw_counter.incr.remote() for _ in range(n_many)]),
            lambda: ctx.get([fray_counter.incr() for _ in range(n_many)]),
        ),
    ]

    # warm up workers and code paths once
    for _, _, raw_fn, fray_fn in latency[:2]:
        for _ in range(50):
            raw_fn()
            fray_fn()

    rows = []
    for label, ops, raw_fn, fray_fn in latency:
        raw_times, fray_times = [], []
        for i in range(ops):
            pair = ((raw_fn, raw_times), (fray_fn, fray_times))
            for fn, times in pair if i % 2 == 0 else pair[::-1]:
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
        _report(rows, label, raw_times, fray_times)
    for label, ops, raw_fn, fray_fn in batch:
        raw_times, fray_times = [], []
        for i in range(opts.repeats):
            pair = ((raw_fn, raw_times), (fray_fn, fray_times))
            for fn, times in pair if i % 2 == 0 else pair[::-1]:
                times.append(timed(fn, ops))
        _report(rows, label, raw_times, fray_times)

    fray.shutdown()
    print(f"\nfray-on-Ray vs raw Ray (Ray {ray.__version__}): median time per operation")
    print(f"(round trips and put+get: per-op medians, interleaved; batches: median of {opts.repeats} runs)\n")
    print(f"| {'case':<36} | {'raw Ray':>12} | {'fray':>12} | {'fray/raw':>8} |")
    print(f"|{'-' * 38}|{'-' * 14}|{'-' * 14}|{'-' * 10}|")
    for label, raw_med, fray_med, ratio in rows:
        print(f"| {label:<36} | {_fmt(raw_med):>12} | {_fmt(fray_med):>12} | {ratio:>8.3f} |")


def large_objects(repeats: int, store_bytes: int, mib: int = 100) -> None:
    """fray vs raw Ray for 100 MiB numpy and torch: put -> task and task -> get, interleaved, best and median."""
    import torch

    n = mib * 2**20 // 8
    ctx = fray.init(f"ray?num_cpus=2&object_store_memory={store_bytes}&log_to_driver=false")
    held = torch.rand(n, dtype=torch.float64)  # what the driver of the 7x report held: a tensor, two actors
    fray_actor, raw_actor = ctx.create_actor(Counter), ray.remote(Counter).options(num_cpus=0).remote()
    ctx.get(fray_actor.incr()), ray.get(raw_actor.incr.remote())
    raw_shape, raw_value = ray.remote(shape_of), ray.remote(cached_value)
    values = {"numpy": np.random.default_rng(0).random(n), "torch": torch.rand(n, dtype=torch.float64)}

    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
    for kind, v in values.items():
        cases.append(
            (
                f"{kind} {mib} MiB put -> task",
                lambda v=v: ray.get(raw_shape.remote(ray.put(v))),
                lambda v=v: ctx.get(ctx.create_task(shape_of, args=(ctx.put(v),))),
            )
        )
        cases.append(
            (
                f"{kind} {mib} MiB task -> get",
                lambda k=kind: ray.get(raw_value.remote(k, n)),
                lambda k=kind: ctx.get(ctx.create_task(cached_value, args=(k, n))),
            )
        )
    src, dst = values["numpy"], np.empty(n)
    copy_times: list[float] = []
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(repeats + 1):  # round 0 warms up (workers, the cached_value caches)
        for label, raw_fn, fray_fn in cases:
            pair = (("raw", raw_fn), ("fray", fray_fn))
            for who, fn in pair if round_ % 2 == 0 else pair[::-1]:
                start = time.perf_counter()
                fn()
                if round_:
                    times.setdefault((label, who), []).append(time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(dst, src)
        if round_:
            copy_times.append(time.perf_counter() - start)
        print(f"  round {round_} done", file=sys.stderr, flush=True)
    stats = ctx.transfer_stats()
    del held
    fray.shutdown()

    print(f"\n{mib} MiB values, fray-on-Ray vs raw Ray {ray.__version__}: one cluster, interleaved, {repeats} rounds\n")
    head = ("case", "raw best", "raw median", "fray best", "fray median", "fray/raw best", "fray/raw median")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for label, _, _ in cases:
        raw_t, fray_t = times[(label, "raw")], times[(label, "fray")]
        rb, rm, fb, fm = min(raw_t), statistics.median(raw_t), min(fray_t), statistics.median(fray_t)
        cells = (label, _fmt(rb), _fmt(rm), _fmt(fb), _fmt(fm), f"{fb / rb:.2f}", f"{fm / rm:.2f}")
        print("| " + " | ".join(cells) + " |")
    best, median = _fmt(min(copy_times)), _fmt(statistics.median(copy_times))
    print(f"| memcpy 100 MiB (np.copyto, preallocated) | {best} | {median} | | | | |")
    print("\nraw samples (ms):", file=sys.stderr)
    for (label, who), t in sorted(times.items()):
        print(f"  {label} {who}: {[round(x * 1e3) for x in t]}", file=sys.stderr)
    for path, ps in stats.items():
        print(f"\nfray transfer_stats[{path!r}]: {ps.count} gets, {ps.bytes / 2**20:.0f} MiB, {ps.seconds:.2f} s")


def _report(rows: list[Any], label: str, raw_times: list[float], fray_times: list[float]) -> None:
    raw_med, fray_med = statistics.median(raw_times), statistics.median(fray_times)
    rows.append((label, raw_med, fray_med, fray_med / raw_med))
    print(f"  {label}: raw {raw_med * 1e3:.3f} ms, fray {fray_med * 1e3:.3f} ms", file=sys.stderr, flush=True)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
