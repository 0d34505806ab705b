"""in_memory objects: an entry per value (a Future holding a Blob, a raw value, or a failure)."""

from __future__ import annotations

import itertools
import weakref
from concurrent.futures import Future, InvalidStateError
from typing import Any, NoReturn

from fray.errors import FrayError
from fray.remote_errors import RemoteError
from fray.serialization import note_contained

# One process: refs that were pickled are looked up again by id here.
_entries: weakref.WeakValueDictionary[int, _Entry] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


class _Entry:
    """One object: a Future holding a Blob (serialized value), a raw value, or a failure."""

    __slots__ = ("__weakref__", "future", "id", "task")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.future: Future[Any] = Future()
        self.task: Any = None  # the _Task that will produce it, until it finishes

    def __reduce__(self) -> tuple[Any, ...]:
        _entries[self.id] = self  # findable by id while any ref to it lives (only pickled entries need this)
        note_contained(self)  # the blob being written keeps this entry alive
        return (_lookup_entry, (self.id,))

    def __repr__(self) -> str:
        return f"#{self.id}"

    def settle(self, value: Any = None, error: BaseException | RemoteError | None = None) -> None:
        try:
            if error is not None:
                self.future.set_exception(_Failure(error))
            else:
                self.future.set_result(value)
        except InvalidStateError:  # already failed (killed actor, cancelled task): the first outcome stands
            pass


def _lookup_entry(entry_id: int) -> _Entry:
    entry = _entries.get(entry_id)
    if entry is None:
        raise FrayError(f"object #{entry_id} is gone: no ref to it was kept")
    return entry


class _Failure(Exception):
    """Carries a task's failure inside a Future; `raise_it` raises the original exception."""

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
