"""Setting environment variables in a process where Monarch's Rust threads already run.

`os.environ.update` calls setenv once per variable, and glibc's setenv grows the `environ` array with realloc:
a Rust thread reading a variable at that moment (Monarch's telemetry thread reads HYPERACTOR_PROCESS_NAME on its
first event) walks a freed array and the process dies of SIGSEGV. Seen now and then in fresh SPMD member
processes, whose torch.distributed variables fray sets before `__init__` (core dump: getenv in
hyperactor_telemetry's worker loop).

`publish` builds a new, complete `environ` array and swaps the global pointer in one store; the old array is
never freed, so a reader sees either the old variables or the new ones. Python's `os.environ` is then updated
without calling setenv again. Two threads publishing at once (a worker's start publishes its process's view of
the GPUs while an actor's init publishes its own variables) take turns: each builds its array from the one before,
so neither can swap in an array that lacks the other's variables (CUDA_VISIBLE_DEVICES lost from getenv while
os.environ still showed it).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping

__all__ = ["publish"]

_libc = ctypes.CDLL(None)
_environ = ctypes.c_void_p.in_dll(_libc, "environ")
_kept: list[object] = []  # every array published, and its strings: a reader may still walk any of them
_publishing = threading.Lock()  # one publish at a time: read the current array, build the next, swap it in


def _entries() -> list[bytes]:
    entries: list[bytes] = []
    if not _environ.value:
        return entries
    array = ctypes.cast(_environ.value, ctypes.POINTER(ctypes.c_char_p))
    i = 0
    while array[i] is not None:
        entries.append(array[i])
        i += 1
    return entries


def publish(env: Mapping[str, str | None]) -> None:
    """Set `env` in this process (the C environment and os.environ) without a window where a concurrent
    getenv can read freed memory. A None value removes the variable."""
    if not env:
        return
    updates = {os.fsencode(k): None if v is None else os.fsencode(v) for k, v in env.items()}
    with _publishing:
        _swap_in(updates)


def _swap_in(updates: dict[bytes, bytes | None]) -> None:
    entries = []
    for entry in _entries():
        name = entry.split(b"=", 1)[0]
        if name not in updates:
            entries.append(entry)
    entries += [name + b"=" + value for name, value in updates.items() if value is not None]
    array = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    _kept.append(array)
    _environ.value = ctypes.addressof(array)  # one pointer store: the new array is complete before it is seen
    data = os.environ._data  # type: ignore[attr-defined]  # CPython's mapping behind os.environ
    for name, value in updates.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
