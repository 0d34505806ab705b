"""One completion type: the outcome of one object (a task's result, an actor call's, a put), which every
backend settles and every waiting path reads (get, wait, fray.as_completed, progress bars, futures).

An Outcome is pending, then settled exactly once: a value, a failure, or cancelled (the first writer wins).
Callbacks run in the thread that settles it (or at once if it has settled), and come with an O(1) remover.
`wait_for` (k of n), `when` (its callback form), `first_failure`, `wait_for_get` (the rule of every backend's get)
and `completed` (linear as_completed) are free functions over outcomes, as concurrent.futures' wait and
as_completed are over futures, without any private names of CPython's.
"""

from __future__ import annotations

import enum
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from fray.errors import GetTimeoutError

__all__ = ["Outcome", "State", "completed", "first_failure", "wait_for", "wait_for_get", "when"]

logger = logging.getLogger(__name__)


class State(enum.Enum):
    PENDING = "pending"
    VALUE = "value"
    FAILURE = "failure"
    CANCELLED = "cancelled"


_ids = itertools.count()


class Outcome:
    """The completion of one object. `value` is the backend's stored form (it decodes it); `error` the failure
    (an exception, or a backend's portable form of one)."""

    __slots__ = ("_callbacks", "_event", "_lock", "error", "state", "value")

    def __init__(self) -> None:
        self.state = State.PENDING
        self.value: Any = None
        self.error: Any = None
        self._callbacks: dict[int, Callable[[Outcome], None]] | None = None
        self._event: threading.Event | None = None  # made only when someone blocks on this one outcome
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ settling
    def set_value(self, value: Any) -> bool:
        """Settle with a value; False if it had settled already (then nothing changes)."""
        return self._settle(State.VALUE, value, None)

    def set_failure(self, error: Any) -> bool:
        return self._settle(State.FAILURE, None, error)

    def set_cancelled(self, error: Any) -> bool:
        return self._settle(State.CANCELLED, None, error)

    def lose(self, error: Any) -> None:
        """A value that can no longer be read (its owner died): it counts as failed from now on. Waiters have
        already been told it completed; nothing is told again."""
        with self._lock:
            if self.state is State.VALUE:
                self.state, self.value, self.error = State.FAILURE, None, error

    def _settle(self, state: State, value: Any, error: Any) -> bool:
        with self._lock:
            if self.state is not State.PENDING:
                return False
            self.state, self.value, self.error = state, value, error
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        for callback in (callbacks or {}).values():
            try:
                callback(self)
            except Exception:  # one failing callback must not keep the outcome from the others (as futures do)
                logger.exception("exception calling callback for %r", self)
        return True

    # ------------------------------------------------------------------ reading
    def done(self) -> bool:
        return self.state is not State.PENDING

    def failed(self) -> bool:
        """Settled with a failure or cancelled."""
        return self.state is State.FAILURE or self.state is State.CANCELLED

    def wait(self, timeout: float | None = None) -> bool:
        """Block until settled; False if `timeout` seconds passed first."""
        if self.state is not State.PENDING:
            return True
        with self._lock:
            if self.state is not State.PENDING:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def add_callback(self, callback: Callable[[Outcome], None]) -> Callable[[], None]:
        """Call callback(self) once settled: in the settling thread, or now if settled already. Returns a
        function that removes it (O(1))."""
        key = next(_ids)
        if self._subscribe(key, callback):
            return lambda: self._remove(key)
        return _nothing

    def _subscribe(self, key: int, callback: Callable[[Outcome], None]) -> bool:
        """add_callback under a key the caller chose (one key for many outcomes: no remover made per outcome).
        False if it had settled: callback was called at once."""
        with self._lock:
            if self.state is State.PENDING:
                if self._callbacks is None:
                    self._callbacks = {}
                self._callbacks[key] = callback
                return True
        callback(self)
        return False

    def _remove(self, key: int) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.pop(key, None)

    def to_future(
        self, load: Callable[[Outcome], Any], call_soon: Callable[[Callable[[], None]], Any] | None = None
    ) -> Future[Any]:
        """A concurrent.futures.Future of the loaded value (load(outcome) returns it or raises the failure), with
        no thread of its own: loaded in the settling thread, or handed to `call_soon` (a loop's), when given."""
        future: Future[Any] = Future()

        def settle() -> None:
            try:
                future.set_result(load(self))
            except BaseException as exc:  # the failure the value stood for, or one loading it
                future.set_exception(exc)

        self.add_callback(lambda _: settle() if call_soon is None else call_soon(settle))
        return future


