"""What the live page shows, kept up to date one event at a time (never by reading the history again).

`Aggregates.add` takes the events of `EventStore.rows` in order; `Aggregates.delta(since)` answers a poll with
what changed after the cursor `since` (a global event seq) and the totals. Everything it holds is bounded: one
row per function, actor, transfer path, lane and process; the newest `SPANS` finished spans and `ERRORS` errors;
the work in flight (submitted, not ended) and a bounded memory of recently ended keys, so that an event that
arrives late from another process (a submit read after its end) is not counted as new work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import count
from typing import Any

from fray.dashboard.rows import Actor, Function, Totals, Transfers
from fray.telemetry.event_store import ProcessInfo, RowPage
from fray.telemetry.events import Kind

__all__ = ["Aggregates"]

SPANS = 2000  # finished spans kept for the task stream
ERRORS = 500  # errors kept for the log
RUNNING = 500  # running spans sent with each answer at most
ENDED_MEMORY = 50_000  # ended keys remembered (late submits and starts of those are ignored)

_TASK_SUBMIT, _CALL_SUBMIT = Kind.TASK_SUBMIT, Kind.CALL_SUBMIT
_TASK_START, _CALL_START = Kind.TASK_START, Kind.CALL_START
_TASK_END, _CALL_END = Kind.TASK_END, Kind.CALL_END
_TRANSFER = Kind.TRANSFER
_SUBMITTED, _STARTED, _ENDED = "submitted", "started", "ended"  # what an event does to its work (`add`)

Key = str | int  # an event's key
Data = Mapping[str, Any] | None  # an event's data


class Family:
    """The work of one family ("task" or "call") in flight: its functions by name; key -> [Function, lane (-1
    while queued), start ns] of what was submitted and has not ended; running: the started part of it; ended:
    recently ended keys (a late submit or start of one is ignored)."""

    __slots__ = ("ended", "functions", "inflight", "name", "running")

    def __init__(self, name: str) -> None:
        self.name = name
        self.functions: dict[str, Function] = {}
        self.inflight: dict[Key, list[Any]] = {}
        self.running: dict[Key, list[Any]] = {}
        self.ended: dict[Key, None] = {}

    def finish(self, key: Key) -> None:
        self.inflight.pop(key, None)
        ended = self.ended
        ended[key] = None
        if len(ended) > 2 * ENDED_MEMORY:  # keep the newest half: amortized O(1) an end
            self.ended = dict.fromkeys(list(ended)[-ENDED_MEMORY:])


class Aggregates:
    """The page's state. Not thread-safe: the server calls it under its own lock."""

    def __init__(self) -> None:
        self.cursor = 0  # the global seq of the last event taken in
        self.t0_ns = 0  # the first event's time: the page's times are us after it
        self.functions: dict[tuple[str, str], Function] = {}
        self.actors: dict[str, Actor] = {}
        self.transfers: dict[str, Transfers] = {}
        self.lanes: dict[tuple[int, int | str], int] = {}  # (process index, thread or actor) -> lane id
        self.lane_rows: list[list[Any]] = []  # [id, process index, thread, label, changed]
        self.tasks, self.calls = Family("task"), Family("call")
        # (tuples of plain values: kept, they cost the garbage collector nothing)
        # (seq, lane, fn index, start ns, end ns, status): made us after t0 only when sent (`delta`)
        self.spans: deque[tuple[Any, ...]] = deque(maxlen=SPANS)
        self.errors: deque[tuple[Any, ...]] = deque(maxlen=ERRORS)  # (seq, t us, fn name, kind, error, process)
        self.totals = Totals()
        self.process_rows: list[list[Any]] = []
        self._procs: list[ProcessInfo] = []
        self.processes_changed = 0

    # ----------------------------------------------------------------- taking events in
    def add(self, page: RowPage, processes: list[ProcessInfo]) -> None:
        """Takes in events as the store keeps them (`EventStore.rows`, in its order). A task's three events are
        handled in this loop, not by a method each (a call with eight arguments would be a large share of their
        cost): an event costs little, so a poll's work follows the job's rate."""
        rows = page.rows
        if not rows:
            self._processes(processes)
            return
        if not self.t0_ns:
            self.t0_ns = rows[0][1]
        self._procs = processes
        tasks, calls = self.tasks, self.calls
        steps = {
            _TASK_SUBMIT: (tasks, _SUBMITTED),
            _CALL_SUBMIT: (calls, _SUBMITTED),
            _TASK_START: (tasks, _STARTED),
            _CALL_START: (calls, _STARTED),
            _TASK_END: (tasks, _ENDED),
            _CALL_END: (calls, _ENDED),
        }
        lanes, spans = self.lanes, self.spans
        for seq, index, (_, t, kind, key, name, thread, data) in zip(count(page.first), page.sources, rows):
            step = steps.get(kind)
            if step is None:
                if kind == _TRANSFER:
                    self._transfer(seq, name, data)
                else:
                    label = processes[index].label if index < len(processes) else ""
                    self._lifecycle(seq, t, kind, key, name, data, label)
                continue
            family, what = step
            work = family.inflight.get(key)
            if what is _SUBMITTED:
                if work is None and key not in family.ended:
                    fn = self._fn(family, name, seq)
                    fn.queued += 1
                    family.inflight[key] = [fn, -1, 0]
                    if data and family is calls:  # (a backend names a call's actor where it submits or starts)
                        self._actor_called(data, seq)
                continue
            if work is None:  # its submit was not seen (another process, or before the store's window)
                if key in family.ended:
                    continue
                fn = self._fn(family, name, seq)
                fn.queued += 1  # as if submitted: taken off below
                work = family.inflight[key] = [fn, -1, 0]
            else:
                fn = work[0]
                fn.changed = seq
            lane: int = work[1]
            if what is _STARTED:
                if lane >= 0:  # started twice: a retry whose end was not seen
                    fn.running -= 1
                else:
                    fn.queued -= 1
                fn.running += 1
                lane = lanes.get((index, thread), -1)
                work[1] = lane if lane >= 0 else self._lane(seq, index, thread)
                work[2] = t
                family.running[key] = work
                if data and family is calls:
                    self._actor_called(data, seq)
                continue
            if lane >= 0:  # an end
                del family.running[key]
                fn.running -= 1
                begin = work[2]
                if t > begin:
                    fn.busy_ns += t - begin
            else:
                fn.queued -= 1
                lane, begin = self._lane(seq, index, thread), t
            status = str(data.get("status", "ok")) if data else "ok"
            if status == "ok":
                fn.done += 1
                family.finish(key)
            else:
                self._not_ok(family, fn, key, status, seq, index, t, data)
            spans.append((seq, lane, fn.index, begin, t, status))
        self.cursor = page.first + len(rows) - 1
        self.totals.events += len(rows)
        self._processes(processes)

    def _fn(self, family: Family, name: str, seq: int) -> Function:
        found = family.functions.get(name)
        if found is None:
            found = family.functions[name] = Function(name, family.name, len(self.functions))
            self.functions[(family.name, name)] = found
        found.changed = seq
        return found

    def _actor_called(self, data: Mapping[str, Any], seq: int) -> None:
        actor = self._actor(data.get("actor"), "", seq)
        if actor is not None:
            actor.calls += 1

    def _not_ok(
        self, family: Family, fn: Function, key: Key, status: str, seq: int, index: int, t: int, data: Data
    ) -> None:
        """The end of a run that did not succeed: retried (queued again), cancelled, or failed (logged)."""
        if status == "retry":
            fn.retries += 1
            fn.queued += 1
            family.inflight[key] = [fn, -1, 0]
        elif status == "cancelled":
            fn.cancelled += 1
            family.finish(key)
        else:
            fn.failed += 1
            family.finish(key)
        if status != "cancelled":
            label = self._procs[index].label if index < len(self._procs) else ""
            error = str(data.get("error", status)) if data else status
            self.errors.append((seq, self._us(t), fn.name, family.name, error, label))
            self.totals.errors += 1

    def _transfer(self, seq: int, path: str, data: Data) -> None:
        data = data or {}
        row = self.transfers.get(path)
        if row is None:
            row = self.transfers[path] = Transfers(path)
        nbytes = int(data.get("bytes", 0))
        row.count += 1
        row.nbytes += nbytes
        row.seconds += float(data.get("seconds", 0.0))
        row.changed = seq
        self.totals.bytes += nbytes
        self.totals.transfers += 1

    def _lifecycle(self, seq: int, t: int, kind: str, key: Key, name: str, data: Data, process: str) -> None:
        data = data or {}
        reason = str(data.get("reason", "")) if data.get("reason") is not None else ""
        if kind == Kind.ACTOR_CREATE:
            self._actor(key, name, seq)
        elif kind == Kind.ACTOR_DIED:
            actor = self._actor(key, name, seq)
            if actor is not None and actor.state != "dead":
                actor.state, actor.reason = "dead", reason
                self.totals.deaths += 1
        elif kind == Kind.ACTOR_RESTART:
            actor = self._actor(key, name, seq)
            if actor is not None:
                actor.state, actor.restarts, actor.reason = "alive", actor.restarts + 1, reason
                self.totals.restarts += 1
        else:  # group restarts, workers' starts and deaths, job states: counted, and deaths logged
            self.totals.extra[kind] = self.totals.extra.get(kind, 0) + 1
            if kind in (Kind.WORKER_DIED, Kind.GROUP_RESTART):
                what = str(data.get("reason") or data.get("exit_code") or kind)
                self.errors.append((seq, self._us(t), name, kind, what, process))
                self.totals.errors += 1

    def _actor(self, key: object, name: str, seq: int) -> Actor | None:
        if key is None:
            return None
        actor = self.actors.get(str(key))
        if actor is None:
            actor = self.actors[str(key)] = Actor(str(key), name)
        elif name and not actor.name:
            actor.name = name
        actor.changed = seq
        return actor

    def _lane(self, seq: int, index: int, thread: int) -> int:
        """The lane of a process's thread (made on first use; labelled from the process's thread names)."""
        where = (index, thread)
        lane = self.lanes.get(where)
        if lane is None:
            lane = self.lanes[where] = len(self.lane_rows)
            self.lane_rows.append([lane, index, str(thread), self._label(index, thread), seq])
        return lane

    def _label(self, index: int, thread: int) -> str:
        threads = self._procs[index].threads if index < len(self._procs) else {}
        return threads.get(thread) or f"thread {thread}"

    def _processes(self, processes: list[ProcessInfo]) -> None:
        """Notes the processes (and their threads' names) when they changed: a few rows, once a poll."""
        self._procs = processes
        rows = [[p.index, p.host, p.pid, p.label, len(p.threads), p.dropped] for p in processes]
        if rows != self.process_rows:
            self.process_rows, self.processes_changed = rows, self.cursor
            for row in self.lane_rows:
                label = self._label(row[1], int(row[2]))
                if row[3] != label:
                    row[3], row[4] = label, self.cursor

    def _us(self, t_ns: int) -> int:
        return (t_ns - self.t0_ns) // 1000

    # ----------------------------------------------------------------- answering a poll
    def delta(self, since: int) -> dict[str, Any]:
        """What changed after `since` (0: everything kept), and the totals. Rows are lists (see the page's
        app.js for their fields): a poll's answer stays small."""
        if since > self.cursor:  # a cursor from another server: start over
            since = 0
        queued = running = done = failed = 0
        for fn in self.functions.values():
            queued += fn.queued
            running += fn.running
            done += fn.done
            failed += fn.failed
        alive = sum(1 for a in self.actors.values() if a.state == "alive")
        totals = self.totals
        return {
            "cursor": self.cursor,
            "full": since == 0,
            "t0": self.t0_ns / 1e6,
            "totals": {
                "queued": queued,
                "running": running,
                "done": done,
                "failed": failed,
                "actors": len(self.actors),
                "alive": alive,
                "deaths": totals.deaths,
                "restarts": totals.restarts,
                "bytes": totals.bytes,
                "transfers": totals.transfers,
                "errors": totals.errors,
                "events": totals.events,
                "lost": totals.lost,
                **totals.extra,
            },
            "functions": [f.row() for f in self.functions.values() if f.changed > since],
            "actors": [a.row() for a in self.actors.values() if a.changed > since],
            "transfers": [t.row() for t in self.transfers.values() if t.changed > since],
            "lanes": [row[:4] for row in self.lane_rows if row[4] > since],
            "processes": self.process_rows if self.processes_changed > since or since == 0 else None,
            "spans": [(*row[:3], self._us(row[3]), self._us(row[4]), row[5]) for row in _newer(self.spans, since)],
            "errors": _newer(self.errors, since),
            "running": self._running(),
        }

    def _running(self) -> list[list[Any]]:
        out: list[list[Any]] = []
        for family in (self.tasks, self.calls):
            for fn, lane, start_ns in family.running.values():
                out.append([lane, fn.index, self._us(start_ns)])
                if len(out) >= RUNNING:
                    return out
        return out


def _newer(rows: deque[tuple[Any, ...]], since: int) -> list[tuple[Any, ...]]:
    """The rows (oldest first) whose seq is after `since`: read from the newest end, stopping at the first old."""
    out = []
    for row in reversed(rows):
        if row[0] <= since:
            break
        out.append(row)
    out.reverse()
    return out
