"""Cancelling Ray tasks, actor calls and generator tasks without tripping Ray 2.60's driver aborts.

Two Ray 2.60 bugs abort the DRIVER process:
- cancelling a task while it waits for its ObjectRef arguments, when those arguments arrive afterwards
  (reference_counter.cc "Check failed: submitted_task_ref_count > 0");
- cancelling a task whose worker has replied but whose completion Ray's io thread has not processed yet
  (task_manager.cc "Tried to complete task that was not pending"). No check from Python closes that window (the
  result is not visible until the completion is processed), and it is hit whenever a cancel meets tasks that
  finish together: take the first of eight like tasks and cancel the rest, or a map that ends at a failed item.
So a task that has finished is never cancelled (its result stays), and any other cancelled task is marked
cancelled in fray at once (get raises TaskCancelledError, wait counts it done) while Ray is told later, by one
thread per context (`CancelTracker`), never one per cancelled ref: once the task's arguments are ready (plus a
moment for Ray's resolver), and never sooner than _COMPLETION_GRACE after the cancel, and only if the task has
not finished by then (a completion under way when fray's cancel came is processed by then). A stream's producer
is cancelled the same way when the stream is closed (fray_ray._streams).

Holding a ray.ObjectRef pins its object in the store, so the arguments kept are only those that may be pending
(not refs made by put here, which are ready at once) and only while they might matter: an entry goes when the
task's ref is dropped (weak key) or when a prune finds its arguments ready. (Keeping every argument for a
fixed number of submits instead would pin each put -> task object: a loop's puts would land on fresh store memory
and then spill to disk.)
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from fray.backend import ObjectRef
from fray.errors import TaskCancelledError

__all__ = ["CancelTracker", "cancel_unless_finished", "finished"]

_PRUNE_MIN = 16  # pending-argument entries kept before the first prune (then twice what survived one)
_RESOLVER_GRACE = 0.2  # seconds Ray's dependency resolver gets with a task once its arguments are ready
_COMPLETION_GRACE = 0.2  # seconds a cancelled task is left to finish before Ray is told (a completion under way)
_POLL = 1.0  # seconds one wait of the deferred-cancel thread takes before it looks for new entries


def finished(done: Any) -> bool:
    """True once `done` (a task's result ref; a generator task's completion ref) is ready, or Ray is gone."""
    try:
        ready, _ = ray.wait([done], timeout=0, fetch_local=False)
    except Exception:  # Ray disconnected: nothing left to stop
        return True
    return bool(ready)


def cancel_unless_finished(target: Any, done: Any) -> None:
    """ray.cancel(target) (a Ray ObjectRef or ObjectRefGenerator; not forced, so only Python code is interrupted,
    and recursively), unless `done` says it has finished: a finished task keeps its result."""
    if finished(done):
        return
    try:
        ray.cancel(target, force=False, recursive=True)
    except Exception:  # finished meanwhile, an object made by put, or Ray is gone: nothing to cancel
        pass


@dataclass(eq=False)
class _Deferred:
    """A cancel waiting for the task's arguments: `pending` shrinks as they become ready, then it is `due`."""

    target: Any
    done: Any
    pending: list[Any]
    not_before: float
    due: float | None = None


