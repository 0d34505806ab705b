"""The driver's task functions, pickled once each: a function submitted many times (a map's) is sent by the same
key and bytes every time, and a worker process unpickles it once per key."""

from __future__ import annotations

import uuid
from typing import Any

from fray.backend import dumps_code

__all__ = ["TaskFunctions"]

_MAX = 4096  # functions remembered; past it the table starts again (a key is never reused for another function)


class TaskFunctions:
    def __init__(self) -> None:
        self._table: dict[int, tuple[Any, str, bytes]] = {}  # id(fn) -> (fn, key, its pickle)

    def blob(self, fn: Any) -> tuple[str, bytes]:
        """fn's key and pickle, made at its first submission."""
        known = self._table.get(id(fn))
        if known is not None and known[0] is fn:
            return known[1], known[2]
        data = dumps_code(fn, f"task function {getattr(fn, '__qualname__', fn)}").data
        if len(self._table) > _MAX:
            self._table.clear()
        key = uuid.uuid4().hex
        self._table[id(fn)] = (fn, key, data)
        return key, data
