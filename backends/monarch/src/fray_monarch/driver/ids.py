"""The ids one context hands out: objects, actors, groups (each led by the context's key, so that a ref's
controller is found from its id: objects.owner_key) and worker processes."""

from __future__ import annotations

import itertools

__all__ = ["Ids"]


class Ids:
    """One counter for every id of a context (next() on it is atomic under the GIL: no lock needed)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._next = itertools.count()

    def object(self) -> str:
        return f"{self.key}-{next(self._next)}"

    def actor(self) -> str:
        return f"{self.key}-a{next(self._next)}"

    def group(self) -> str:
        return f"{self.key}-g{next(self._next)}"

    def proc(self) -> str:
        return f"p{next(self._next)}"
