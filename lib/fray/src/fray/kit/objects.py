"""The kit's object table: an entry per value, completed through fray.runtime.outcome (a Blob, a raw value, or a
failure).

A ref's payload is its Entry. Pickled, it names its owner process and its id: in the owner it is the Entry again
(looked up while any ref to it lives); in another process (a worker of a process engine: fray.kit.remote) it is a
`Remote` that the worker's context sends back to the owner by name.
"""

from __future__ import annotations

import itertools
import os
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from fray.errors import FrayError
from fray.runtime.outcome import Outcome
from fray.runtime.remote_errors import RemoteError
from fray.runtime.serialization import Blob, note_contained

__all__ = [
    "IMMUTABLE",
    "Entry",
    "Failure",
    "Remote",
    "Serialized",
    "immutable_call",
    "new_id",
    "register_lookup",
]

# One process: refs that were pickled are looked up again by id here.
_entries: weakref.WeakValueDictionary[int, Entry] = weakref.WeakValueDictionary()
_ids = itertools.count(1)
# Who this process is, in a pickled payload: another process's payloads become Remote here. Random, not the pid: a
# pid is reused, and a forked child (a new id below) must not take its parent's objects for its own.
OWNER = [secrets.token_hex(8)]
os.register_at_fork(after_in_child=lambda: OWNER.__setitem__(0, secrets.token_hex(8)))


def new_id() -> int:
    """A fresh id for an entry or an actor (one sequence: an id names one thing in this process)."""
    return next(_ids)


class Entry:
    """One object: its outcome holds a Blob (serialized value) or a raw value, or a failure."""

    __slots__ = ("__weakref__", "id", "outcome", "task")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.outcome = Outcome()
        self.task: Any = None  # the Task that will produce it, until it finishes

    def __reduce__(self) -> tuple[Any, ...]:
        _entries[self.id] = self  # findable by id while any ref to it lives (only pickled entries need this)
        note_contained(self)  # the blob being written keeps this entry alive
        return (_rebuild, ("entry", OWNER[0], self.id))

    def __repr__(self) -> str:
        return f"#{self.id}"

    def settle(self, value: Any = None, error: BaseException | RemoteError | None = None) -> None:
        """Complete it (once: a killed actor's or cancelled task's failure may come first and stands)."""
        if error is not None:
            self.outcome.set_failure(error)
        else:
            self.outcome.set_value(value)

    def result(self) -> Any:
        """Its stored value, once complete (blocks until then); raises Failure if it failed."""
        self.outcome.wait()
        if self.outcome.failed():
            raise Failure(self.outcome.error)
        return self.outcome.value


@dataclass(frozen=True, slots=True)
class Remote:
    """An entry or actor of another process (kind "entry" or "actor"), by its owner and id: what a worker of a
    process engine holds, and sends back to the owner (where it is the object again)."""

    kind: str
    owner: str
    id: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.kind, self.owner, self.id))

    def __repr__(self) -> str:
        return f"#{self.id}"


def _lookup_entry(entry_id: int) -> Entry:
    entry = _entries.get(entry_id)
    if entry is None:
        raise FrayError(f"object #{entry_id} is gone: no ref to it was kept")
    return entry


_lookups: dict[str, Callable[[int], Any]] = {"entry": _lookup_entry}


def register_lookup(kind: str, lookup: Callable[[int], Any]) -> None:
    """How this process finds its own objects of `kind` by id (actors: fray.kit.actors)."""
    _lookups[kind] = lookup


def _rebuild(kind: str, owner: str, object_id: int) -> Any:
    if owner == OWNER[0]:
        return _lookups[kind](object_id)
    return Remote(kind, owner, object_id)


class Failure(Exception):
    """A failure met while resolving an object (a task's argument that failed): `raise_it` raises the original
    exception; a task that meets it fails with that exception, not with this carrier, and is not retried."""

    def __init__(self, error: BaseException | RemoteError) -> None:
        super().__init__()
        self.error = error

    def raise_it(self) -> NoReturn:
        if isinstance(self.error, RemoteError):
            raise self.error.rebuild() from None
        raise self.error


@dataclass(frozen=True)
class Serialized:
    """A result that arrived serialized from another process: the store keeps its blob as it is (its buffers are
    already this process's own memory), instead of rebuilding the value to serialize it again."""

    blob: Blob


# Values of these types cannot be mutated and always pickle: copying them through pickle would change nothing
# a program can observe, so they are passed as they are even when serializing.
IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})


def immutable_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return all(type(a) in IMMUTABLE for a in args) and all(type(v) in IMMUTABLE for v in kwargs.values())
