"""A job's live page (`ctx.dashboard()`): what its server shows, read from the job's events from a cursor on
(fray.dashboard.model), at most every `REFRESH_S` whichever tabs ask."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from fray.dashboard.model import Aggregates
from fray.dashboard.server import static_files
from fray.telemetry.event_store import EventStore, RowPage
from fray.telemetry.timeline import TimelineSummary

__all__ = ["ENGINE_NOTES", "JobPage", "JobSource"]

REFRESH_S = 0.25  # the event store is read at most this often, however many pages poll
PAGE = 20_000  # events taken from the store per read

# Why an engine's own page is not linked, by backend: said on the page, so that nobody looks for it. (Monarch's
# dashboard server binds "::" by default and asks for no credentials: monarch/monarch_dashboard/server/app.py.)
ENGINE_NOTES = {
    "monarch": "Monarch's own dashboard is not started: it listens on every interface by default and asks for no "
    "credentials.",
}


class JobSource(Protocol):
    """What the page reads of a job context (fray.context.JobContext)."""

    @property
    def backend(self) -> str: ...

    def events(self) -> EventStore: ...

    def timeline(self, path: str) -> TimelineSummary: ...

    def _engine_links(self) -> dict[str, str]: ...


class JobPage:
    """The job page's `PageSource` (fray.dashboard.server)."""

    def __init__(self, ctx: JobSource, recording_note: str = "") -> None:
        self._ctx = ctx
        self._recording_note = recording_note  # (fray.telemetry.events.record_for_a_page)
        self._lock = threading.Lock()
        self._model = Aggregates()
        self._read_at = 0.0
        self._store: EventStore | None = None
        self._links: dict[str, str] | None = None  # the engine's pages: asked once (they do not move)
        self._files = static_files("index.html", "app.js")

    @property
    def files(self) -> Mapping[str, tuple[bytes, str]]:
        return self._files

    def state(self, since: int) -> dict[str, Any]:
        """What changed after cursor `since`, read from the job's events as far as they go now."""
        with self._lock:
            now = time.monotonic()
            if self._store is None or now - self._read_at >= REFRESH_S:
                self._store, self._read_at = self._ctx.events(), now
            if self._links is None:
                self._links = dict(self._ctx._engine_links())
            store = self._store
            model = self._model
            while True:
                page = store.rows(model.cursor, PAGE)
                model.totals.lost += page.lost
                if not page.rows:
                    break
                model.add(page, store.processes)
            if not model.process_rows and store.processes:
                model.add(RowPage(0, [], [], 0, 0), store.processes)
            answer = model.delta(since)
            answer["backend"] = self._ctx.backend
            answer["dropped"] = store.dropped + model.totals.lost
            answer["now"] = time.time_ns() / 1e6
            answer["links"] = self._links
            answer["note"] = " ".join(filter(None, (self._recording_note, ENGINE_NOTES.get(self._ctx.backend, ""))))
            return answer

    def write_timeline(self, directory: str) -> Path:
        path = Path(directory) / "timeline.json"
        self._ctx.timeline(str(path))
        return path
