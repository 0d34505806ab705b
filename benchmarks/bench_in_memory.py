"""in_memory vs a raw concurrent.futures.ThreadPoolExecutor, same run, medians.

    python benchmarks/bench_in_memory.py

Round trip: submit one tiny task and wait for its result, many times. Throughput: submit 10k tiny tasks, then
gather them all. in_memory is measured with its default (values serialized, as on a cluster) and serialize=false.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))

from _common import median_seconds, report  # noqa: E402

import fray  # noqa: E402

ROUND_TRIPS = 2_000
TASKS = 10_000


def tiny(x: int) -> int:
    return x + 1


def main() -> None:
    cpus = os.cpu_count() or 1
    pool = ThreadPoolExecutor(cpus)
    rows = []
    for label, spec in (("", f"in_memory?cpus={cpus}"), (" (serialize=false)", f"in_memory?cpus={cpus}&serialize=false")):
        ctx = fray.init(spec)

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

        fray_rt = median_seconds(fray_round_trips) / ROUND_TRIPS * 1e6
        raw_rt = median_seconds(raw_round_trips) / ROUND_TRIPS * 1e6
        fray_tp = TASKS / median_seconds(fray_throughput, repeats=5)
        raw_tp = TASKS / median_seconds(raw_throughput, repeats=5)
        rows += [
            (f"task round trip{label}", "us", fray_rt, raw_rt),
            (f"10k tiny tasks throughput{label}", "/s", fray_tp, raw_tp),
        ]
        fray.shutdown()
    pool.shutdown()
    report(f"in_memory vs ThreadPoolExecutor({cpus}) - medians", rows)
    print("targets: round trip fray/raw <= 1.5; throughput fray/raw >= 0.5")


if __name__ == "__main__":
    main()
