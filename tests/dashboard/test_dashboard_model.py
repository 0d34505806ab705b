"""The live page's aggregates (fray.dashboard.model) taken one event at a time, as the store hands them over,
including the orders several processes produce (an end read before its submit) and a ring that lost events."""

from __future__ import annotations

from typing import Any

from fray.dashboard.model import SPANS, Aggregates
from fray.telemetry.event_store import ProcessInfo, RowPage
from fray.telemetry.events import Event, Kind

PROCS = [ProcessInfo(0, "host", 1, "driver", {1: "MainThread"}), ProcessInfo(1, "host", 2, "worker", {7: "w"})]


class Feed:
    def __init__(self) -> None:
        self.model = Aggregates()
        self.seq = 0

    def __call__(self, kind: str, key: Any, name: str = "f", data: Any = None, proc: int = 0) -> None:
        self.seq += 1
        thread = 1 if proc == 0 else 7
        event = Event(self.seq, 1_000_000 * self.seq, kind, key, name, thread, data)
        self.model.add(RowPage(self.seq, [proc], [event], self.seq, 0), PROCS)  # as EventStore.rows gives it

    def fn(self, name: str = "f") -> dict[str, int]:
        row = next(f.row() for f in self.model.functions.values() if f.name == name)
        return dict(zip(["queued", "running", "done", "failed", "cancelled", "retries"], row[3:9], strict=True))


def test_a_task_goes_queued_running_done_and_leaves_a_span() -> None:
    feed = Feed()
    feed(Kind.TASK_SUBMIT, 1)
    assert feed.fn() == {"queued": 1, "running": 0, "done": 0, "failed": 0, "cancelled": 0, "retries": 0}
    feed(Kind.TASK_START, 1, proc=1)
    assert feed.fn()["running"] == 1 and feed.fn()["queued"] == 0
    assert feed.model.delta(0)["running"] == [[0, 0, 1000]]  # lane 0 (worker's thread 7), fn 0, from 1 ms (us)
    feed(Kind.TASK_END, 1, proc=1)
    assert feed.fn()["done"] == 1 and feed.fn()["running"] == 0
    state = feed.model.delta(0)
    assert state["spans"] == [(3, 0, 0, 1000, 2000, "ok")]
    assert state["lanes"] == [[0, 1, "7", "w"]]


def test_failures_retries_and_cancels_are_counted_and_errors_logged() -> None:
    feed = Feed()
    feed(Kind.TASK_SUBMIT, 1)
    feed(Kind.TASK_START, 1)
    feed(Kind.TASK_END, 1, data={"status": "retry", "error": "OSError"})
    assert feed.fn()["queued"] == 1 and feed.fn()["retries"] == 1  # back in the queue
    feed(Kind.TASK_START, 1)
    feed(Kind.TASK_END, 1, data={"status": "error", "error": "ValueError"})
    feed(Kind.TASK_SUBMIT, 2)
    feed(Kind.TASK_END, 2, data={"status": "cancelled"})  # cancelled while queued
    assert feed.fn() == {"queued": 0, "running": 0, "done": 0, "failed": 1, "cancelled": 1, "retries": 1}
    errors = feed.model.delta(0)["errors"]
    assert [(e[2], e[4]) for e in errors] == [("f", "OSError"), ("f", "ValueError")]


def test_events_out_of_order_count_once() -> None:
    feed = Feed()
    feed(Kind.TASK_START, 1, proc=1)  # its submit not seen yet (another process's batch came first)
    feed(Kind.TASK_END, 1, proc=1)
    feed(Kind.TASK_SUBMIT, 1)  # late: ignored
    feed(Kind.TASK_END, 2)  # an end whose submit and start fell out of a ring
    assert feed.fn() == {"queued": 0, "running": 0, "done": 2, "failed": 0, "cancelled": 0, "retries": 0}


def test_actors_calls_deaths_and_restarts() -> None:
    feed = Feed()
    feed(Kind.ACTOR_CREATE, "a1", "Counter")
    feed(Kind.CALL_SUBMIT, 5, "Counter.incr")
    feed(Kind.CALL_START, 5, "Counter.incr", {"actor": "a1", "concurrency": 1}, proc=1)
    feed(Kind.CALL_END, 5, "Counter.incr", proc=1)
    feed(Kind.ACTOR_RESTART, "a1", "Counter", {"reason": "its process exited"})
    feed(Kind.ACTOR_DIED, "a1", "Counter", {"reason": "it was killed"})
    assert feed.model.delta(0)["actors"] == [["a1", "Counter", "dead", 1, 1, "it was killed"]]
    assert feed.fn("Counter.incr")["done"] == 1


def test_a_poll_gets_only_what_changed_and_the_stream_stays_bounded() -> None:
    feed = Feed()
    feed(Kind.TASK_SUBMIT, 1, "a")
    feed(Kind.TRANSFER, "shm", "shm", {"bytes": 100, "seconds": 0.5})
    cursor = feed.model.delta(0)["cursor"]
    feed(Kind.TASK_SUBMIT, 2, "b")
    later = feed.model.delta(cursor)
    assert [f[1] for f in later["functions"]] == ["b"] and later["transfers"] == [] and later["processes"] is None
    assert later["totals"]["queued"] == 2 and later["totals"]["bytes"] == 100
    assert feed.model.delta(10**9)["full"]  # a cursor from elsewhere: everything again
    for key in range(10, 10 + SPANS + 50):
        feed(Kind.TASK_START, key, "c")
        feed(Kind.TASK_END, key, "c")
    assert len(feed.model.delta(0)["spans"]) == SPANS
    assert feed.fn("c")["done"] == SPANS + 50