class CancelTracker:
    """One context's cancel bookkeeping: the Ray ref arguments of tasks that may still be pending, the refs made
    by put (never kept), the refs fray marked cancelled before Ray could be told, and the deferred cancels.

    `stopped()` is the context's "shut down" flag: then deferred cancels are dropped (Ray is going away)."""

    def __init__(self, stopped: Callable[[], bool]) -> None:
        self._stopped = stopped
        # task's ref -> its Ray ObjectRef arguments that may not be ready yet; weakly keyed, so an entry never
        # outlives the task's ref. puts: refs made by put here (always ready, never kept).
        self.deps: weakref.WeakKeyDictionary[ObjectRef, list[Any]] = weakref.WeakKeyDictionary()
        self.puts: weakref.WeakSet[ObjectRef] = weakref.WeakSet()
        self.cancelled: set[bytes] = set()  # Ray ids of the refs cancelled by fray (an entry goes with its ref)
        self._prune_at = _PRUNE_MIN
        self._lock = threading.Lock()
        self._deferred: list[_Deferred] = []
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ submissions
    def pending_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The Ray refs among the top-level arguments that may not be ready (not made by put here), once each
        (ray.wait refuses duplicates)."""
        puts = self.puts
        deps = [a.payload for a in (*args, *kwargs.values()) if type(a) is ObjectRef and a not in puts]
        return list(dict.fromkeys(deps)) if deps else deps

    def note_dependencies(self, result: ObjectRef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Keep the task's possibly pending Ray ref arguments (for cancel) while its ref lives."""
        deps = self.pending_args(args, kwargs)
        if not deps:
            return
        with self._lock:
            if len(self.deps) >= self._prune_at:
                self._prune()
            self.deps[result] = deps

    def _prune(self) -> None:
        """Drop the entries whose arguments are all ready (one ray.wait for all, cheapest when all are
        ready); prune again once the survivors have doubled (O(1) amortized per task)."""
        entries = list(self.deps.items())
        every = list(dict.fromkeys(dep for _, deps in entries for dep in deps))
        if every:
            ready, _ = ray.wait(every, num_returns=len(every), timeout=0, fetch_local=False)
            ready_set = set(ready)
            for key, deps in entries:
                if all(dep in ready_set for dep in deps):
                    self.deps.pop(key, None)
        self._prune_at = max(_PRUNE_MIN, 2 * len(self.deps))

    # ------------------------------------------------------------------ reads
    def raise_if_cancelled(self, payloads: list[Any]) -> None:
        cancelled = self.cancelled
        for p in payloads:
            if p.binary() in cancelled:
                raise TaskCancelledError(f"task {p.hex()} was cancelled")

    # ------------------------------------------------------------------ cancel
    def cancel(self, ref: ObjectRef) -> None:
        """Cancel the task (or actor call) behind ref unless it has finished: marked cancelled in fray now, Ray told
        by the deferred-cancel thread."""
        payload = ref.payload
        with self._lock:
            deps = self.deps.pop(ref, None)
        if finished(payload):
            return
        key = payload.binary()
        self.cancelled.add(key)
        weakref.finalize(ref, self.cancelled.discard, key)
        self._defer(payload, payload, _not_ready(deps) if deps else [])

    def cancel_stream(self, generator: Any, deps: list[Any]) -> None:
        """Cancel a generator task (a closed stream's producer) unless it has finished, as `cancel` does (its Ray
        ref arguments `deps` ready first). Nothing once the context is shut down."""
        if self._stopped():
            return
        done = generator.completed()
        if finished(done):
            return
        self._defer(generator, done, _not_ready(deps) if deps else [])

    def _defer(self, target: Any, done: Any, pending: list[Any]) -> None:
        """Cancel `target` once `pending` (its arguments) are ready, at the earliest _COMPLETION_GRACE from now."""
        entry = _Deferred(target, done, pending, not_before=time.monotonic() + _COMPLETION_GRACE)
        if not pending:
            entry.due = entry.not_before
        with self._lock:
            self._deferred.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-ray-cancel", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        """Until no cancel is deferred (or the context shuts down): wait for any pending argument, and cancel
        each task _RESOLVER_GRACE seconds after its last argument became ready."""
        try:
            while True:
                with self._lock:
                    if not self._deferred or self._stopped():
                        self._deferred = []
                        self._thread = None
                        return
                    entries = list(self._deferred)
                now = time.monotonic()
                due = [e for e in entries if e.due is not None and e.due <= now]
                for entry in due:
                    cancel_unless_finished(entry.target, entry.done)
                if due:
                    with self._lock:
                        self._deferred = [e for e in self._deferred if e not in due]
                    continue
                waiting = list(dict.fromkeys(dep for e in entries for dep in e.pending))
                soonest = min((e.due for e in entries if e.due is not None), default=now + _POLL)
                timeout = max(0.0, min(_POLL, soonest - now))
                ready: set[Any] = set()
                if waiting:
                    first, rest = ray.wait(waiting, num_returns=1, timeout=timeout, fetch_local=False)
                    ready.update(first)
                    if first and rest:  # a wait returns at most num_returns refs: collect the others ready
                        ready.update(ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=False)[0])
                else:
                    time.sleep(timeout)
                if ready:
                    now = time.monotonic()
                    for entry in entries:
                        if entry.pending:
                            entry.pending = [dep for dep in entry.pending if dep not in ready]
                            if not entry.pending:
                                entry.due = max(now + _RESOLVER_GRACE, entry.not_before)
        except Exception:  # Ray went away meanwhile (the context shut down): nothing left to cancel
            with self._lock:
                self._deferred = []
                self._thread = None


def _not_ready(deps: list[Any]) -> list[Any]:
    _, pending = ray.wait(deps, num_returns=len(deps), timeout=0, fetch_local=False)
    return list(pending)
