"""The rows of the live page's aggregates (fray.dashboard.model): one per function, actor and transfer path, the
work in flight, and the totals. `row()` is what a poll's JSON carries (app.js reads the fields by position)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Actor", "Function", "Totals", "Transfers"]


@dataclass(slots=True)
class Function:
    """One task function or actor method (`Class.method`): its work by state and the time its runs took."""

    name: str
    kind: str  # "task" | "call"
    index: int  # its colour on the page
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    retries: int = 0
    busy_ns: int = 0  # summed run time of the finished runs
    changed: int = 0

    def row(self) -> list[Any]:
        return [
            self.index,
            self.name,
            self.kind,
            self.queued,
            self.running,
            self.done,
            self.failed,
            self.cancelled,
            self.retries,
            round(self.busy_ns / 1e6, 3),
        ]


@dataclass(slots=True)
class Actor:
    key: str
    name: str
    state: str = "alive"
    restarts: int = 0
    calls: int = 0
    reason: str = ""
    changed: int = 0

    def row(self) -> list[Any]:
        return [self.key, self.name, self.state, self.restarts, self.calls, self.reason]


@dataclass(slots=True)
class Transfers:
    path: str
    count: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    changed: int = 0

    def row(self) -> list[Any]:
        return [self.path, self.count, self.nbytes, round(self.seconds, 6)]


@dataclass(slots=True)
class Totals:
    events: int = 0
    lost: int = 0  # events the store no longer held when read (it overflowed between two reads)
    bytes: int = 0
    transfers: int = 0
    errors: int = 0
    deaths: int = 0
    restarts: int = 0
    workers_died: int = 0
    extra: dict[str, int] = field(default_factory=dict)
