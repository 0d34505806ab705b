"""fray.telemetry.events (the per-process ring), fray.telemetry.event_store (the driver's merged view) and
fray.telemetry.timeline (the trace and its validator), without a backend: bounds, drops, cursors, plain-data batches,
clock alignment, and each problem the validator must catch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fray.errors import FrayError
from fray.telemetry import timeline
from fray.telemetry.event_store import EventStore
from fray.telemetry.events import Event, Kind, ProcessEvents, Recorder


def test_the_ring_is_bounded_and_counts_what_it_dropped() -> None:
    recorder = Recorder(capacity=1000)
    for i in range(300_000):
        recorder.record(Kind.TASK_SUBMIT, i, "f")
    batch = recorder.since(0)
    assert len(batch.events) == 1000 and batch.dropped == 299_000
    assert [e.key for e in batch.events[:2]] == [299_000, 299_001]
    assert recorder.since(batch.events[-1].seq).events == []
    assert [e.key for e in recorder.since(batch.events[-3].seq).events] == [299_998, 299_999]


def test_take_hands_each_event_over_once_and_waits_for_one_not_appended_yet() -> None:
    recorder = Recorder(capacity=100)
    for i in range(3):
        recorder.record(Kind.TASK_START, i, "f")
    assert [e.seq for e in recorder.take().events] == [1, 2, 3]
    assert recorder.take().events == [] and not recorder.untaken
    late = next(recorder._seq)  # a thread took seq 4, and is switched out before its append
    recorder.record(Kind.TASK_START, 5, "f")
    assert recorder.take().events == [] and recorder.untaken  # 5 waits for 4
    recorder._ring.append((late, 0, Kind.TASK_START, 4, "f", 1, None))
    assert [e.seq for e in recorder.take().events] == [4, 5]
    for i in range(300):  # a full ring: what fell out is not waited for
        recorder.record(Kind.TASK_START, i, "f")
    taken = recorder.take()
    assert (
        len(taken.events) == 100 and taken.events[0].seq == 206 and taken.dropped == 200
    )  # (the 5 taken were not lost)


def test_a_disabled_recorder_records_nothing() -> None:
    recorder = Recorder(capacity=1000, enabled=False)
    recorder.record(Kind.TASK_SUBMIT, 1, "f")
    recorder.record_at(5, Kind.TASK_SUBMIT, 1, "f")
    assert recorder.since(0).events == [] and not recorder.enabled
    recorder.enabled = True
    recorder.record(Kind.TASK_SUBMIT, 1, "f")
    assert len(recorder.since(0).events) == 1


def test_fray_events_0_turns_recording_off_in_a_new_process() -> None:
    code = "from fray.telemetry.events import RECORDER; print(RECORDER.enabled)"
    env = {**os.environ, "FRAY_EVENTS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_threads_are_named_in_the_batch() -> None:
    recorder = Recorder(capacity=10)
    recorder.name_thread("actor Counter")
    recorder.record(Kind.CALL_START, "c1", "Counter.incr", {"actor": "a1", "concurrency": 1})
    batch = recorder.since(0)
    assert batch.threads[batch.events[0].thread] == "actor Counter"


def test_a_batch_travels_as_plain_data_and_garbage_is_refused() -> None:
    recorder = Recorder(capacity=10)
    recorder.record(Kind.TASK_END, "t1", "f", {"status": "error", "error": "ValueError"})
    batch = recorder.since(0)
    back = ProcessEvents.from_json(json.loads(json.dumps(batch.to_json())))
    assert back.events == batch.events and back.threads == batch.threads and back.pid == batch.pid
    with pytest.raises(ValueError, match="not a fray event batch"):
        ProcessEvents.from_json({"host": "h"})
    bad = batch.to_json()
    bad["events"][0][6] = ["not", "a", "dict"]
    with pytest.raises(ValueError, match="not a fray event batch"):
        ProcessEvents.from_json(bad)


def _batch(host: str, pid: int, events: list[tuple[int, str, Any, str, dict[str, Any] | None]]) -> ProcessEvents:
    """A process's batch from (t in ns, kind, key, name, data), all on thread 1."""
    made = [Event(i + 1, t, kind, key, name, 1, data) for i, (t, kind, key, name, data) in enumerate(events)]
    return ProcessEvents(host, pid, "worker", {1: "main"}, made)


