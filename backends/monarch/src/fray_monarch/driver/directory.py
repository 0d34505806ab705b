"""The object directory of one context: id -> state (pending, a value's locator, or an error), in the driver.

Values do not live here: a large one stays in the shared-memory store of the process that made it (see
data/store.py), and the directory keeps only its `Stored` locator; small ones are `Inline`. An entry is dropped a
grace period after nothing refers to it any more (refs in the driver, holds of worker processes, values that
contain it), and then its owner frees the memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fray.backend import Outcome, wait_for, when
from fray.errors import FrayError, ObjectLostError
from fray_monarch.core import runtime
from fray_monarch.core.objects import RefPayload, Tracker
from fray_monarch.core.protocol import Stored, Value

# An unreferenced object is dropped this long after its last reference goes. What keeps a ref in flight alive is
# ordering and keeps (see .agents/monarch-backend.md), not this delay; a worker delays only the release of a ref
# that left it in an actor's reply (worker_runtime.RELEASE_DELAY). 0: the free runs on the loop thread as soon as it
# can (never in the finalizer that dropped the count). Any delay keeps the values a loop has dropped alive while
# it puts new ones, so the store grows by fresh chunks whose page zeroing and faults cost more than the puts; with
# none, the previous value's memory is free before the next put but one.
FREE_GRACE = 0.0


@dataclass(slots=True)
class Entry:
    """One object: its outcome (pending, then a value's locator or an error) and what keeps it alive. `future` is
    an actor call's reply not read yet; `watch(entry)` makes it complete the entry by itself (called once,
    when somebody first waits on it: most replies are read directly, see ActorRegistry.resolve)."""

    id: str
    outcome: Outcome = field(default_factory=Outcome)
    future: Any = None
    actor: Any = None
    actor_restarts: int = 0  # how many times the actor had restarted when this call was sent
    keep: list[Any] = field(default_factory=list)  # payloads this object or its pending call keeps alive
    remote: dict[str, int] = field(default_factory=dict)  # proc key -> holds
    watch: Callable[[Entry], None] | None = None
    free_armed: bool = False

    @property
    def value(self) -> Value | None:
        """Where its value is (None while pending, or when it failed)."""
        value: Value | None = self.outcome.value
        return value

    @property
    def error(self) -> Any:
        """Its failure (an exception, or a RemoteError), None unless it failed."""
        return self.outcome.error if self.outcome.failed() else None

    def stored(self) -> Value:
        """The locator of the value it completed with."""
        value = self.value
        assert value is not None, f"object {self.id} has no value"
        return value


def check_owner(oid: str, value: Value | None, reporter: str) -> None:
    """FrayError unless a stored value reported by the process `reporter` is in that process's own store: the
    owner of a value is the process that reports it, never what the report claims."""
    if isinstance(value, Stored) and value.owner != reporter:
        raise FrayError(
            f"process {reporter} reported object {oid} as stored by {value.owner!r}, not by itself: refused"
        )


def _guarded(then: Callable[[], None]) -> Callable[[], None]:
    """then(), run where an entry completes: a failure is logged, never raised into the completing code (e.g.
    replying to a worker that died meanwhile must not stop the other callbacks)."""

    def run() -> None:
        try:
            then()
        except Exception:
            runtime.log.exception("fray: completion callback failed")

    return run


class ObjectDirectory:
    """Entries under the controller's lock; frees them when unreferenced; tells owners to free their memory."""

    def __init__(
        self,
        key: str,
        lock: threading.RLock,
        tracker: Tracker,
        free_stored: Callable[[list[Stored]], None],
    ) -> None:
        self.key = key
        self.lock = lock
        self.tracker = tracker
        self.free_stored = free_stored  # tells each owner to free these allocations
        self.entries: dict[str, Entry] = {}
        self.free_due: deque[tuple[float, str]] = deque()  # (when, object id), in deadline order
        self.sweep_armed = False
        self.closed = False

    def new(self, oid: str) -> tuple[Entry, RefPayload]:
        entry = Entry(oid)
        self.entries[oid] = entry
        return entry, RefPayload(oid)

    def register(self, oid: str, reporter: str, value: Value | None) -> tuple[Entry, RefPayload]:
        """Under the lock: the entry of an object that the worker process `reporter` made under an id it chose.
        What the report says is checked against who sent it: the id must be of the reporter's own namespace and
        new (a second report would replace a live object under its readers), and a stored value must be in the
        reporter's own store (its owner is told to free it, and losing that process loses it). FrayError if not."""
        if not oid.startswith(f"{self.key}-{reporter}."):
            raise FrayError(f"process {reporter} reported object {oid}, an id that is not its own: refused")
        if oid in self.entries:
            raise FrayError(f"process {reporter} reported object {oid}, which already exists: refused")
        check_owner(oid, value, reporter)
        return self.new(oid)

    def get(self, oid: str) -> Entry:
        entry = self.entries.get(oid)
        if entry is None:
            raise FrayError(f"object {oid} is gone (freed after its last reference was dropped, or shut down)")
        return entry

    def complete(self, entry: Entry, value: Value | None, error: Any, contained: tuple[str, ...] = ()) -> None:
        """Under the lock. Settle its outcome once (a value, or an error) and run what waits for it."""
        if entry.outcome.done():
            return
        entry.future = None
        entry.keep = [RefPayload(i) for i in contained] if contained else []
        if error is None:
            entry.outcome.set_value(value)
        else:
            entry.outcome.set_failure(error)

    def hold(self, proc_key: str, oids: list[str]) -> None:
        for oid in oids:
            entry = self.entries.get(oid)
            if entry is not None:
                entry.remote[proc_key] = entry.remote.get(proc_key, 0) + 1

    def release(self, proc_key: str, oids: list[str]) -> None:
        for oid in oids:
            entry = self.entries.get(oid)
            if entry is not None and entry.remote.get(proc_key, 0) > 0:
                entry.remote[proc_key] -= 1
                if not any(entry.remote.values()) and self.tracker.counts.get(oid, 0) == 0:
                    self.maybe_free(oid)

    def forget_holder(self, proc_key: str) -> None:
        for entry in self.entries.values():
            entry.remote.pop(proc_key, None)

    def mark_lost(self, owner: str, why: str) -> None:
        """Under the lock: values stored by the dead process `owner` are gone."""
        for entry in self.entries.values():
            value = entry.value
            if isinstance(value, Stored) and value.owner == owner:
                entry.outcome.lose(ObjectLostError(f"object {entry.id} is lost: {why}"))

    # ------------------------------------------------------------ freeing
    def maybe_free(self, oid: str) -> None:
        with self.lock:
            entry = self.entries.get(oid)
            if entry is None or entry.free_armed or self.closed:
                return
            if not FREE_GRACE and self._nothing_to_free(entry):  # dropped here: no wake-up of the loop thread
                self._free_if_unreferenced(oid, [])
                return
            entry.free_armed = True
            self.free_due.append((time.monotonic() + FREE_GRACE, oid))
            if self.sweep_armed:
                return
            self.sweep_armed = True
        runtime.call_later(FREE_GRACE, self._sweep)

    @staticmethod
    def _nothing_to_free(entry: Entry) -> bool:
        """Dropping it frees no memory and drops no other ref (a small value or a failure, keeping nothing): safe
        even in the finalizer that dropped its count. Each actor call's ref ends this way; handing it to the loop
        thread would cost a cross-thread wake-up per call, a noticeable share of an actor round trip."""
        return entry.outcome.done() and not entry.keep and not isinstance(entry.outcome.value, Stored)

    def _sweep(self) -> None:
        """One timer for all pending frees (a timer per object would add a timer's start to every actor call)."""
        freed: list[Stored] = []
        with self.lock:
            now = time.monotonic()
            while self.free_due and self.free_due[0][0] <= now:
                self._free_if_unreferenced(self.free_due.popleft()[1], freed)
            if not self.free_due or self.closed:
                self.sweep_armed = False
                delay = None
            else:
                delay = max(0.0, self.free_due[0][0] - now)
            if freed:
                self.free_stored(freed)
        if delay is not None:
            runtime.call_later(delay, self._sweep)

    def _free_if_unreferenced(self, oid: str, freed: list[Stored]) -> None:
        entry = self.entries.get(oid)
        if entry is None:
            return
        entry.free_armed = False
        if self.tracker.counts.get(oid, 0) > 0 or any(n > 0 for n in entry.remote.values()):
            return
        del self.entries[oid]
        entry.keep = []
        if isinstance(entry.value, Stored):
            freed.append(entry.value)

    # ------------------------------------------------------------ waiting
    def awaited(self, entries: list[Entry]) -> list[Outcome]:
        """Their outcomes, for somebody about to wait on them: each pending actor reply is watched from now on, so
        that its entry completes by itself."""
        with self.lock:
            for entry in entries:
                watch = entry.watch
                if watch is not None and entry.future is not None:
                    entry.watch = None
                    watch(entry)
        return [entry.outcome for entry in entries]

    def when(
        self, entries: list[Entry], count: int, then: Callable[[], None], stop_on_failure: bool = False
    ) -> Callable[[], None]:
        """Call then() once `count` of entries are done (or, stop_on_failure, once one has failed): at once if they
        are, else where the last of them completes (under the lock). Returns a function that cancels it."""
        return when(self.awaited(entries), count, _guarded(then), stop_on_failure)

    def wait(self, entries: list[Entry], count: int, timeout: float | None) -> set[int]:
        """Block (not under the lock) until `count` of entries are done or `timeout` passed; the indices of those
        done."""
        return wait_for(self.awaited(entries), count, timeout)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for entry in self.entries.values():
                if not entry.outcome.done() and entry.future is None:
                    self.complete(entry, None, FrayError("the fray-monarch context was shut down"))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
