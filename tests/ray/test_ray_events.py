"""Events on Ray (fray_ray._events): tasks, actor calls, transfers, kills and restarts recorded where they happen,
the workers' brought to the driver through the GCS KV, and `ctx.timeline()` drawing them right after `get`; the
deaths Ray reports (actors', worker processes', SPMD groups' restarts) recorded by the driver
(fray_ray._driver_events), and the engine links (Ray's dashboard: none for fray's private Ray).

One Ray context for the module (the `ctx` fixture); the first test counts spans, so it runs first (as written).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray.exceptions as ray_exceptions

import fray
from fray.errors import ActorDiedError, ActorUnavailableError, WorkerCrashedError
from fray.runtime.gang import group_label
from fray.telemetry import timeline
from fray.telemetry.events import RECORDER, Event, Kind, ProcessEvents
from fray.testing import group_workloads as g
from fray.testing import workloads as h
from fray.types import ActorOptions, TaskOptions
from fray_ray import RayJobContext
from fray_ray._connect import http_link

pytestmark = pytest.mark.skipif(not RECORDER.enabled, reason="recording is off (FRAY_EVENTS=0)")


def echo(x: int) -> int:
    return x


def boom() -> None:
    raise ValueError("planned")


def my_pid() -> int:
    return os.getpid()


def pid_then_exit(path: str) -> None:
    """Writes its process's pid, then ends that process at once (no exception), once the process's flusher has
    sent what it recorded so far (its worker.start: a fresh process's events would go with it)."""
    deadline = time.monotonic() + 20
    while RECORDER.untaken and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(path).write_text(str(os.getpid()))
    os._exit(1)


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

    def pid(self) -> int:
        return os.getpid()

    def exit(self) -> None:
        os._exit(1)


def _trace(ctx: RayJobContext, path: Path) -> tuple[dict[str, Any], timeline.TimelineSummary]:
    summary = ctx.timeline(path)
    return json.loads(path.read_text()), summary


def internal_kv_keys(ctx: RayJobContext) -> list[bytes]:
    """The workers' chunks waiting unread in the GCS KV."""
    from ray.experimental import internal_kv

    return list(internal_kv._internal_kv_list(b"w/", namespace=ctx._events_ns))


def _recorded(
    ctx: RayJobContext, kind: str, key: str, until: int = 1, timeout: float = 30.0
) -> list[tuple[ProcessEvents, Event]]:
    """The events of `kind` about `key` in ctx.events() (with the process that recorded each), asked again until
    `until` of them are in (Ray reports a death, and a worker flushes, a little later on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [(p, e) for p in ctx.events().by_process() for e in p.events if e.kind == kind and e.key == key]
        if len(found) >= until or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


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
    first = events.page()
    read = {(process, e.seq) for _, process, e in first.events}
    # nothing read twice (what comes now is new: the driver may have learnt of an earlier test's actor's end)
    assert not {(process, e.seq) for _, process, e in ctx.events().page(first.cursor).events} & read
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


# ------------------------------------------------------------------------ deaths Ray reports (fray_ray._driver_events)
def test_an_actor_sigkilled_from_outside_shows_its_death_once_with_rays_reason(
    ctx: RayJobContext, tmp_path: Path
) -> None:
    tally = ctx.create_actor(Tally)
    pid = ctx.get(tally.pid(), timeout=120)
    key = tally.payload._actor_id.hex()
    os.kill(pid, signal.SIGKILL)  # no call waits on it: the driver learns of it when it pulls the events
    died = _recorded(ctx, Kind.ACTOR_DIED, key)
    assert len(died) == 1
    process, event = died[0]
    assert process.pid == os.getpid() and event.name == "Tally"  # recorded by the driver
    assert event.data is not None and "worker process has died" in event.data["reason"]
    assert "Some common causes" not in event.data["reason"]  # Ray's words, without its advice
    with pytest.raises(ActorDiedError):  # a call now fails with the death: no second event
        ctx.get(tally.inc(), timeout=120)
    workers = [e for p in ctx.events().by_process() for e in p.events if e.kind == Kind.WORKER_DIED]
    mine = [e.data for e in workers if e.data is not None and e.data.get("pid") == pid]
    assert len(mine) == 1 and mine[0]["reason"]  # the actor's process, keyed as its worker.start
    assert [e.key for e in workers if e.data is mine[0]] == [f"{mine[0]['node']}/{pid}"]
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    assert len([e for e in _instants(trace, "actor.died") if e["args"]["key"] == key]) == 1
    assert [e["args"]["pid"] for e in _instants(trace, "worker.died") if e["args"]["key"].endswith(f"/{pid}")] == [pid]
    assert timeline.validate(trace) == []


def test_an_actor_whose_process_exits_in_a_call_shows_its_death_when_the_call_fails(ctx: RayJobContext) -> None:
    tally = ctx.create_actor(Tally)
    assert ctx.get(tally.inc(), timeout=120) == 1
    with pytest.raises(ActorDiedError):
        ctx.get(tally.exit(), timeout=120)
    key = tally.payload._actor_id.hex()
    # recorded when the get failed (a GCS query then), before any pull
    died = [e for e in RECORDER.since().events if e.kind == Kind.ACTOR_DIED and e.key == key]
    assert len(died) == 1 and died[0].data is not None and "worker process has died" in died[0].data["reason"]
    assert len(_recorded(ctx, Kind.ACTOR_DIED, key, until=2, timeout=1.0)) == 1  # a pull finds it dead: not again


def test_a_restartable_actor_restarts_then_dies_for_good_once(ctx: RayJobContext, tmp_path: Path) -> None:
    actor = ctx.create_actor(Tally, options=ActorOptions(max_restarts=1))
    assert ctx.get(actor.inc(), timeout=120) == 1
    key = actor.payload._actor_id.hex()
    with pytest.raises(ActorUnavailableError):
        ctx.get(actor.exit(), timeout=120)
    assert ctx.get(actor.inc(), timeout=120) == 1  # restarted: its __init__ ran again
    assert len(_recorded(ctx, Kind.ACTOR_RESTART, key)) == 1
    assert _recorded(ctx, Kind.ACTOR_DIED, key, timeout=1.0) == []  # a restart is no death
    with pytest.raises(ActorDiedError):  # no restart left
        ctx.get(actor.exit(), timeout=120)
    died = _recorded(ctx, Kind.ACTOR_DIED, key)
    assert len(died) == 1
    data = died[0][1].data
    assert data is not None and data["restarts"] == 1 and "after 1 restart" in data["reason"]
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    assert [
        len([e for e in _instants(trace, k) if e["args"]["key"] == key]) for k in ("actor.restart", "actor.died")
    ] == [
        1,
        1,
    ]
    assert timeline.validate(trace) == []


def test_a_task_whose_process_exits_shows_the_workers_start_and_death(ctx: RayJobContext, tmp_path: Path) -> None:
    path = tmp_path / "pid"
    with pytest.raises(WorkerCrashedError):
        ctx.get(ctx.create_task(pid_then_exit, (str(path),), options=TaskOptions(max_retries=0)), timeout=120)
    pid = int(path.read_text())
    deadline = time.monotonic() + 30
    while True:
        events = [e for p in ctx.events().by_process() for e in p.events]
        started = [e for e in events if e.kind == Kind.WORKER_START and e.data and e.data["pid"] == pid]
        died = [e for e in events if e.kind == Kind.WORKER_DIED and e.data and e.data["pid"] == pid]
        if (started and died) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(died) == 1 and died[0].data is not None and "Worker exit type" in died[0].data["reason"]
    assert "exit_code" not in died[0].data  # Ray does not report one
    # the same key on both sides: the worker's start (sent before the task ran) and the driver's record of its death
    assert len(started) == 1 and started[0].key == died[0].key == f"{died[0].data['node']}/{pid}"
    trace, _ = _trace(ctx, tmp_path / "timeline.json")
    assert [e["args"]["key"] for e in _instants(trace, "worker.start") if e["args"]["pid"] == pid] == [died[0].key]
    assert timeline.validate(trace) == []


def test_a_crash_found_in_the_worker_table_does_not_end_the_look_for_the_next(
    ctx: RayJobContext, tmp_path: Path
) -> None:
    """The worker table may show a task's crash later than another death no get reported (a restarted actor's
    process): finding that one first must not end the look, or the task's worker.died would never be recorded."""
    actor = ctx.create_actor(Tally, options=ActorOptions(max_restarts=1))
    assert ctx.get(actor.inc(), timeout=120) == 1
    with pytest.raises(ActorUnavailableError):  # its process dies, unrecorded: the actor restarts
        ctx.get(actor.exit(), timeout=120)
    assert ctx.get(actor.inc(), timeout=120) == 1
    # a task's crash whose worker the table does not show yet: the look finds only the restarted actor's process
    ctx._actors.deaths.failed(ray_exceptions.WorkerCrashedError(), [])
    path = tmp_path / "pid"
    task = ctx.create_task(pid_then_exit, (str(path),), options=TaskOptions(max_retries=0))
    ctx.wait([task], timeout=120)  # (no get: nothing tells the watch of this crash but the table)
    pid = int(path.read_text())
    deadline = time.monotonic() + 30
    while True:
        events = [e for p in ctx.events().by_process() for e in p.events]
        died = [e for e in events if e.kind == Kind.WORKER_DIED and e.data and e.data["pid"] == pid]
        if died or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(died) == 1 and died[0].data is not None and "Worker exit type" in died[0].data["reason"]
    ctx.kill(actor)


