"""fray-on-Ray against raw Ray, in the same run, on the same private local cluster.

    python benchmarks/bench_ray.py [--repeats 5] [--quick]

Each case runs raw and fray back to back (alternating which goes first, to share any drift), `repeats` times; the table shows the median
time per operation of each and the ratio fray/raw. Put/get cases put a fresh object and get it back.
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
    parser.add_argument("--repeats", type=int, default=7)
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

    n_rt, n_many, n_actor, n_big = 300 // scale, 10_000 // scale, 1000 // scale, 5
    cases: list[tuple[str, int, Callable[[], Any], Callable[[], Any]]] = [
        (
            "task round trip",
            n_rt,
            lambda: [ray.get(raw_noop.remote()) for _ in range(n_rt)],
            lambda: [ctx.get(ctx.create_task(noop)) for _ in range(n_rt)],
        ),
        (
            f"{n_many} tasks (submit all, get all)",
            n_many,
            lambda: ray.get([raw_noop.remote() for _ in range(n_many)]),
            lambda: ctx.get([ctx.create_task(noop) for _ in range(n_many)]),
        ),
        (
            "actor round trip",
            n_actor,
            lambda: [ray.get(raw_counter.incr.remote()) for _ in range(n_actor)],
            lambda: [ctx.get(fray_counter.incr()) for _ in range(n_actor)],
        ),
        (
            f"{n_many} pipelined actor calls",
            n_many,
            lambda: ray.get([raw_counter.incr.remote() for _ in range(n_many)]),
            lambda: ctx.get([fray_counter.incr() for _ in range(n_many)]),
        ),
    ]
    for label, value in payloads.items():
        n = n_big if "100 MB" in label else 50 // (scale if scale > 1 else 1)
        cases.append(
            (
                f"put+get {label}",
                n,
                lambda v=value, n=n: [ray.get(ray.put(v)) for _ in range(n)],
                lambda v=value, n=n: [ctx.get(ctx.put(v)) for _ in range(n)],
            )
        )

    # warm up workers and code paths once
    for _, _, raw_fn, fray_fn in cases[:2]:
        raw_fn()
        fray_fn()

    rows = []
    for label, ops, raw_fn, fray_fn in cases:
        raw_times, fray_times = [], []
        for i in range(opts.repeats):
            if i % 2:  # alternate which goes first, so neither always inherits the other's leftovers
                fray_times.append(timed(fray_fn, ops))
                raw_times.append(timed(raw_fn, ops))
            else:
                raw_times.append(timed(raw_fn, ops))
                fray_times.append(timed(fray_fn, ops))
        raw_med, fray_med = statistics.median(raw_times), statistics.median(fray_times)
        rows.append((label, raw_med, fray_med, fray_med / raw_med))
        print(f"  {label}: raw {raw_med * 1e3:.3f} ms, fray {fray_med * 1e3:.3f} ms", file=sys.stderr, flush=True)

    fray.shutdown()
    print(f"\nfray-on-Ray vs raw Ray (Ray {ray.__version__}), median of {opts.repeats} repeats, time per operation\n")
    print(f"| {'case':<36} | {'raw Ray':>12} | {'fray':>12} | {'fray/raw':>8} |")
    print(f"|{'-' * 38}|{'-' * 14}|{'-' * 14}|{'-' * 10}|")
    for label, raw_med, fray_med, ratio in rows:
        print(f"| {label:<36} | {_fmt(raw_med):>12} | {_fmt(fray_med):>12} | {ratio:>8.3f} |")


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
