"""in_memory objects: an entry per value, completed through fray.outcome (a Blob, a raw value, or a failure)."""

from __future__ import annotations

import itertools
import weakref
from typing import Any, NoReturn

from fray.errors import FrayError
from fray.outcome import Outcome
from fray.remote_errors import RemoteError
from fray.serialization import note_contained

# One process: refs that were pickled are looked up again by id here.
_entries: weakref.WeakValueDictionary[int, _Entry] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


class _Entry:
    """One object: its outcome holds a Blob (serialized value) or a raw value, or a failure."""

    __slots__ = ("__weakref__", "id", "outcome", "task")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.outcome = Outcome()
        self.task: Any = None  # the _Task that will produce it, until it finishes

    def __reduce__(self) -> tuple[Any, ...]:
        _entries[self.id] = self  # findable by id while any ref to it lives (only pickled entries need this)
        note_contained(self)  # the blob being written keeps this entry alive
        return (_lookup_entry, (self.id,))

    def __repr__(self) -> str:
        return f"#{self.id}"

    def settle(self, value: Any = None, error: BaseException | RemoteError | None = None) -> None:
        """Complete it (once: a killed actor's or cancelled task's failure may come first and stands)."""
        if error is not None:
            self.outcome.set_failure(error)
        else:
            self.outcome.set_value(value)

    def result(self) -> Any:
        """Its stored value, once complete (blocks until then); raises _Failure if it failed."""
        self.outcome.wait()
        if self.outcome.failed():
            raise _Failure(self.outcome.error)
        return self.outcome.value


def _lookup_entry(entry_id: int) -> _Entry:
    entry = _entries.get(entry_id)
    if entry is None:
        raise FrayError(f"object #{entry_id} is gone: no ref to it was kept")
    return entry


class _Failure(Exception):
    """A failure met while resolving an object (a task's argument that failed): `raise_it` raises the original
    exception; a task that meets it fails with that exception, not with this carrier, and is not retried."""

    def __init__(self, error: BaseException | RemoteError) -> None:
        super().__init__()
        self.error = error

    def raise_it(self) -> NoReturn:
        if isinstance(self.error, RemoteError):
            raise self.error.rebuild() from None
        raise self.error


# Values of these types cannot be mutated and always pickle: copying them through pickle would change nothing
# a program can observe, so they are passed as they are even when serializing.
_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _immutable_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return all(type(a) in _IMMUTABLE for a in args) and all(type(v) in _IMMUTABLE for v in kwargs.values())
