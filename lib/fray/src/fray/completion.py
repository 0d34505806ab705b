"""`fray.as_completed(refs)`: refs in the order they complete, like concurrent.futures.as_completed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from fray import current
from fray.errors import GetTimeoutError
from fray.progress import Progress, ProgressMode, check_mode
from fray.refs import ObjectRef

if TYPE_CHECKING:
    from fray.context import JobContext

__all__ = ["as_completed", "get_with_progress"]


def as_completed(
    refs: Iterable[ObjectRef], timeout: float | None = None, progress: ProgressMode = False
) -> Iterator[ObjectRef]:
    """Yield each ref as soon as it completes (a failed one too: its get raises). Refs that complete together
    come in input order. Raises GetTimeoutError when `timeout` seconds pass before all have completed.

    progress=True shows a bar on a terminal ("always": also elsewhere); to count failures it checks each done
    ref with a get, so the values are read once more."""
    mode = check_mode(progress)
    pending = list(refs)
    if not pending:
        return
    for ref in pending:
        if not isinstance(ref, ObjectRef):
            raise ValueError(f"as_completed needs ObjectRefs, got {type(ref).__name__}")
    ctx = current.context_for(pending[0].backend)
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    deadline = None if timeout is None else time.monotonic() + timeout
    with Progress(len(pending), mode, "fray.as_completed") as bar:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ctx.wait(pending, num_returns=len(pending), timeout=0)
            if not done:
                done, _ = ctx.wait(pending, num_returns=1, timeout=left)
            if not done:
                raise GetTimeoutError(f"as_completed timed out after {timeout} s: {len(pending)} refs not complete")
            finished = set(done)
            pending = [ref for ref in pending if ref not in finished]
            if bar.shown:
                bar.advance(len(done), sum(1 for ref in done if _failed(ctx, ref)))
            yield from done


def _failed(ctx: JobContext, ref: ObjectRef) -> bool:
    try:
        ctx.get(ref, timeout=0)
    except GetTimeoutError:
        return False
    except Exception:  # any error its get raises is a failure to count
        return True
    return False


def get_with_progress(ctx: JobContext, refs: list[ObjectRef], timeout: float | None, mode: ProgressMode) -> list[Any]:
    """get, fetching each ref as it completes to count it (and its failure) on the bar; a failure is raised
    when it is seen (the first in input order among those seen together), as get does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    values: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    pending = list(range(len(refs)))
    with Progress(len(refs), mode, "fray.get") as bar:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done = ctx._wait([refs[i] for i in pending], 1, left)
            if not done:
                raise GetTimeoutError(f"get timed out after {timeout} s: {len(pending)} of {len(refs)} not ready")
            finished = [pending[j] for j in sorted(done)]
            failed = 0
            for i in finished:
                try:
                    values[i] = ctx._get([refs[i]], None)[0]
                except Exception as exc:  # raised below, in input order
                    errors[i] = exc
                    failed += 1
            bar.advance(len(finished), failed)
            if errors:
                raise errors[min(errors)]
            done_set = set(finished)
            pending = [i for i in pending if i not in done_set]
    return [values[i] for i in range(len(refs))]
