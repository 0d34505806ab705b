"""in_memory vs a raw concurrent.futures.ThreadPoolExecutor, same run, interleaved, medians.

    python benchmarks/bench_in_memory.py

Round trip: submit one tiny task and wait for its result, many times. Throughput: submit 10k tiny tasks, then
gather them all. in_memory is measured with its default (values serialized, as on a cluster) and serialize=false.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))

from _common import paired_medians, report

import fray
from fray.context import JobContext

ROUND_TRIPS = 2_000
TASKS = 10_000


def tiny(x: int) -> int:
    return x + 1


def measure(ctx: JobContext, pool: ThreadPoolExecutor, label: str) -> list[tuple[str, str, float, float]]:
    def fray_round_trips() -> None:
        for i in range(ROUND_TRIPS):
            ctx.get(ctx.create_task(tiny, args=(i,)))

    def raw_round_trips() -> None:
        for i in range(ROUND_TRIPS):
            pool.submit(tiny, i).result()

    def fray_throughput() -> None:
        ctx.get([ctx.create_task(tiny, args=(i,)) for i in range(TASKS)])

    def raw_throughput() -> None:
        futures = [pool.submit(tiny, i) for i in range(TASKS)]
        [f.result() for f in futures]

    fray_rt, raw_rt = (t / ROUND_TRIPS * 1e6 for t in paired_medians(fray_round_trips, raw_round_trips, repeats=9))
    fray_tp, raw_tp = (TASKS / t for t in paired_medians(fray_throughput, raw_throughput, repeats=9))
    return [
        (f"task round trip{label}", "us", fray_rt, raw_rt),
        (f"10k tiny tasks throughput{label}", "/s", fray_tp, raw_tp),
    ]


def main() -> None:
    cpus = os.cpu_count() or 1
    rows = []
    with ThreadPoolExecutor(cpus) as pool:
        for label, spec in (
            ("", f"in_memory?cpus={cpus}"),
            (" (serialize=false)", f"in_memory?cpus={cpus}&serialize=false"),
        ):
            with fray.init(spec) as ctx:
                rows += measure(ctx, pool, label)
    report(f"in_memory vs ThreadPoolExecutor({cpus}): interleaved runs, medians", rows)
    print("targets: round trip fray/raw <= 1.5; throughput fray/raw >= 0.5")


if __name__ == "__main__":
    main()