def _nothing() -> None:
    return None


def first_failure(outcomes: Sequence[Outcome]) -> int | None:
    """The index of the first failed outcome in list order (None if none has failed)."""
    for i, outcome in enumerate(outcomes):
        if outcome.failed():
            return i
    return None


def when(
    outcomes: Sequence[Outcome], count: int, then: Callable[[], None], stop_on_failure: bool = False
) -> Callable[[], None]:
    """Call then() once `count` of outcomes have settled (at once if they have), or, with stop_on_failure, once
    one has failed. Returns a function that cancels it (then() is never called after that).

    Cheap per outcome, since a get of 10k refs runs this over all of them: one key and one callback for all,
    and an outcome that has settled is not visited again to remove it (its callbacks went when it settled)."""
    pending = []
    left = count
    for outcome in outcomes:
        if outcome.state is State.PENDING:
            pending.append(outcome)
        else:
            left -= 1
            if stop_on_failure and outcome.failed():
                left = 0
    if left <= 0:
        then()
        return _nothing
    key = next(_ids)
    lock = threading.Lock()
    waiting = [left, False]  # settlements still needed; fired (or cancelled)

    def unsubscribe() -> None:
        for outcome in pending:
            if outcome.state is State.PENDING:
                outcome._remove(key)

    def settled(outcome: Outcome) -> None:
        with lock:
            if waiting[1]:
                return
            waiting[0] -= 1
            if waiting[0] > 0 and not (stop_on_failure and outcome.failed()):
                return
            waiting[1] = True
        unsubscribe()
        then()

    for outcome in pending:
        outcome._subscribe(key, settled)

    def cancel() -> None:
        with lock:
            waiting[1] = True
        unsubscribe()

    return cancel


def wait_for(outcomes: Sequence[Outcome], count: int, timeout: float | None, stop_on_failure: bool = False) -> set[int]:
    """Block until `count` of outcomes have settled (or, with stop_on_failure, one has failed), or `timeout`
    seconds pass; the indices of those settled then (more than `count` if more had)."""
    event = threading.Event()
    cancel = when(outcomes, count, event.set, stop_on_failure)
    if cancel is not _nothing:
        try:
            event.wait(timeout)
        finally:
            cancel()
    return {i for i, o in enumerate(outcomes) if o.state is not State.PENDING}


def wait_for_get(outcomes: Sequence[Outcome], timeout: float | None) -> int | None:
    """The rule of every backend's get: wait until all outcomes have settled or one has failed (a failed pipeline
    does not wait on the rest, as Ray's get); return the index of the first failure in list order (even where an
    earlier one is not done yet), else None; raise GetTimeoutError once `timeout` seconds pass first."""
    if not all(o.done() for o in outcomes):
        wait_for(outcomes, len(outcomes), timeout, stop_on_failure=True)
    failed = first_failure(outcomes)
    if failed is None and not all(o.done() for o in outcomes):
        missing = sum(not o.done() for o in outcomes)
        raise GetTimeoutError(f"get timed out after {timeout} s: {missing} of {len(outcomes)} refs not ready")
    return failed


def completed(outcomes: Sequence[Outcome], timeout: float | None = None) -> Iterator[list[int]]:
    """The indices of outcomes as they settle, in batches (those settled together, in input order); linear in
    len(outcomes). Raises TimeoutError if `timeout` seconds pass before all have settled."""
    arrived: queue.SimpleQueue[int] = queue.SimpleQueue()

    def arrives(index: int) -> Callable[[Outcome], None]:
        return lambda _: arrived.put(index)

    removers = [o.add_callback(arrives(i)) for i, o in enumerate(outcomes)]
    deadline = None if timeout is None else time.monotonic() + timeout
    left = len(outcomes)
    try:
        while left:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                batch = [arrived.get(timeout=wait)]
            except queue.Empty:
                raise TimeoutError(f"{left} of {len(outcomes)} not complete after {timeout} s") from None
            while True:
                try:
                    batch.append(arrived.get_nowait())
                except queue.Empty:
                    break
            left -= len(batch)
            yield sorted(batch)
    finally:
        for remove in removers:
            remove()