def test_a_worker_start_is_recorded_in_the_process_that_ran_a_task(ctx: RayJobContext) -> None:
    pid = ctx.get(ctx.create_task(my_pid), timeout=120)
    deadline = time.monotonic() + 30
    while True:
        mine = [p for p in ctx.events().by_process() if p.pid == pid]
        starts = [e for p in mine for e in p.events if e.kind == Kind.WORKER_START]
        if starts or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(starts) == 1
    assert starts[0].data == {"pid": pid, "node": starts[0].key.rsplit("/", 1)[0]}  # type: ignore[union-attr]
    assert starts[0].name == f"ray worker {starts[0].key}"


def test_an_spmd_group_restart_is_recorded_with_its_reason(ctx: RayJobContext, tmp_path: Path) -> None:
    name = f"events-{uuid.uuid4().hex[:8]}"
    options = ActorOptions(max_restarts=1, name=name)
    group = ctx.create_actor_group(g.Member, 2, distributed=True, options=options)
    label = group_label("Member", 2, name)  # the group's key and name in its events, as in its errors
    try:
        assert len(ctx.get(group.whoami(), timeout=180)) == 2
        first = [h.payload._actor_id.hex() for h in group.handles]  # its members' first life
        with pytest.raises((ActorUnavailableError, ActorDiedError)):
            ctx.get(group[1].crash(), timeout=120)
        restarts = _recorded(ctx, Kind.GROUP_RESTART, label)
        assert len(restarts) == 1
        process, event = restarts[0]
        assert process.pid == os.getpid() and event.name == label
        assert event.data is not None and event.data["rank"] == 1 and "died" in event.data["reason"]
        # each first-life member's death, once: rank 1's as Ray reports it, rank 0's as fray stopped it
        deaths = [_recorded(ctx, Kind.ACTOR_DIED, key) for key in first]
        assert [len(d) for d in deaths] == [1, 1]
        reasons = [d[0][1].data["reason"] for d in deaths]  # type: ignore[index]
        assert reasons[0].startswith(f"fray stopped it: its {label} lost rank 1") and "process has died" in reasons[1]
        assert ctx.get(group.whoami(), timeout=180)[1]["rank"] == 1  # back
        trace, _ = _trace(ctx, tmp_path / "timeline.json")
        assert [e["args"]["key"] for e in _instants(trace, "group.restart")][-1:] == [label]
        assert timeline.validate(trace) == []
    finally:
        ctx.kill(group)
    assert [len(_recorded(ctx, Kind.ACTOR_DIED, key, timeout=0)) for key in first] == [1, 1]  # not again at the kill


def test_an_engine_link_is_plain_http_with_no_credentials() -> None:
    assert http_link("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert http_link("https://user:secret@ray.example:443/x?token=abc#f") == "https://ray.example:443/x"
    assert http_link("http://[::1]:8265") == "http://[::1]:8265"
    assert http_link("ray://head:10001") is None and http_link("") is None and http_link(None) is None


def test_fray_s_private_ray_has_no_engine_link(ctx: RayJobContext) -> None:
    """(A cluster with a dashboard: test_ray_lifecycle.py, on its private head.)"""
    assert ctx._engine_links() == {}  # include_dashboard=False: Ray's KV holds no dashboard address
