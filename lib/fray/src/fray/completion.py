"""`fray.as_completed(refs)`: refs in the order they complete, like concurrent.futures.as_completed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from fray import current
from fray.errors import GetTimeoutError
from fray.refs import ObjectRef

__all__ = ["as_completed"]


def as_completed(refs: Iterable[ObjectRef], timeout: float | None = None) -> Iterator[ObjectRef]:
    """Yield each ref as soon as it completes (a failed one too: its get raises). Refs that complete together
    come in input order. Raises GetTimeoutError when `timeout` seconds pass before all have completed."""
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
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = ctx.wait(pending, num_returns=len(pending), timeout=0)
        if not done:
            done, _ = ctx.wait(pending, num_returns=1, timeout=left)
        if not done:
            raise GetTimeoutError(f"as_completed timed out after {timeout} s: {len(pending)} refs not complete")
        finished = set(done)
        pending = [ref for ref in pending if ref not in finished]
        yield from done
