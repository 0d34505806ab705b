"""fray-on-Monarch against raw Monarch endpoints (and Ray's task throughput, if installed), in one run.

    python benchmarks/bench_monarch.py [--procs 2] [--tasks 10000] [--repeats 5] [--blocks 40] [--calls 100] [--quick]

Prints medians and ratios: actor round trip vs raw `call_one`, 10k tiny tasks per second (fray vs Ray), and the
time from a worker process dying to the caller's WorkerCrashedError.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import under_socket_guard
from monarch.actor import Actor, endpoint, this_host

import fray
from fray import TaskOptions, WorkerCrashedError
from fray_monarch.core import runtime  # noqa: F401 - environment and fault hook


class RawEcho(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


class Echo:
    def echo(self, x: int) -> int:
        return x


def tiny(x: int) -> int:
    return x


def crash() -> None:
    os._exit(1)


def round_trip(call: object, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        call(i)  # type: ignore[operator]
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=100, help="actor calls per block")
    parser.add_argument("--blocks", type=int, default=40, help="blocks of calls, raw and fray alternating")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a few calls and tasks (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.calls, args.tasks, args.repeats = 2, 5, 100, 2

    procs = this_host().spawn_procs(per_host={"procs": 1})
    raw = procs.spawn("raw_echo", RawEcho)
    raw.echo.call_one(0).get()
    ctx = fray.init(f"monarch?procs={args.procs}")
    actor = ctx.create_actor(Echo)
    ctx.get(actor.echo(0))

    raw_rt, fray_rt = [], []
    for _ in range(args.blocks):  # short blocks, interleaved: both see the same machine load as it drifts
        raw_rt.append(round_trip(lambda i: raw.echo.call_one(i).get(), args.calls))
        fray_rt.append(round_trip(lambda i: ctx.get(actor.echo(i)), args.calls))
    raw_med, fray_med = statistics.median(raw_rt), statistics.median(fray_rt)
    ratios = sorted(f / r for f, r in zip(fray_rt, raw_rt, strict=True))  # each block against its neighbour
    print(
        f"actor round trip ({args.blocks} blocks of {args.calls} calls each): raw call_one p50 {raw_med * 1e3:.3f} "
        f"ms, fray p50 {fray_med * 1e3:.3f} ms, ratio of p50s {fray_med / raw_med:.3f}; paired block ratios p50 "
        f"{statistics.median(ratios):.3f} p90 {ratios[int(0.9 * (len(ratios) - 1))]:.3f} (target <= 1.15)"
    )

    rates = []
    for _ in range(max(1, args.repeats // 2)):
        start = time.perf_counter()
        ctx.get([ctx.create_task(tiny, args=(i,)) for i in range(args.tasks)], timeout=600)
        rates.append(args.tasks / (time.perf_counter() - start))
    fray_rate = statistics.median(rates)
    print(f"{args.tasks} tiny tasks: fray-on-monarch {fray_rate:,.0f} tasks/s")

    crash_times = []
    for _ in range(3):
        start = time.perf_counter()
        try:
            ctx.get(ctx.create_task(crash, options=TaskOptions(max_retries=0)), timeout=60)
        except WorkerCrashedError:
            crash_times.append(time.perf_counter() - start)
        ctx.get(ctx.create_task(tiny, args=(0,)), timeout=60)
    print(f"killed worker reported after {statistics.median(crash_times):.3f} s (median of 3; target <= 2 s)")
    fray.shutdown()
    procs.stop().get(timeout=30)

    try:
        import ray
    except ImportError:
        print("ray not installed: no Ray comparison")
        return
    ray.init(num_cpus=args.procs, include_dashboard=False, log_to_driver=False)
    remote_tiny = ray.remote(tiny)
    ray.get([remote_tiny.remote(i) for i in range(200)])
    ray_rates = []
    for _ in range(max(1, args.repeats // 2)):
        start = time.perf_counter()
        ray.get([remote_tiny.remote(i) for i in range(args.tasks)])
        ray_rates.append(args.tasks / (time.perf_counter() - start))
    ray.shutdown()
    ray_rate = statistics.median(ray_rates)
    print(
        f"{args.tasks} tiny tasks: ray {ray_rate:,.0f} tasks/s; fray-on-monarch / ray = {fray_rate / ray_rate:.2f} "
        "(target >= 1)"
    )


if __name__ == "__main__":
    under_socket_guard()
    main()