def test_the_store_pages_from_a_cursor_and_reports_what_it_lost() -> None:
    pending = [_batch("h", 1, [(i, Kind.TASK_SUBMIT, i, "f", None) for i in range(10)])]

    def pull() -> list[ProcessEvents]:
        out = list(pending)
        pending.clear()
        return out

    store = EventStore(pull, Recorder(capacity=10), capacity=6)
    store.refresh()
    page = store.page(0)
    assert [e.key for _, _, e in page.events] == [4, 5, 6, 7, 8, 9] and page.dropped == 4
    first = store.page(page.cursor - 3, limit=2)
    assert [e.key for _, _, e in first.events] == [7, 8] and first.dropped == 0
    assert store.page(page.cursor).events == [] and store.dropped == 4
    assert "h" in [p.host for p in store.processes]


def test_a_late_clock_is_moved_so_no_task_starts_before_its_submit(tmp_path: Path) -> None:
    second = 1_000_000_000
    driver = _batch("a", 1, [(10 * second, Kind.TASK_SUBMIT, "t1", "f", None)])
    # the worker's clock is 5 s behind: it "starts" the task 4.9 s before it was submitted
    worker = _batch(
        "b", 2, [(5 * second + 10**8, Kind.TASK_START, "t1", "f", None), (6 * second, Kind.TASK_END, "t1", "f", None)]
    )
    summary = timeline.write(tmp_path / "t.json", [driver, worker])
    trace = json.loads((tmp_path / "t.json").read_text())
    assert timeline.validate(trace, tasks=1) == [] and summary.tasks == 1
    span = next(e for e in trace["traceEvents"] if e["ph"] == "X")
    assert span["dur"] == pytest.approx(0.9e6)  # durations are the worker's own


def test_a_timeline_file_is_private_and_never_written_through_anything_planted(tmp_path: Path) -> None:
    driver = _batch("a", 1, [(10, Kind.TASK_SUBMIT, "t1", "f", None)])
    fresh = tmp_path / "fresh.json"
    timeline.write(fresh, [driver])
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    loose = tmp_path / "loose.json"
    loose.write_text("x" * 100_000)
    loose.chmod(0o644)
    timeline.write(loose, [driver])
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600 and json.loads(loose.read_text())["traceEvents"]
    link = tmp_path / "link.json"
    link.symlink_to(fresh)
    with pytest.raises(FrayError, match="symlink"):
        timeline.write(link, [driver])
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(FrayError, match="not a regular file"):  # (and no wait for a reader to open it)
        timeline.write(fifo, [driver])


@pytest.mark.skipif(os.getuid() != 0, reason="making a file that belongs to another user takes root")
def test_a_timeline_is_never_written_into_another_users_file(tmp_path: Path) -> None:
    planted = tmp_path / "planted.json"  # made first for us to fill, by a user who can read it
    planted.write_text("")
    os.chown(planted, 65534, 65534)
    with pytest.raises(FrayError, match="belongs to user 65534"):
        timeline.write(planted, [_batch("a", 1, [(10, Kind.TASK_SUBMIT, "t1", "f", None)])])
    assert planted.read_text() == ""


