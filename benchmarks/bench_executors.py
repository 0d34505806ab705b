"""ctx.executor(), ctx.map and joblib on fray against the plain ways of doing the same work, same run, interleaved.

    python benchmarks/bench_executors.py [--backend in_memory|ray|monarch] [--quick]

- 10k tiny tasks: `list(executor.map(...))` and `list(ctx.map(...))` (default bound) against `ctx.create_task` for
  each + one `ctx.get` of the list.
- in_memory only: `executor.submit(...).result()` round trip against a ThreadPoolExecutor's; `ctx.map` over
  1,000,000 items with max_in_flight=1000: the driver's RSS growth (peak minus start).
- ray only: joblib `Parallel(n_jobs=-1)` of 1,000 small calls on backend "fray" against Ray's own joblib backend.
p50 and p90 over the rounds; the ratio is fray's p50 over the plain way's p50.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))

from _common import percentile, under_socket_guard

import fray
from fray.context import JobContext


def tiny(x: int) -> int:
    return x + 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def paired(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each fn per round, run one after another in each round (so all see the same machine)."""
    for fn in fns.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def table(title: str, samples: dict[str, list[float]], baseline: str, scale: float, unit: str) -> None:
    print(f"\n{title}")
    print(f"{'':40} {'p50':>10} {'p90':>10} {'p50 ratio':>10}")
    base = percentile(samples[baseline], 50)
    for name, values in samples.items():
        p50, p90 = percentile(values, 50), percentile(values, 90)
        print(f"{name:40} {p50 * scale:>8.1f}{unit} {p90 * scale:>8.1f}{unit} {p50 / base:>9.2f}x")


def tiny_tasks(ctx: JobContext, count: int, rounds: int) -> None:
    executor = ctx.executor()

    def create_and_get() -> None:
        ctx.get([ctx.create_task(tiny, args=(i,)) for i in range(count)])

    def executor_map() -> None:
        list(executor.map(tiny, range(count)))

    def ctx_map() -> None:
        list(ctx.map(tiny, range(count)))

    samples = paired({"create_task + get": create_and_get, "executor.map": executor_map, "ctx.map": ctx_map}, rounds)
    table(f"{count} tiny tasks on {ctx.backend} (ms)", samples, "create_task + get", 1e3, "ms")
    executor.shutdown()


def round_trips(ctx: JobContext, count: int, rounds: int) -> None:
    executor = ctx.executor()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:

        def fray_round_trips() -> None:
            for i in range(count):
                executor.submit(tiny, i).result()

        def pool_round_trips() -> None:
            for i in range(count):
                pool.submit(tiny, i).result()

        samples = paired({"ThreadPoolExecutor": pool_round_trips, "fray executor": fray_round_trips}, rounds)
    table(f"submit + result round trip on {ctx.backend} (us each)", samples, "ThreadPoolExecutor", 1e6 / count, "us")
    executor.shutdown()


def map_memory(ctx: JobContext, items: int, window: int) -> None:
    start = peak = rss_bytes()
    began = time.perf_counter()
    for i, _ in enumerate(ctx.map(tiny, (j for j in range(items)), max_in_flight=window)):
        if i % 10_000 == 0:
            peak = max(peak, rss_bytes())
    seconds = time.perf_counter() - began
    peak = max(peak, rss_bytes())
    print(f"\nctx.map over {items:,} items, max_in_flight={window} on {ctx.backend}")
    growth, base = (peak - start) / 2**20, start / 2**20
    print(f"driver RSS growth {growth:.1f} MiB (start {base:.0f} MiB), {items / seconds:,.0f} items/s")


def joblib_on_ray(calls: int, rounds: int) -> None:
    import joblib
    from ray.util.joblib import register_ray

    import fray.joblib

    fray.joblib.register()
    register_ray()

    def run(backend: str) -> Callable[[], object]:
        def go() -> None:
            with joblib.parallel_config(backend=backend, n_jobs=-1):
                joblib.Parallel()(joblib.delayed(tiny)(i) for i in range(calls))

        return go

    samples = paired({"ray's joblib backend": run("ray"), "fray's joblib backend": run("fray")}, rounds)
    table(f"joblib Parallel(n_jobs=-1) of {calls} small calls on ray (ms)", samples, "ray's joblib backend", 1e3, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="in_memory")
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each row (after one warm-up)")
    args = parser.parse_args()
    if args.backend == "monarch":
        under_socket_guard()
    quick = args.quick
    rounds = 2 if quick else args.rounds
    cpus = os.cpu_count() or 1
    spec = f"in_memory?cpus={cpus}" if args.backend == "in_memory" else args.backend
    ctx = fray.init(spec)
    try:
        tiny_tasks(ctx, 500 if quick else 10_000, rounds)
        if args.backend == "in_memory":
            round_trips(ctx, 200 if quick else 2_000, rounds)
            map_memory(ctx, 20_000 if quick else 1_000_000, 1_000)
        if args.backend == "ray":
            joblib_on_ray(100 if quick else 1_000, rounds)
    finally:
        fray.shutdown()


if __name__ == "__main__":
    main()
