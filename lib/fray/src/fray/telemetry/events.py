"""What happened, per process: a bounded ring of events that `ctx.timeline()` and the live page read.

Every process that runs fray code (the driver, a Ray worker, a Monarch worker) has one `RECORDER`. Recording is
one append of a small tuple to a `collections.deque` with a maximum length (atomic under the GIL, no lock); when
the ring is full the oldest events fall out and are counted as dropped, never kept.
Whether a process records is the choice of its job contexts, each made as it starts (`choose_recording`) and
held until it shuts down: the process records while one of its live contexts chose to. The choice is its
backend's default: on for ray and monarch, whose round trips are long beside what recording costs; off for
in_memory, whose no-op round trip is short enough that three events a task (each a Python call, a tuple and three
ints) take more of it than recording may (docs/timeline.md, "How events are recorded, and what it costs"). The
context's `events` option (`in_memory?events=on`) or `FRAY_EVENTS=1` / `FRAY_EVENTS=0` in the environment (read
when the context starts and, by workers, when they import fray) say otherwise; `ctx.dashboard()` turns it on for
its context. A process with no context records from import.

An event is about one thing, its `key`: a task's or actor call's id (as its backend names it; the submitting
and the running process use the same key, which is how the timeline draws an arrow from submit to start), an
actor's id, a transfer's path, a worker, a job. Times are this process's wall clock in ns (`time.time_ns`); the
timeline aligns several hosts' clocks (fray.telemetry.timeline).

A backend moves other processes' events to the driver as `ProcessEvents`: plain data (JSON-able), so reading
them never unpickles anything.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Any, Final, NamedTuple

from fray.host import settings

__all__ = [
    "RECORDER",
    "Event",
    "Kind",
    "ProcessEvents",
    "Recorder",
    "RecordingChoice",
    "Row",
    "choose_recording",
    "enabled_by_env",
    "ended",
    "events_setting",
]

DEFAULT_CAPACITY = settings.EVENTS_CAPACITY.default  # per process (the memory it takes at most: docs/timeline.md)


class Kind:
    """What an event says happened (its `data`, where it has any, in brackets). Plain str constants, not an
    enum: looking up an enum's member costs a large share of recording an event."""

    TASK_SUBMIT: Final = "task.submit"
    TASK_START: Final = "task.start"
    TASK_END: Final = "task.end"  # (status: ok | error | cancelled; error: the exception type's name)
    ACTOR_CREATE: Final = "actor.create"  # (name: the name it was given, if any)
    CALL_SUBMIT: Final = "call.submit"  # (actor: the actor's key, where the backend knows it here)
    CALL_START: Final = "call.start"  # (concurrency: how many calls it runs at once; actor, if not at submit)
    CALL_END: Final = "call.end"  # as TASK_END
    ACTOR_DIED: Final = "actor.died"  # (reason)
    ACTOR_RESTART: Final = "actor.restart"  # (reason)
    GROUP_RESTART: Final = "group.restart"  # (reason)
    TRANSFER: Final = "transfer"  # name: the path (bytes, seconds); recorded when it ends
    WORKER_START: Final = "worker.start"
    WORKER_DIED: Final = "worker.died"  # (reason, exit_code)
    JOB_STATE: Final = "job.state"  # (state)


# The statuses a TASK_END or CALL_END gives
OK, ERROR, CANCELLED = "ok", "error", "cancelled"


# An event as the ring holds it, in Event's field order: a plain tuple, which the garbage collector stops tracking
# once it holds only plain values (it never stops tracking a NamedTuple's instances, and every full collection
# would walk each one the driver holds). `Event._make(row)` is the named view.
Row = tuple[int, int, str, str | int, str, int, Mapping[str, Any] | None]


class Event(NamedTuple):
    seq: int  # 1, 2, ... in its process: a reader's cursor
    t: int  # time.time_ns() in its process
    kind: str
    key: str | int
    name: str
    thread: int  # threading.get_ident() of the thread that recorded it
    data: Mapping[str, Any] | None


def ended(error: Any, retry: bool = False) -> dict[str, str] | None:
    """The data of a task's or call's end event from its error: None for success (nothing to allocate on the
    common path); cancelled; or the error's type name (a RemoteError's, or the exception's own)."""
    if error is None:
        return None
    name = getattr(error, "type_name", None) or type(error).__name__
    if name.endswith("TaskCancelledError"):
        return {"status": CANCELLED}
    return {"status": "retry" if retry else ERROR, "error": name.rsplit(".", 1)[-1]}


def events_setting() -> bool | None:
    """FRAY_EVENTS as set in the environment: True or False; None where it is not set."""
    return settings.EVENTS.read()


def enabled_by_env() -> bool:
    """Whether a process records before a context chooses: FRAY_EVENTS, on where it is not set (a Ray or Monarch
    worker: they inherit their driver's FRAY_EVENTS, and a Ray worker also follows its driver's choice)."""
    setting = events_setting()
    return True if setting is None else setting


