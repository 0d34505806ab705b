"""fray-on-Ray against raw Ray, in the same run, on the same private local cluster.

    python benchmarks/bench_ray.py [--repeats 5] [--quick]

Latency cases (round trips, put+get of a fresh object) run raw and fray interleaved one operation at a time and
report the median per-operation time; batch cases (10k tasks, 10k pipelined actor calls) run whole batches back
to back, alternating which goes first, `repeats` times, and report the median. The table shows fray/raw.
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


def timed(fn: Callable[[], Any], ops: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer operations per repeat (a smoke run)")
    parser.add_argument("--num-cpus", type=int, default=4)
    opts = parser.parse_args()
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


def _report(rows: list[Any], label: str, raw_times: list[float], fray_times: list[float]) -> None:
    raw_med, fray_med = statistics.median(raw_times), statistics.median(fray_times)
    rows.append((label, raw_med, fray_med, fray_med / raw_med))
    print(f"  {label}: raw {raw_med * 1e3:.3f} ms, fray {fray_med * 1e3:.3f} ms", file=sys.stderr, flush=True)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
