"""What the live page shows, kept up to date one event at a time (never by reading the history again).

`Aggregates.add` takes the events of `EventStore.page` in order; `Aggregates.delta(since)` answers a poll with
what changed after the cursor `since` (a global event seq) and the totals. Everything it holds is bounded: one
row per function, actor, transfer path, lane and process; the newest `SPANS` finished spans and `ERRORS` errors;
the work in flight (submitted, not ended) and a bounded memory of recently ended keys, so that an event that
arrives late from another process (a submit read after its end) is not counted as new work.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from fray.dashboard.rows import Actor, Function, Totals, Transfers, Work
from fray.event_store import ProcessInfo
from fray.events import Event, Kind

__all__ = ["Aggregates"]

SPANS = 2000  # finished spans kept for the task stream
ERRORS = 500  # errors kept for the log
RUNNING = 500  # running spans sent with each answer at most
ENDED_MEMORY = 50_000  # ended keys remembered (late submits and starts of those are ignored)

_SUBMIT = {Kind.TASK_SUBMIT: "task", Kind.CALL_SUBMIT: "call"}
_START = {Kind.TASK_START: "task", Kind.CALL_START: "call"}
_END = {Kind.TASK_END: "task", Kind.CALL_END: "call"}


class Aggregates:
    """The page's state. Not thread-safe: the server calls it under its own lock."""

    def __init__(self) -> None:
        self.cursor = 0  # the global seq of the last event taken in
        self.t0_ns = 0  # the first event's time: the page's times are ms after it
        self.functions: dict[tuple[str, str], Function] = {}
        self.actors: dict[str, Actor] = {}
        self.transfers: dict[str, Transfers] = {}
        self.lanes: dict[tuple[int, int | str], int] = {}  # (process index, thread or actor) -> lane id
        self.lane_rows: list[list[Any]] = []  # [id, process index, thread, label, changed]
        self.inflight: dict[tuple[str, str | int], Work] = {}
        self.running: dict[tuple[str, str | int], Work] = {}  # the started part of inflight
        self.ended: OrderedDict[tuple[str, str | int], None] = OrderedDict()
        self.spans: deque[list[Any]] = deque(maxlen=SPANS)  # [seq, lane, fn index, start ms, end ms, status]
        self.errors: deque[list[Any]] = deque(maxlen=ERRORS)  # [seq, t ms, fn name, kind, error, process]
        self.totals = Totals()
        self.process_rows: list[list[Any]] = []
        self.processes_changed = 0

    # ----------------------------------------------------------------- taking events in
    def add(self, events: list[tuple[int, int, Event]], processes: list[ProcessInfo]) -> None:
        for seq, index, event in events:
            if not self.t0_ns:
                self.t0_ns = event.t
            self._take(seq, index, event, processes)
            self.cursor = seq
        self.totals.events += len(events)
        self._processes(processes)

    def _fn(self, kind: str, name: str, seq: int) -> Function:
        found = self.functions.get((kind, name))
        if found is None:
            found = self.functions[(kind, name)] = Function(name, kind, len(self.functions))
        found.changed = seq
        return found

    def _take(self, seq: int, index: int, e: Event, processes: list[ProcessInfo]) -> None:
        kind = e.kind
        family = _SUBMIT.get(kind)  # type: ignore[call-overload]
        if family is not None:
            key = (family, e.key)
            if key not in self.inflight and key not in self.ended:
                work = self.inflight[key] = Work(self._fn(family, e.name, seq))
                work.fn.queued += 1
            return
        family = _START.get(kind)  # type: ignore[call-overload]
        if family is not None:
            self._start(seq, index, e, family, processes)
            return
        family = _END.get(kind)  # type: ignore[call-overload]
        if family is not None:
            self._end(seq, index, e, family, processes)
        elif kind == Kind.TRANSFER:
            self._transfer(seq, e)
        else:
            self._lifecycle(seq, e, processes[index].label if index < len(processes) else "")

    def _start(self, seq: int, index: int, e: Event, family: str, processes: list[ProcessInfo]) -> None:
        key = (family, e.key)
        if key in self.ended:
            return
        work = self.inflight.get(key)
        if work is None:  # its submit was not seen (another process, or before the store's window)
            work = self.inflight[key] = Work(self._fn(family, e.name, seq))
        elif work.lane is not None:  # started twice: a retry whose end was not seen
            work.fn.running -= 1
        else:
            work.fn.queued -= 1
        work.fn.running += 1
        work.fn.changed = seq
        self.running[key] = work
        work.lane = self._lane(seq, index, e, processes)
        work.start_ns = e.t
        if family == "call":
            actor = self._actor((e.data or {}).get("actor"), "", seq)
            if actor is not None:
                actor.calls += 1

    def _end(self, seq: int, index: int, e: Event, family: str, processes: list[ProcessInfo]) -> None:
        key = (family, e.key)
        data = e.data or {}
        status = str(data.get("status", "ok"))
        work = self.inflight.get(key)
        if work is None:
            if key in self.ended:
                return
            work = Work(self._fn(family, e.name, seq))
            work.fn.queued += 1  # as if submitted: taken off below
        fn = work.fn
        fn.changed = seq
        started = work.lane is not None
        self.running.pop(key, None)
        if started:
            fn.running -= 1
            fn.busy_ns += max(0, e.t - work.start_ns)
        else:
            fn.queued -= 1
        if status == "retry":  # it runs again: back in the queue
            fn.retries += 1
            fn.queued += 1
            self.inflight[key] = Work(fn)
        else:
            self.inflight.pop(key, None)
            self.ended[key] = None
            if len(self.ended) > ENDED_MEMORY:
                self.ended.popitem(last=False)
            if status == "ok":
                fn.done += 1
            elif status == "cancelled":
                fn.cancelled += 1
            else:
                fn.failed += 1
        if status not in ("ok", "cancelled"):
            label = processes[index].label if index < len(processes) else ""
            self.errors.append([seq, self._ms(e.t), fn.name, family, str(data.get("error", status)), label])
            self.totals.errors += 1
        lane = work.lane if started else self._lane(seq, index, e, processes)
        begin = work.start_ns if started else e.t
        self.spans.append([seq, lane, fn.index, self._ms(begin), self._ms(e.t), status])

    def _transfer(self, seq: int, e: Event) -> None:
        data = e.data or {}
        row = self.transfers.get(e.name)
        if row is None:
            row = self.transfers[e.name] = Transfers(e.name)
        nbytes = int(data.get("bytes", 0))
        row.count += 1
        row.nbytes += nbytes
        row.seconds += float(data.get("seconds", 0.0))
        row.changed = seq
        self.totals.bytes += nbytes
        self.totals.transfers += 1

    def _lifecycle(self, seq: int, e: Event, process: str) -> None:
        data = e.data or {}
        reason = str(data.get("reason", "")) if data.get("reason") is not None else ""
        if e.kind == Kind.ACTOR_CREATE:
            self._actor(e.key, e.name, seq)
        elif e.kind == Kind.ACTOR_DIED:
            actor = self._actor(e.key, e.name, seq)
            if actor is not None and actor.state != "dead":
                actor.state, actor.reason = "dead", reason
                self.totals.deaths += 1
        elif e.kind == Kind.ACTOR_RESTART:
            actor = self._actor(e.key, e.name, seq)
            if actor is not None:
                actor.state, actor.restarts, actor.reason = "alive", actor.restarts + 1, reason
                self.totals.restarts += 1
        else:  # group restarts, workers' starts and deaths, job states: counted, and deaths logged
            self.totals.extra[e.kind] = self.totals.extra.get(e.kind, 0) + 1
            if e.kind in (Kind.WORKER_DIED, Kind.GROUP_RESTART):
                what = str(data.get("reason") or data.get("exit_code") or e.kind)
                self.errors.append([seq, self._ms(e.t), e.name, e.kind, what, process])
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

    def _lane(self, seq: int, index: int, e: Event, processes: list[ProcessInfo]) -> int:
        where = (index, e.thread)
        lane = self.lanes.get(where)
        if lane is None:
            lane = self.lanes[where] = len(self.lane_rows)
            self.lane_rows.append([lane, index, str(e.thread), "", seq])
        row = self.lane_rows[lane]
        threads = processes[index].threads if index < len(processes) else {}
        label = threads.get(e.thread) or f"thread {e.thread}"
        if row[3] != label:
            row[3], row[4] = label, seq
        return lane

    def _processes(self, processes: list[ProcessInfo]) -> None:
        rows = [[p.index, p.host, p.pid, p.label, len(p.threads), p.dropped] for p in processes]
        if rows != self.process_rows:
            self.process_rows, self.processes_changed = rows, self.cursor

    def _ms(self, t_ns: int) -> float:
        return round((t_ns - self.t0_ns) / 1e6, 3)

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
            "spans": _newer(self.spans, since),
            "errors": _newer(self.errors, since),
            "running": self._running(),
        }

    def _running(self) -> list[list[Any]]:
        out: list[list[Any]] = []
        for work in self.running.values():
            if work.lane is not None:
                out.append([work.lane, work.fn.index, self._ms(work.start_ns)])
                if len(out) >= RUNNING:
                    break
        return out


def _newer(rows: deque[list[Any]], since: int) -> list[list[Any]]:
    """The rows (oldest first) whose seq is after `since`: read from the newest end, stopping at the first old."""
    out = []
    for row in reversed(rows):
        if row[0] <= since:
            break
        out.append(row)
    out.reverse()
    return out
