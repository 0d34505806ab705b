"""Refs as they complete: `fray.as_completed(refs)` (like concurrent.futures.as_completed), `get` with a progress
bar, and the completion watcher of backends with no completion callbacks of their own.

Each reads one fray.runtime.outcome.Outcome per ref, linear in the number of refs: a backend that has outcomes gives
them (JobContext._outcomes); for one that does not, one watcher thread per context settles them by asking the
backend's `_wait` which pending refs are done (it never fetches a value to tell), and there is no thread per ref.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, cast

from fray.errors import FrayError, GetTimeoutError
from fray.host.interrupts import interrupted
from fray.host.interrupts import refs as refs_text
from fray.runtime import current
from fray.runtime.outcome import Outcome, completed
from fray.runtime.refs import ObjectRef
from fray.telemetry.progress import Progress, ProgressMode, check_mode

__all__ = ["RefWatcher", "WatchedContext", "as_completed", "get_with_progress", "outcomes"]

POLL = 0.2  # seconds one _wait of the watcher may take before it looks for refs added meanwhile


class WatchedContext(Protocol):
    """What completion needs of a job context (a fray.context.JobContext, which this module does not import: the
    context is built on it); `_watcher` is its RefWatcher, made on first need under `_shutdown_lock`."""

    _watcher: RefWatcher | None
    _shutdown_lock: threading.Lock

    @property
    def backend(self) -> str: ...

    @property
    def is_shut_down(self) -> bool: ...

    def get(self, refs: ObjectRef, timeout: float | None = None) -> Any: ...

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]: ...

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]: ...

    def _outcomes(self, refs: list[ObjectRef]) -> list[Outcome] | None: ...


class RefWatcher:
    """One thread for a context: settles the outcome of each ref given to `outcomes()` when the backend's `_wait`
    says it is done (value None: readers ask `_get`). Ends when nothing is pending, or with its context."""

    def __init__(self, ctx: WatchedContext) -> None:
        self.ctx = ctx
        self.lock = threading.Lock()
        self.pending: dict[ObjectRef, Outcome] = {}
        self.thread: threading.Thread | None = None

    def outcomes(self, refs: list[ObjectRef]) -> list[Outcome]:
        """The outcome of each ref, all registered before the thread's next round: a round started while refs
        were still being added one by one would see only some of them, and settle the rest one round each."""
        with self.lock:
            found = [self.pending.setdefault(ref, Outcome()) for ref in refs]
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=f"fray-{self.ctx.backend}-watch", daemon=True)
                self.thread.start()
        return found

    def _run(self) -> None:
        while True:
            with self.lock:
                refs = list(self.pending)
                if not refs or self.ctx.is_shut_down:
                    self.thread = None
                    left, self.pending = self.pending, {}
                    break
            failure: Exception | None = None
            try:
                done = self.ctx._wait(refs, 1, POLL)
            except Exception as exc:  # the context failed under us: every waiter learns it
                done, failure = set(range(len(refs))), exc
            with self.lock:
                settled = [self.pending.pop(refs[i]) for i in done if refs[i] in self.pending]
            for outcome in settled:
                if failure is None:
                    outcome.set_value(None)
                else:
                    outcome.set_failure(failure)
        for outcome in left.values():
            outcome.set_failure(FrayError(f"this {self.ctx.backend} context is shut down"))


def outcomes(ctx: WatchedContext, refs: list[ObjectRef]) -> list[Outcome]:
    """One outcome per ref: the backend's own, else its context's watcher's."""
    native = ctx._outcomes(refs)
    if native is not None:
        return native
    watcher = ctx._watcher
    if watcher is None:
        with ctx._shutdown_lock:
            if ctx._watcher is None:
                ctx._watcher = RefWatcher(ctx)
            watcher = ctx._watcher
    return watcher.outcomes(refs)


def as_completed(
    refs: Iterable[ObjectRef], timeout: float | None = None, progress: ProgressMode = False
) -> Iterator[ObjectRef]:
    """Yield each ref as soon as it completes (a failed one too: its get raises). Refs that complete together
    come in input order. Raises GetTimeoutError when `timeout` seconds pass before all have completed.

    progress=True shows a bar on a terminal ("always": also elsewhere); on a backend without outcomes of its own,
    counting failures there reads each done ref's value once more."""
    mode = check_mode(progress)
    pending = list(refs)
    if not pending:
        return
    for ref in pending:
        if not isinstance(ref, ObjectRef):
            raise ValueError(f"as_completed needs ObjectRefs, got {type(ref).__name__}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    ctx = cast(WatchedContext, current.context_for(pending[0].backend))
    watched = outcomes(ctx, pending)
    with Progress(len(pending), mode, "fray.as_completed") as bar:
        try:
            for batch in completed(watched, timeout):
                if bar.shown:
                    bar.advance(len(batch), sum(1 for i in batch if _failed(ctx, pending[i], watched[i])))
                yield from (pending[i] for i in batch)
        except TimeoutError as exc:
            raise GetTimeoutError(f"as_completed timed out after {timeout} s: {exc}") from None
        except KeyboardInterrupt as exc:  # Ctrl-C while waiting here, not in the caller's loop body
            raise interrupted(exc, f"fray.as_completed of {refs_text(len(pending))}") from None


def _failed(ctx: WatchedContext, ref: ObjectRef, outcome: Outcome) -> bool:
    if outcome.failed():
        return True
    if ctx._outcomes([ref]) is not None:
        return False  # the backend's own outcome says it
    try:
        ctx.get(ref, timeout=0)
    except GetTimeoutError:
        return False
    except Exception:  # any error its get raises is a failure to count
        return True
    return False


def get_with_progress(
    ctx: WatchedContext, refs: list[ObjectRef], timeout: float | None, mode: ProgressMode
) -> list[Any]:
    """get, reading each ref once as it completes to count it (and its failure) on the bar; a failure is raised
    when it is seen (the first in input order among those seen together), as get does."""
    values: dict[int, Any] = {}
    with Progress(len(refs), mode, "fray.get") as bar:
        try:
            for batch in completed(outcomes(ctx, refs), timeout):
                errors: dict[int, BaseException] = {}
                for i in batch:
                    try:
                        values[i] = ctx._get([refs[i]], None)[0]
                    except Exception as exc:  # raised below, in input order
                        errors[i] = exc
                bar.advance(len(batch), len(errors))
                if errors:
                    raise errors[min(errors)]
        except TimeoutError:
            missing = len(refs) - len(values)
            raise GetTimeoutError(f"get timed out after {timeout} s: {missing} of {len(refs)} not ready") from None
    return [values[i] for i in range(len(refs))]
