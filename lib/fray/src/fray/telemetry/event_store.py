"""The driver's view of a job's events: its own process's (fray.telemetry.events.RECORDER) and those its backend brings
from the other processes (`JobContext._pull_events`), merged into one bounded sequence that readers page through
with a cursor (the live page asks only for what is new: nothing is rescanned).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import cast

from fray.telemetry.events import RECORDER, Event, ProcessEvents, Recorder, Row

__all__ = ["EventPage", "EventStore", "ProcessInfo", "RowPage"]

DEFAULT_CAPACITY = 500_000


@dataclass
class ProcessInfo:
    """A process that sent events: where it runs, what it is, its threads' names and how many events it lost."""

    index: int  # its place in EventStore.processes
    host: str
    pid: int
    label: str
    threads: dict[int, str] = field(default_factory=dict)
    dropped: int = 0  # fell out of that process's own ring before the driver read them


@dataclass
class EventPage:
    """Events after a cursor: (global seq, process index, event), the cursor to ask from next time, and how many
    events were lost before anyone read them (in the processes' rings or in this store)."""

    events: list[tuple[int, int, Event]]
    cursor: int
    dropped: int


@dataclass
class RowPage:
    """`EventPage` as the store keeps it (what the live page reads): the events as plain tuples
    (fray.telemetry.events.Row), the global seq of the first, each one's process index, the cursor to ask from next
    time, and the lost."""

    first: int
    sources: list[int]
    rows: list[Row]
    cursor: int
    lost: int


class EventStore:
    """Merges the events of every process of one job context. Thread-safe."""

    def __init__(
        self,
        pull: Callable[[], list[ProcessEvents]],
        recorder: Recorder = RECORDER,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self._pull = pull
        self._recorder = recorder
        # Only what happened since the context began: in_memory contexts of one process share its recorder
        self._local_cursor = recorder.last_seq
        self._local_dropped = 0
        # Worker processes can outlive a context and serve the next one (a Ray connection kept by the process):
        # what they recorded on this host before this context began is not this context's
        self._began_ns = time.time_ns()
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        # The events, and beside each its process's index: two deques of one length, so that keeping an event
        # allocates nothing (its global seq is its place: the first held is _next - len)
        self._events: deque[Row] = deque(maxlen=capacity)
        self._sources: deque[int] = deque(maxlen=capacity)
        self._next = 1
        self._overflow = 0
        self.processes: list[ProcessInfo] = []
        self._by_process: dict[str, ProcessInfo] = {}

    def refresh(self) -> None:
        """Reads what is new: whatever the backend brings from the other processes, then this process's ring (last:
        with what the backend recorded here while it pulled, a death it learnt of from its engine, say)."""
        remote = self._pull()
        local, rows = self._recorder.since_rows(self._local_cursor)
        with self._lock:
            # this process's ring is shared by every context of the process since it started: of its drops, only
            # those after this context's cursor are this context's
            lost = rows[0][0] - self._local_cursor - 1 if rows else 0
            self._local_dropped += max(0, lost)
            local.dropped = self._local_dropped
            if rows:
                self._local_cursor = rows[-1][0]
            self._add(local, rows)
            for batch in remote:
                if batch.host == self._host and batch.events and batch.events[0].t < self._began_ns:
                    batch.events = [e for e in batch.events if e.t >= self._began_ns]
                # kept as plain tuples: the garbage collector tracks an Event for as long as it lives
                self._add(batch, cast(list[Row], list(map(tuple, batch.events))))

    def _add(self, batch: ProcessEvents, rows: Sequence[Row]) -> None:  # holds the lock
        info = self._by_process.get(batch.process)
        if info is None:
            info = ProcessInfo(len(self.processes), batch.host, batch.pid, batch.label)
            self.processes.append(info)
            self._by_process[batch.process] = info
        info.threads.update(batch.threads)
        info.label = batch.label
        info.dropped = max(info.dropped, batch.dropped)
        events = self._events
        self._overflow += max(0, len(events) + len(rows) - (events.maxlen or 0))  # what the extend pushes out
        events.extend(rows)
        self._sources.extend(repeat(info.index, len(rows)))
        self._next += len(rows)

    @property
    def dropped(self) -> int:
        """Events lost in all: fallen out of a process's ring before the driver read it, or out of this store."""
        with self._lock:
            return self._overflow + sum(p.dropped for p in self.processes)

    def page(self, cursor: int = 0, limit: int | None = None) -> EventPage:
        """The events after `cursor` that the store still holds (at most `limit`, oldest first)."""
        page = self.rows(cursor, limit)
        events = [
            (page.first + i, source, Event._make(row))
            for i, (source, row) in enumerate(zip(page.sources, page.rows, strict=True))
        ]
        return EventPage(events, page.cursor, page.lost)

    def rows(self, cursor: int = 0, limit: int | None = None) -> RowPage:
        """`page` as the store keeps it."""
        with self._lock:
            held = len(self._events)
            first = self._next - held  # the global seq of the oldest event held
            lost = max(0, first - cursor - 1)
            start = max(0, cursor + 1 - first)
            count = max(0, (held if limit is None else min(held, start + limit)) - start)
            if not count:
                return RowPage(self._next, [], [], max(cursor, self._next - 1), lost)
            # from the end: a poll asks for the newest few of many (a deque is slow to index in the middle)
            skip = held - start - count
            rows = list(islice(reversed(self._events), skip, skip + count))[::-1]
            sources = list(islice(reversed(self._sources), skip, skip + count))[::-1]
            return RowPage(first + start, sources, rows, first + start + count - 1, lost)

    def by_process(self) -> list[ProcessEvents]:
        """Everything the store holds, as one batch per process (what a timeline is drawn from)."""
        with self._lock:
            out = [ProcessEvents(p.host, p.pid, p.label, dict(p.threads), [], p.dropped) for p in self.processes]
            for source, row in zip(self._sources, self._events, strict=True):
                out[source].events.append(Event._make(row))
        return out
