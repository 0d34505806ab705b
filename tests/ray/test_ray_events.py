"""Events on Ray (fray_ray._events): tasks, actor calls, transfers, kills and restarts recorded where they happen,
the workers' brought to the driver through the GCS KV, and `ctx.timeline()` drawing them right after `get`.

One Ray context for the module (the `ctx` fixture); the first test counts spans, so it runs first (as written).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fray
from fray import timeline
from fray.errors import ActorUnavailableError
from fray.events import RECORDER
from fray.testing import workloads as h
from fray.types import ActorOptions, TaskOptions
from fray_ray import RayJobContext

pytestmark = pytest.mark.skipif(not RECORDER.enabled, reason="recording is off (FRAY_EVENTS=0)")


def echo(x: int) -> int:
    return x


def boom() -> None:
    raise ValueError("planned")


def nested() -> int:
    ctx = fray.get_job_context()
    return int(ctx.get(ctx.create_task(echo, (7,)), timeout=120))


def count_to(n: int) -> Any:
    yield from range(n)


class Tally:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> int:
        self.n += 1
        return self.n

    def count(self, n: int) -> Any:
        yield from range(n)


def _trace(ctx: RayJobContext, path: Path) -> tuple[dict[str, Any], timeline.TimelineSummary]:
    summary = ctx.timeline(path)
    return json.loads(path.read_text()), summary


def internal_kv_keys(ctx: RayJobContext) -> list[bytes]:
    """The workers' chunks waiting unread in the GCS KV."""
    from ray.experimental import internal_kv

    return list(internal_kv._internal_kv_list(b"w/", namespace=ctx._events_ns))


def _instants(trace: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"].startswith(kind + " ")]


def test_the_workload_timeline_validates_right_after_get(ctx: RayJobContext, tmp_path: Path) -> None:
    _, before = _trace(ctx, tmp_path / "before.json")
    assert ctx.get([ctx.create_task(echo, (i,)) for i in range(20)], timeout=120) == list(range(20))
    tally = ctx.create_actor(Tally)
    assert ctx.get([tally.inc() for _ in range(5)], timeout=120) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="planned"):
        ctx.get(ctx.create_task(boom), timeout=120)
    value = np.ones(2**20, dtype=np.uint8)
    assert ctx.get(ctx.put(value), timeout=120).nbytes == 2**20
    moved = {path: stats.bytes for path, stats in ctx.transfer_stats().items()}
    assert moved.get("ray-object-store", 0) >= 2**20

    trace, summary = _trace(ctx, tmp_path / "timeline.json")  # at once: the workers' last events are in
    tasks, calls = before.tasks + 21, before.calls + 5
    assert timeline.validate(trace, tasks=tasks, calls=calls, transfers=moved) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    failed = [e for e in spans if e["cat"] == "task" and e["name"] == "boom"]
    assert [(e["args"]["status"], e["args"]["error"]) for e in failed] == [("error", "ValueError")]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert "actor Tally" in names  # the actor's lane
    assert any(n.startswith("ray actor Tally ") for n in names) and any(n.startswith("ray worker ") for n in names)
    tally_calls = [e for e in spans if e["cat"] == "actor call" and e["name"] == "Tally.inc"]
    assert {e["args"]["actor"] for e in tally_calls} == {tally.payload._actor_id.hex()}
    assert {e["args"]["concurrency"] for e in tally_calls} == {1}
    # every span but the driver's transfers has its submit-to-start arrow
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == tasks + calls
    assert summary.dropped == 0


def test_a_generator_task_and_call_are_spans(ctx: RayJobContext, tmp_path: Path) -> None:
    _, before = _trace(ctx, tmp_path / "before.json")
    stream = ctx.create_task(count_to, (3,), options=TaskOptions(streaming=True))
    assert [ctx.get(ref, timeout=120) for ref in stream] == [0, 1, 2]
    tally = ctx.create_actor(Tally)
    assert [ctx.get(ref, timeout=120) for ref in tally.count.stream(2)] == [0, 1]
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    assert timeline.validate(trace, tasks=before.tasks + 1, calls=before.calls + 1) == []
    flows = {e["name"] for e in trace["traceEvents"] if e["ph"] == "f"}
    assert {"count_to", "Tally.count"} <= flows  # submit-to-start arrows: the keys agree