@dataclass
class ProcessEvents:
    """One process's events as it sent them: who it is, its threads' names, the events after a cursor, and how
    many events its ring dropped in all."""

    host: str
    pid: int
    label: str
    threads: dict[int, str]
    events: list[Event]
    dropped: int = 0

    @property
    def process(self) -> str:
        return f"{self.host}/{self.pid}"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "label": self.label,
            "threads": {str(k): v for k, v in self.threads.items()},
            "events": [list(e) for e in self.events],
            "dropped": self.dropped,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessEvents:
        """Reads what `to_json` wrote (after json.loads): plain data only, each field's type checked."""
        try:
            events = [
                Event(int(s), int(t), str(k), key if isinstance(key, int) else str(key), str(n), int(th), _data(d))
                for s, t, k, key, n, th, d in data["events"]
            ]
            return cls(
                str(data["host"]),
                int(data["pid"]),
                str(data["label"]),
                {int(k): str(v) for k, v in dict(data["threads"]).items()},
                events,
                int(data["dropped"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a fray event batch: {exc}") from None


def _data(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError("an event's data must be a dict with str keys")
    return value


class Recorder:
    """This process's ring of events. `record` is the only call on a hot path: it appends a plain tuple (made
    into an `Event` only when read) and looks nothing up (threads are named when read, from threading's table)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, enabled: bool = True) -> None:
        self.label = "driver"
        self._ring: deque[Row] = deque(maxlen=capacity)
        self._reset()
        self.enabled = enabled

    def _reset(self) -> None:
        self._ring.clear()
        self._seq = itertools.count(1)
        self._threads: dict[int, str] = {}  # names given with name_thread, and those of threads seen when read
        self._host = socket.gethostname()
        self._taken = 0  # the seq of the last event `take` handed over
        self._lost_untaken = 0  # events that fell out of the ring before `take` handed them over
        self._take_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._on

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._on = on
        # (a function chosen once: the hot path tests no flag)
        self.record = _appender(self._ring, self._seq) if on else self._skip  # type: ignore[method-assign]

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    @property
    def last_seq(self) -> int:
        """The seq of the newest event recorded (0 if none): a cursor for `since` that skips everything so far."""
        ring = self._ring
        return int(ring[-1][0]) if ring else 0

    def record(self, kind: str, key: str | int, name: str, data: Mapping[str, Any] | None = None) -> None:
        """Records that `kind` happened to `key` (named `name`) now, on this thread."""
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def _skip(self, kind: str, key: str | int, name: str, data: Mapping[str, Any] | None = None) -> None:
        return None

    def record_at(self, t: int, kind: str, key: str | int, name: str, data: Mapping[str, Any] | None = None) -> None:
        """`record` with a time taken earlier (a submit whose key is known only once the backend queued it)."""
        if self._on:
            self._ring.append((next(self._seq), t, kind, key, name, _ident(), data))

    def name_thread(self, name: str) -> None:
        """Names the calling thread's lane in the timeline (an actor's thread: `actor Counter 3`)."""
        self._threads[_ident()] = name

    def since(self, cursor: int = 0) -> ProcessEvents:
        """The events recorded after `cursor` (an event's seq) that the ring still holds, in seq order; `dropped`
        counts every event that fell out of the ring, since it was made. Costs what it returns, not the ring."""
        batch, rows = self.since_rows(cursor)
        batch.events = [Event._make(r) for r in rows]
        return batch

    def since_rows(self, cursor: int = 0) -> tuple[ProcessEvents, list[Row]]:
        """`since`, with the events as plain tuples (`Row`) beside a batch that holds none: what the driver's store
        keeps (no Event made for each, and none for the garbage collector to track)."""
        raw = self._newest(cursor)
        raw.sort(key=_seq_of)  # (two threads may append in the other order than they took their seqs)
        if cursor:
            del raw[: bisect_right(raw, cursor, key=_seq_of)]
        return self._batch(raw), raw

    def _newest(self, cursor: int) -> list[Row]:
        """The ring's newest events, enough to hold every one after `cursor` (a copy made by C code: appends from
        other threads wait for it)."""
        ring = self._ring
        if not cursor or not ring:
            return list(ring)
        want = ring[-1][0] - cursor + _REORDER_MARGIN
        if want >= len(ring):
            return list(ring)
        newest = list(islice(reversed(ring), want))
        newest.reverse()
        return newest

    def _batch(self, raw: list[Row]) -> ProcessEvents:
        """A batch for `raw` that holds no events yet (its caller gives them as Events or keeps the rows)."""
        ring = self._ring
        dropped = max(0, int(ring[-1][0]) - len(ring)) if ring else 0
        unnamed = set(map(_thread_of, raw)) - self._threads.keys()
        if unnamed:
            live = {t.ident: t.name for t in threading.enumerate()}
            for thread in unnamed:
                self._threads[thread] = live.get(thread, f"thread {thread}")
        return ProcessEvents(self._host, os.getpid(), self.label, dict(self._threads), [], dropped)

    def take(self) -> ProcessEvents:
        """The events not taken yet, each taken once (a process that hands its events over by two ways, with its
        reports and when asked, never sends one twice); `dropped`: those that fell out of the ring untaken. An
        event whose seq was taken but which another thread has not appended yet stops the batch there: it and
        those after it come with the next take."""
        with self._take_lock:
            raw = [r for r in self._newest(self._taken) if r[0] > self._taken]
            raw.sort(key=_seq_of)
            expected = self._taken + 1
            if raw and raw[0][0] > expected and len(self._ring) == self._ring.maxlen:  # fell out of a full ring
                expected = raw[0][0]
            complete = 0
            for r in raw:
                if r[0] != expected:
                    break
                expected += 1
                complete += 1
            raw = raw[:complete]
            if raw:
                self._lost_untaken += raw[0][0] - self._taken - 1
                self._taken = int(raw[-1][0])
            batch = self._batch(raw)
            batch.events = [Event._make(r) for r in raw]
            batch.dropped = self._lost_untaken  # (those taken before and dropped since were not lost)
            return batch

    @property
    def untaken(self) -> bool:
        """Events were recorded since the last `take`."""
        return self.last_seq > self._taken

    def after_fork(self) -> None:
        """A forked child starts with an empty ring of its own (its parent's events stay the parent's)."""
        self._reset()
        self.enabled = self._on  # (a fresh seq: `record` holds the one it was made with)


_now = time.time_ns
_ident = threading.get_ident


def _appender(ring: deque[Row], seq: itertools.count[int]) -> Any:
    """`Recorder.record` while recording: a closure over the ring's append and the seq counter, which saves the
    attribute lookups of a method (a noticeable share of an event's cost)."""
    append, next_seq, now, ident = ring.append, seq.__next__, _now, _ident

    def record(kind: str, key: str | int, name: str, data: Mapping[str, Any] | None = None) -> None:
        append((next_seq(), now(), kind, key, name, ident(), data))

    return record


_REORDER_MARGIN = 64  # how far out of seq order appends from several threads can land (a thread switch apart)


_seq_of, _thread_of = itemgetter(0), itemgetter(5)


RECORDER = Recorder(settings.EVENTS_CAPACITY.read(), enabled_by_env())


class RecordingChoice:
    """One job context's choice to record or not, from its start until it shuts down (`release`). This process
    records while one of its live contexts' choices is on, so a context that records nothing never turns off
    another's recording; with no live context, it records as from import (enabled_by_env)."""

    __slots__ = ("_live", "on")

    def __init__(self, on: bool) -> None:
        self.on = on
        self._live = True
        with _choices_lock:
            _choices.add(self)
            _apply_choices()

    def __bool__(self) -> bool:
        return self.on

    def turn_on(self) -> None:
        """The context records from now on (a live page opened)."""
        with _choices_lock:
            self.on = True
            _apply_choices()

    def release(self) -> None:
        """The context shut down (idempotent)."""
        with _choices_lock:
            if self._live:
                self._live = False
                _choices.discard(self)
                _apply_choices()


_choices_lock = threading.Lock()
_choices: set[RecordingChoice] = set()  # the live contexts' choices


def _apply_choices() -> None:
    RECORDER.enabled = any(choice.on for choice in _choices) if _choices else enabled_by_env()


def choose_recording(by_default: bool, option: bool | None = None) -> RecordingChoice:
    """A job context's recording as it starts in this process: its spec's `events` option where given, else
    FRAY_EVENTS where set, else its backend's default; held by the context until it shuts down."""
    setting = events_setting()
    return RecordingChoice(option if option is not None else setting if setting is not None else by_default)


_HOW = "fray.init('in_memory?events=on') or FRAY_EVENTS=1 records from the start"


def record_for_a_page(choice: RecordingChoice | None = None) -> str:
    """Turns recording on as a live page opens (`choice`: its context's, which then records until it shuts
    down), unless FRAY_EVENTS=0 forbids it; what the page says about it ('' where it was on already)."""
    was = RECORDER.enabled
    if not was and events_setting() is False:
        return "No events are recorded (FRAY_EVENTS=0), so this page stays empty."
    if choice is not None:
        choice.turn_on()
    else:
        RECORDER.enabled = True
    if was:
        return ""
    return f"Events are recorded from when this page opened: in_memory records none unless asked ({_HOW})."


def not_recording(what: str) -> str:
    """Why `what` (a timeline written while this process records nothing) holds less than the job did."""
    return f"{what} holds only what was recorded: this process records no events now ({_HOW}; fray.telemetry.events)"


def _forget_choices() -> None:
    """A forked child has no context of its parent's (and no other thread, which may have held the lock)."""
    global _choices_lock, _choices
    _choices_lock, _choices = threading.Lock(), set()


os.register_at_fork(after_in_child=RECORDER.after_fork)
os.register_at_fork(after_in_child=_forget_choices)
