"""What recording events costs (fray.telemetry.events): round trips with recording on against off, interleaved, same
run.

    python benchmarks/bench_events.py [--backend ray] [--rounds 12] [--ops 200] [--quick]

FRAY_EVENTS is read when fray is imported, in the driver and in every worker, so on and off are two driver
processes (children of this one, each with its own backend: for ray, its own private Ray instance, whose workers
inherit FRAY_EVENTS), both started first and kept; then `rounds` rounds, each running a block of `ops`
sequential round trips in one child then the other (which goes first alternates), for each case:
- task round trip: ctx.get(ctx.create_task(noop)),
- actor call round trip: ctx.get(actor.ping()) on one actor.
Reported: p50 and p90 of the per-operation times over all steady-state blocks (one warm-up block each first), and
the on/off ratio of each (issue 31's targets: ray and monarch <= 1.03x, in_memory <= 1.05x), and the median over
rounds of the ratio of the two back-to-back blocks' medians. Then the arithmetic: what one event costs to record
(timeit, here) times the events a round trip records, over the off p50. On a small machine an in_memory round trip
(~20 us, two thread hand-offs) varies by more than 10% between identical blocks (--aa shows it); the arithmetic
does not. After each block both drivers pause PAUSE seconds
(untimed), in which the `on` driver reads the events (ctx.events()), as a timeline or a live page would. Each
child also says whether its workers record (a task reads fray.telemetry.events.RECORDER.enabled where it runs). --aa:
both record nothing, which measures the comparison's own noise (two Ray instances are never quite alike).
--toggle: one driver (one Ray instance) with FRAY_EVENTS=1, recording turned off and on at run time
(fray.telemetry.events.RECORDER.enabled) in the driver, the actor and the task workers before each block: no difference
of instance at all; it counts the start events each block brought, to show that the workers did as told.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _common import percentile, under_socket_guard

CASES = ("task round trip", "actor call round trip")
PAUSE = 0.4  # seconds between a driver's blocks
_STARTS = ("task.start", "call.start")


def noop() -> None:
    return None


def worker_records() -> bool:
    from fray.telemetry.events import RECORDER

    return RECORDER.enabled


def set_recording(on: bool, hold: float) -> bool:
    from fray.telemetry.events import RECORDER

    RECORDER.enabled = on
    time.sleep(hold)  # (held, so that the other calls of the batch reach the other workers)
    return RECORDER.enabled


class Pinger:
    def ping(self) -> None:
        return None

    def records(self) -> bool:
        return worker_records()

    def set_recording(self, on: bool) -> bool:
        return set_recording(on, 0.0)


def child(backend: str, pause: float) -> None:
    """One driver: reads `<case index> <ops> [<record: 0 or 1>]` lines, answers each with the per-op seconds and
    the start events read after the block, as JSON. Given `record`, first turns recording on or off here and in
    the workers (--toggle)."""
    import fray
    from fray.telemetry.events import RECORDER

    spec = "ray?num_cpus=2&log_to_driver=false" if backend == "ray" else backend
    ctx = fray.init(spec)
    actor = ctx.create_actor(Pinger)
    hello = {
        "driver": RECORDER.enabled,
        "task worker": ctx.get(ctx.create_task(worker_records), timeout=120),
        "actor": ctx.get(actor.records(), timeout=120),
    }
    print(json.dumps(hello), flush=True)
    cursor = ctx.events().page().cursor if RECORDER.enabled else 0
    for line in sys.stdin:
        case, ops, *record = (int(x) for x in line.split())
        if record:
            on = bool(record[0])
            RECORDER.enabled = on
        if record and backend != "in_memory":  # (in_memory's workers are threads of this process: done)
            assert ctx.get(actor.set_recording(on), timeout=120) == on
            # each task worker in reach (Ray starts at most num_cpus for these): a batch held long enough to
            # spread over all of them
            ctx.get([ctx.create_task(set_recording, (on, 0.05)) for _ in range(8)], timeout=120)
        samples = []
        for _ in range(ops):
            start = time.perf_counter()
            if case == 0:
                ctx.get(ctx.create_task(noop))
            else:
                ctx.get(actor.ping())
            samples.append(time.perf_counter() - start)
        # untimed, and as long for both drivers (an idle pause makes the next block's first calls slower): the
        # recording driver reads the events, as a reader would (waiting up to 0.3 s for the workers' flush)
        rest = time.monotonic() + pause
        starts = 0
        if RECORDER.enabled or record:
            page = ctx.events().page(cursor)
            cursor = page.cursor
            starts = sum(1 for _, _, e in page.events if e.kind in _STARTS and e.name in ("noop", "Pinger.ping"))
        time.sleep(max(0.0, rest - time.monotonic()))
        print(json.dumps({"samples": samples, "starts": starts}), flush=True)
    ctx.shutdown()


class Driver:
    def __init__(self, backend: str, events: bool, pause: float) -> None:
        env = {**os.environ, "FRAY_EVENTS": "1" if events else "0"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--backend", backend, "--pause", str(pause)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.hello: dict[str, Any] = {}

    def ready(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.hello = json.loads(self.proc.stdout.readline())
        return self.hello

    def block(self, case: int, ops: int, record: bool | None = None) -> tuple[list[float], int]:
        """The block's per-op seconds, and how many task or call start events were read after it."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{case} {ops}\n" if record is None else f"{case} {ops} {int(record)}\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return [float(x) for x in reply["samples"]], int(reply["starts"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ray")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ops", type=int, default=200, help="round trips per block")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 20 (a smoke run)")
    parser.add_argument("--pause", type=float, default=PAUSE, help="untimed seconds after each block")
    parser.add_argument("--aa", action="store_true", help="both drivers record nothing (the noise floor)")
    parser.add_argument(
        "--toggle", action="store_true", help="one driver, recording turned on and off in it and its workers"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.backend, opts.pause)
        return
    if opts.quick:
        opts.rounds, opts.ops = 2, 20
    if opts.toggle:
        one = Driver(opts.backend, True, opts.pause)
        drivers = {"off": one, "on": one}
        print(f"one driver, recording toggled: records in {one.ready()}", flush=True)
    else:
        drivers = {"off": Driver(opts.backend, False, opts.pause), "on": Driver(opts.backend, not opts.aa, opts.pause)}
        for label, driver in drivers.items():  # started together, waited for in turn
            print(f"recording {label}: records in {driver.ready()}", flush=True)
    try:
        samples: dict[tuple[str, int], list[float]] = {(label, c): [] for label in drivers for c in range(len(CASES))}
        ratios: dict[int, list[float]] = {c: [] for c in range(len(CASES))}  # per round: on / off block medians
        starts = {"off": 0, "on": 0}  # start events read after the steady-state blocks
        for r in range(opts.rounds + 1):  # round 0: warm-up, not kept
            order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
            for case in range(len(CASES)):
                medians = {}
                for label in order:
                    record = (label == "on") if opts.toggle else None
                    times, seen = drivers[label].block(case, opts.ops, record)
                    medians[label] = statistics.median(times)
                    if r:
                        samples[(label, case)].extend(times)
                        starts[label] += seen
                if r:
                    ratios[case].append(medians["on"] / medians["off"])
    finally:
        for driver in set(drivers.values()):
            driver.close()
    how = "one driver, toggled" if opts.toggle else "two drivers" + (" (A/A: both off)" if opts.aa else "")
    print(f"\nevents on vs off, {opts.backend}, {how}: {opts.rounds} rounds of {opts.ops} round trips, interleaved")
    print("(paired: the median over rounds of on/off of the two blocks' medians, run back to back)")
    ran = opts.rounds * opts.ops * len(CASES)
    print(f"start events read after the blocks: on {starts['on']} of {ran} round trips, off {starts['off']}")
    header = f"{'case':24} {'off p50':>10} {'on p50':>10} {'ratio':>6} {'off p90':>10} {'on p90':>10} {'ratio':>6}"
    print(f"{header} {'paired':>7}")
    for case, name in enumerate(CASES):
        off, on = samples[("off", case)], samples[("on", case)]
        row = [percentile(xs, p) * 1e6 for p in (50, 90) for xs in (off, on)]
        print(
            f"{name:24} {row[0]:>8.1f}us {row[1]:>8.1f}us {row[1] / row[0]:>6.3f}"
            f" {row[2]:>8.1f}us {row[3]:>8.1f}us {row[3] / row[2]:>6.3f} {statistics.median(ratios[case]):>7.3f}"
        )
    cost = event_cost_us()
    print(f"\none event costs {cost:.3f}us to record here (p50 of 20 x 100k, a fresh ring); each round trip records")
    print(f"{EVENTS_PER_ROUND_TRIP} (submit, start, end): the arithmetic overhead, unaffected by scheduling noise:")
    for case, name in enumerate(CASES):
        off_p50 = percentile(samples[("off", case)], 50) * 1e6
        print(f"{name:24} {1 + EVENTS_PER_ROUND_TRIP * cost / off_p50:.3f}x of the off p50 ({off_p50:.1f}us)")


EVENTS_PER_ROUND_TRIP = 3


def event_cost_us() -> float:
    """What one `record` costs in this process, recording into a ring of the default size."""
    import timeit

    from fray.telemetry.events import Kind, Recorder

    record = Recorder().record
    n = 100_000
    empty = min(timeit.repeat(lambda: None, number=n, repeat=5))
    runs = timeit.repeat(lambda: record(Kind.TASK_START, 123456, "noop"), number=n, repeat=20)
    return max(0.0, statistics.median(runs) - empty) / n * 1e6


if __name__ == "__main__":
    under_socket_guard()
    main()
