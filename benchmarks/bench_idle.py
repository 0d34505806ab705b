"""What a context costs while it waits: CPU seconds per second of a warm, idle context holding a few live actors,
fray on each backend beside the engine used directly, in one run.

    python benchmarks/bench_idle.py [--actors 8] [--window 20] [--repeats 3] [--quick]

Each system runs in a process of its own (raw Monarch without any of fray's settings). It starts, makes
`--actors` actors and calls each once, waits a few seconds, then measures `--repeats` windows of `--window`
seconds: the CPU used meanwhile by its driver and every process under it (/proc), divided by the window. A
machine full of such contexts (a notebook left open, a test run's session contexts) pays this all the time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import percentile, run_child, under_socket_guard

SYSTEMS = ("fray-in_memory", "fray-ray", "ray", "fray-monarch", "monarch")
SETTLE = 3.0  # seconds between the actors' first answers and the first window (--quick: 1)
# Monarch's own default supervision poll (hyperactor_mesh), set for the raw run: its process imports nothing of
# fray's, but a value in the environment it inherits would otherwise be used.
MONARCH_DEFAULT_POLL = "10s"


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) so far of this process and every live process under it."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # (ended meanwhile)
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = int(fields[11]) + int(fields[12])
    mine = {os.getpid()}
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in mine} - mine
        grew = bool(below)
        mine |= below
    return sum(used.get(pid, 0) for pid in mine) / ticks


class Waiter:
    def ping(self) -> int:
        return os.getpid()


def fray_actors(backend: str, count: int) -> Callable[[], None]:
    import fray

    spec = {"in_memory": "in_memory", "ray": "ray?log_to_driver=false", "monarch": "monarch?procs=2"}[backend]
    ctx = fray.init(spec)
    actors = [ctx.create_actor(Waiter) for _ in range(count)]
    ctx.get([a.ping() for a in actors], timeout=300)
    return fray.shutdown


def ray_actors(count: int) -> Callable[[], None]:
    import ray

    ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(Waiter)
    actors = [remote.remote() for _ in range(count)]  # type: ignore[attr-defined]
    ray.get([a.ping.remote() for a in actors], timeout=300)
    return ray.shutdown


def monarch_actors(count: int) -> Callable[[], None]:
    from monarch.actor import Actor, endpoint, this_host

    class RawWaiter(Actor):
        @endpoint
        def ping(self) -> int:
            return os.getpid()

    procs = this_host().spawn_procs(per_host={"procs": 2})
    meshes = [procs.spawn(f"waiters{i}", RawWaiter) for i in range(max(1, count // 2))]  # one actor a process each
    for mesh in meshes:
        mesh.ping.call().get()
    return lambda: procs.stop().get()


def measure(system: str, actors: int, window: float, repeats: int, settle: float) -> list[float]:
    """CPU seconds per second of `system` idle, one sample per window."""
    if system == "ray":
        stop = ray_actors(actors)
    elif system == "monarch":
        stop = monarch_actors(actors)
    else:
        stop = fray_actors(system.removeprefix("fray-"), actors)
    try:
        time.sleep(settle)
        samples = []
        for _ in range(repeats):
            cpu, start = tree_cpu_seconds(), time.monotonic()
            time.sleep(window)
            samples.append((tree_cpu_seconds() - cpu) / (time.monotonic() - start))
        return samples
    finally:
        stop()


def run_each(opts: argparse.Namespace, systems: list[str]) -> dict[str, list[float]]:
    """Every system in a fresh process of its own: its samples, by name."""
    results: dict[str, list[float]] = {}
    for system in systems:
        env = dict(os.environ)
        if system == "monarch":
            env["HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"] = MONARCH_DEFAULT_POLL
        argv = [sys.executable, __file__, "--system", system]
        argv += ["--actors", str(opts.actors), "--window", str(opts.window), "--repeats", str(opts.repeats)]
        argv += ["--quick"] if opts.quick else []
        samples = run_child(argv, env)
        if samples is not None:
            results[system] = samples
        else:
            print(f"{system}: failed (see above)", file=sys.stderr)
    return results


def report(opts: argparse.Namespace, results: dict[str, list[float]]) -> None:
    print(f"\nIdle context, {opts.actors} live actors, {opts.repeats} windows of {opts.window:g} s: CPU s per second")
    print(f"{'system':16} {'p50':>8} {'p90':>8} {'fray/raw':>9}  windows")
    for system, samples in results.items():
        raw = results.get(system.removeprefix("fray-")) if system.startswith("fray-") else None
        if raw and percentile(raw, 50) > 0:
            ratio = f"{percentile(samples, 50) / percentile(raw, 50):9.1f}"
        else:  # (no raw peer, or one too idle to measure in this window: a tick is 1 / SC_CLK_TCK s)
            ratio = f"{'' if not raw else 'n/a':>9}"
        shown = " ".join(f"{s:.3f}" for s in samples)
        print(f"{system:16} {percentile(samples, 50):8.3f} {percentile(samples, 90):8.3f} {ratio}  {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=8)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each measured window")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of " + ", ".join(SYSTEMS))
    parser.add_argument("--quick", action="store_true", help="2 actors, one 2 s window (a smoke run)")
    parser.add_argument("--system", default=None, help="(internal) measure this one system here")
    parser.add_argument("--json", default=None, help="(internal) where --system writes its samples")
    opts = parser.parse_args()
    if opts.quick:
        opts.actors, opts.window, opts.repeats = 2, 2.0, 1
    if opts.system:
        Path(opts.json).write_text(
            json.dumps(measure(opts.system, opts.actors, opts.window, opts.repeats, 1.0 if opts.quick else SETTLE))
        )
        return
    chosen = [s for s in opts.systems.split(",") if s]
    unknown = sorted(set(chosen) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {unknown}: choose from {', '.join(SYSTEMS)}")
    import fray

    systems = [s for s in chosen if s.removeprefix("fray-") in fray.available_backends()]
    results = run_each(opts, systems)
    report(opts, results)
    if len(results) < len(systems):
        sys.exit(1)


if __name__ == "__main__":
    under_socket_guard()
    main()