def test_nested_work_is_drawn_from_the_worker_that_submitted_it(ctx: RayJobContext, tmp_path: Path) -> None:
    _, before = _trace(ctx, tmp_path / "before.json")
    assert ctx.get(ctx.create_task(nested), timeout=120) == 7
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    assert timeline.validate(trace, tasks=before.tasks + 2) == []
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    arrows = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s" and e["name"] == "echo"}
    # the arrow to the inner task starts in the worker that ran `nested`
    assert any(processes[e["pid"]].startswith("ray worker ") for e in arrows.values())


def test_a_killed_actor_shows_its_death_with_the_reason(ctx: RayJobContext, tmp_path: Path) -> None:
    tally = ctx.create_actor(Tally)
    assert ctx.get(tally.inc(), timeout=120) == 1
    ctx.kill(tally)
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    died = [e for e in _instants(trace, "actor.died") if e["args"]["key"] == tally.payload._actor_id.hex()]
    assert len(died) == 1
    assert died[0]["name"] == "actor.died Tally" and "killed" in died[0]["args"]["reason"]
    assert timeline.validate(trace) == []


def test_a_restarted_actor_shows_its_restart(ctx: RayJobContext, tmp_path: Path) -> None:
    actor = ctx.create_actor(h.Counter, args=(100,), options=ActorOptions(max_restarts=1))
    assert ctx.get(actor.incr(), timeout=120) == 101
    with pytest.raises(ActorUnavailableError):
        ctx.get(actor.crash(), timeout=120)
    assert ctx.get(actor.incr(), timeout=120) == 101  # its __init__ ran again
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    key = actor.payload._actor_id.hex()
    restarts = [e for e in _instants(trace, "actor.restart") if e["args"]["key"] == key]
    assert len(restarts) == 1 and restarts[0]["args"]["restarts"] == 1
    assert "restart" in restarts[0]["args"]["reason"]
    assert timeline.validate(trace) == []


def test_the_workers_chunks_are_read_once_and_removed(ctx: RayJobContext) -> None:
    assert ctx.get(ctx.create_task(echo, (1,)), timeout=120) == 1
    events = ctx.events()
    assert internal_kv_keys(ctx) == []
    seen = events.page().cursor
    assert ctx.events().page(seen).events == []  # nothing read twice
    assert os.getpid() in {p.pid for p in events.processes}


def flood() -> tuple[int, int, int]:
    """Records more events than the ring holds plus what a worker may leave unread (fray_ray._events.WINDOW)."""
    from fray_ray import _events

    n = 2 * RECORDER.capacity + _events.WINDOW * _events.CHUNK_EVENTS
    first = RECORDER.last_seq + 1
    for i in range(n):
        RECORDER.record("test.flood", i, "flood")
    return os.getpid(), first, RECORDER.last_seq


def test_a_flooded_worker_reports_what_it_dropped_and_sends_the_rest(ctx: RayJobContext) -> None:
    """Bounded: the worker stops at WINDOW unread chunks, its ring drops the oldest; every event is either
    received once or counted as dropped, and the rest arrive as the driver reads (the worker tries again)."""
    pid, first, last = ctx.get(ctx.create_task(flood), timeout=120)
    deadline = time.monotonic() + 60
    while True:
        events = ctx.events()
        info = next(p for p in events.processes if p.pid == pid)
        received = [e.seq for _, i, e in events.page().events if i == info.index and first <= e.seq <= last]
        if len(received) + info.dropped >= last - first + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(received) == len(set(received))  # none twice
    assert info.dropped > 0
    assert len(received) + info.dropped == last - first + 1
    assert internal_kv_keys(ctx) == []
