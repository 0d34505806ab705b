"""Actor groups and streaming, side by side with the engine used directly, in one run per backend.

    python benchmarks/bench_groups.py                    # every installed backend, one subprocess each
    python benchmarks/bench_groups.py --backend monarch  # one backend

Per backend: a group call to 8 members (`ctx.get(group.echo(i))`) against 8 single-handle calls to the same
members, and against the engine's own way (monarch: one `call` on an 8-actor mesh; ray: 8 `.remote()` calls on
8 raw actors gathered by one `ray.get`); then streaming first-item latency (submit -> first item's value) against
a plain task's round trip. Medians, measured interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import paired_medians, report, under_socket_guard

import fray

CLEANUPS: list[Callable[[], object]] = []  # the engines' own actors, stopped before fray shuts down


class Echo:
    def echo(self, x: int) -> int:
        return x


def ticks(n: int) -> Iterator[int]:
    yield from range(n)


def tiny(x: int) -> int:
    return x


def raw_monarch(members: int) -> Callable[[], object]:
    from monarch.actor import Actor, endpoint, this_host

    class RawEcho(Actor):
        @endpoint
        def echo(self, x: int) -> int:
            return x

    procs = this_host().spawn_procs(per_host={"procs": members})
    mesh = procs.spawn("raw_echo", RawEcho)
    mesh.echo.call(0).get()
    CLEANUPS.append(lambda: procs.stop().get(timeout=30))
    return lambda: list(mesh.echo.call(1).get())


def raw_ray(members: int) -> Callable[[], object]:
    import ray

    actors = [ray.remote(num_cpus=0)(Echo).remote() for _ in range(members)]
    ray.get([a.echo.remote(0) for a in actors])
    CLEANUPS.append(lambda: [ray.kill(a) for a in actors])
    return lambda: ray.get([a.echo.remote(1) for a in actors])


def first_item_seconds(ctx: fray.JobContext, repeats: int) -> tuple[float, float]:
    stream_samples, task_samples = [], []
    options = fray.TaskOptions(streaming=True)
    for _ in range(repeats + 1):
        start = time.perf_counter()
        stream = ctx.create_task(ticks, args=(100,), options=options)
        ctx.get(next(iter(stream)), timeout=60)  # type: ignore[call-overload]
        stream_samples.append(time.perf_counter() - start)
        stream.close()  # type: ignore[attr-defined]
        start = time.perf_counter()
        ctx.get(ctx.create_task(tiny, args=(1,)), timeout=60)
        task_samples.append(time.perf_counter() - start)
    return statistics.median(stream_samples[1:]), statistics.median(task_samples[1:])


def run_one(backend: str, members: int, repeats: int) -> None:
    spec = {"in_memory": "in_memory", "ray": "ray", "monarch": "monarch?procs=2"}[backend]
    ctx = fray.init(spec)
    group = ctx.create_actor_group(Echo, members)
    ctx.get(group.echo(0), timeout=120)
    group_call = lambda: ctx.get(group.echo(1), timeout=60)  # noqa: E731
    handle_calls = lambda: ctx.get([h.echo(1) for h in group.handles], timeout=60)  # noqa: E731
    rows = []
    fray_group, fray_handles = paired_medians(group_call, handle_calls, repeats=repeats)
    rows.append((f"group call x{members} vs {members} handle calls", "us", fray_group * 1e6, fray_handles * 1e6))
    raw = {"monarch": raw_monarch, "ray": raw_ray}.get(backend)
    if raw is not None:
        raw_call = raw(members)
        fray_group, raw_group = paired_medians(group_call, raw_call, repeats=repeats)
        engine = "Monarch mesh call" if backend == "monarch" else "raw Ray actors"
        rows.append((f"group call x{members} vs {engine}", "us", fray_group * 1e6, raw_group * 1e6))
    first, task = first_item_seconds(ctx, repeats)
    rows.append(("stream first item vs plain task round trip", "us", first * 1e6, task * 1e6))
    report(f"{backend}: actor groups and streaming (medians of {repeats})", rows)
    ctx.kill(group)
    for cleanup in CLEANUPS:
        cleanup()
    fray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    if args.backend:
        run_one(args.backend, args.members, args.repeats)
        return
    for backend in fray.available_backends():
        cmd = [sys.executable, __file__, "--backend", backend, "--members", str(args.members)]
        subprocess.run([*cmd, "--repeats", str(args.repeats)], check=False)


if __name__ == "__main__":
    under_socket_guard()
    main()