def _trace(*events: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": list(events)}


def _span(ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "actor call", "name": "A.m", "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def test_the_validator_names_each_problem() -> None:
    assert timeline.validate({"x": 1}) == ["not a Chrome trace: no traceEvents list"]
    assert "pid and tid must be integers" in timeline.validate(_trace({**_span(0, 1), "pid": "p"}))[0]
    assert "unknown phase" in timeline.validate(_trace({"ph": "Q", "pid": 1, "tid": 1, "ts": 0}))[0]
    assert "duration" in timeline.validate(_trace(_span(0, -1)))[0]
    unclosed = _trace({"ph": "s", "id": 7, "pid": 1, "tid": 1, "ts": 0, "name": "f"})
    assert timeline.validate(unclosed) == ["flow 7 does not close (has only ['s'])"]
    early = _trace(
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 5, "name": "f"},
        {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 2, "name": "f", "bp": "e"},
    )
    assert "ends before it starts" in timeline.validate(early)[0]
    overlapping = _trace(_span(0, 10, concurrency=1), _span(5, 10, concurrency=1))
    assert "starts before" in timeline.validate(overlapping)[0]
    assert timeline.validate(_trace(_span(0, 10, concurrency=2), _span(5, 10, concurrency=2))) == []
    assert timeline.validate(_trace(_span(0, 10)), calls=2) == ["1 actor call spans, expected 2"]
    moved = _trace(
        {"ph": "X", "cat": "transfer", "name": "shm", "pid": 1, "tid": 1, "ts": 0, "dur": 1, "args": {"bytes": 5}}
    )
    assert timeline.validate(moved, transfers={"shm": 5}) == []
    assert timeline.validate(moved, transfers={"shm": 6}) == ["transfers by shm: 5 bytes drawn, 6 moved"]


def test_a_10k_task_timeline_stays_under_3_mb(tmp_path: Path) -> None:
    events = []
    for i in range(10_000):
        t = i * 50_000
        events += [
            (t, Kind.TASK_SUBMIT, i, "module.work", None),
            (t + 10_000, Kind.TASK_START, i, "module.work", None),
            (t + 40_000, Kind.TASK_END, i, "module.work", None),
        ]
    summary = timeline.write(tmp_path / "t.json", [_batch("h", 1, events)])
    assert summary.tasks == 10_000
    assert (tmp_path / "t.json").stat().st_size < 3_000_000
    assert timeline.validate(json.loads((tmp_path / "t.json").read_text()), tasks=10_000) == []


def test_the_store_counts_only_the_drops_of_its_own_context() -> None:
    recorder = Recorder(capacity=1000)
    for i in range(5000):  # an earlier context's events, long dropped
        recorder.record(Kind.TASK_SUBMIT, i, "f")
    store = EventStore(list, recorder)
    for i in range(1500):  # 500 of these fall out before the store reads them
        recorder.record(Kind.TASK_SUBMIT, i, "g")
    assert len(store.page(0).events) == 0
    store.refresh()
    assert store.dropped == 500 and len(store.page(0).events) == 1000
    recorder.record(Kind.TASK_SUBMIT, 1, "g")
    store.refresh()
    assert store.dropped == 500 and len(store.page(0).events) == 1001


def test_in_memory_records_the_processes_it_starts_for_tasks_as_workers() -> None:
    """A runtime_env task runs in a child process: its start and its death (exit code) are worker events."""
    import fray
    from fray import RuntimeEnv, TaskOptions, WorkerCrashedError
    from fray.testing import workloads as h

    options = TaskOptions(runtime_env=RuntimeEnv(env={"FRAY_TEST_X": "1"}), max_retries=0)
    with fray.init("in_memory?events=on") as ctx:
        cursor = ctx.events().page().cursor
        with pytest.raises(WorkerCrashedError, match="code 1"):
            ctx.get(ctx.create_task(h.crash, options=options), timeout=60)
        events = [e for _, _, e in ctx.events().page(cursor).events]
    started = [e for e in events if e.kind == Kind.WORKER_START]
    died = [e for e in events if e.kind == Kind.WORKER_DIED]
    assert len(started) == 1 and started[0].data == {"pid": started[0].key}
    assert len(died) == 1 and died[0].key == started[0].key
    assert died[0].data is not None and died[0].data["exit_code"] == 1 and "code 1" in died[0].data["reason"]
