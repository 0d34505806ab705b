"""A cluster's live page (`cluster.dashboard()`, `fray dashboard`): its jobs, their states and attempts, its nodes,
the engine's own pages, and a link to each running job's own live page where its driver announced one.

It reads the cluster only while a page polls, and at most every `READ_EVERY_S` whichever tabs ask: `list_jobs()`,
`node_status()` and, for a running job whose page is not known yet, the end of its log (at most every
`LINK_EVERY_S` a job; a page once found is kept while the job runs). Idle, it costs nothing.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fray.dashboard import ANNOUNCED
from fray.dashboard.job_page import ENGINE_NOTES
from fray.dashboard.server import static_files
from fray.jobs.events import attempts_of, job_events
from fray.telemetry import timeline
from fray.types import JobInfo, JobStatus

__all__ = ["ClusterPage", "ClusterSource", "JobRow"]

READ_EVERY_S = 1.0  # the cluster is read at most this often, however many pages poll
LINK_EVERY_S = 5.0  # a running job's log end is read for its page's address at most this often
LOG_LINES = 1000  # the lines read from the end of a job's log for that address
MAX_JOBS = 1000  # the newest jobs sent to the page (the counts are of all of them)


class ClusterSource(Protocol):
    """What the page reads of a cluster context (fray.cluster_context.ClusterContext)."""

    @property
    def backend(self) -> str: ...

    def list_jobs(self) -> list[JobInfo]: ...

    def get_job_logs(self, job_id: str, tail: int | None = None) -> str: ...

    def node_status(self) -> list[dict[str, Any]]: ...

    def describe(self) -> dict[str, str]: ...

    def engine_links(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a job, times in ms since the epoch (end None: it runs)."""

    number: int
    status: str
    start: float | None
    end: float | None
    exit_code: int | None
    message: str


@dataclass(frozen=True)
class LivePage:
    """A running job's own live page, as its driver announced it in its log."""

    url: str
    host: str
    here: bool  # on this machine (else reached through an SSH tunnel to `host`)


@dataclass(frozen=True)
class JobRow:
    """One job as the page shows it (times in ms since the epoch)."""

    id: str
    name: str
    state: str
    entrypoint: str
    submitted: float | None
    started: float | None
    ended: float | None
    attempts: list[AttemptRow]
    exit_code: int | None
    message: str
    error: str
    live: LivePage | None
    waits_for: list[str]  # the jobs it waits for, or waited for and ended without running (create_job(after=...))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def job_row(info: JobInfo, live: LivePage | None) -> JobRow:
    attempts = [
        AttemptRow(a.number, a.status.value, _ms(a.start_time), _ms(a.end_time), a.exit_code, a.message)
        for a in attempts_of(info)
    ]
    error = f"{info.error.type}: {info.error.message}" if info.error is not None else ""
    return JobRow(
        info.id,
        info.name or "",
        info.status.value,
        info.entrypoint,
        _ms(info.submission_time),
        _ms(info.start_time),
        _ms(info.end_time),
        attempts,
        info.exit_code,
        info.message,
        error,
        live,
        list(info.waiting_for),
    )


@dataclass
class _Announced:
    """What the end of a running job's log said, and when it was read."""

    page: LivePage | None
    read_at: float


class ClusterPage:
    """The cluster page's `PageSource` (fray.dashboard.server). Each answer is the whole picture (a cluster has
    few jobs next to a job's events; the newest `MAX_JOBS` are sent): `since` is not needed."""

    def __init__(self, ctx: ClusterSource) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._snapshot: dict[str, Any] | None = None
        self._links: dict[str, str] | None = None  # the engine's pages: asked once (they do not move)
        self._announced: dict[str, _Announced] = {}  # running job id -> its live page, if found
        self._host = socket.gethostname()
        self._files = static_files("cluster.html", "cluster.js")

    @property
    def files(self) -> Mapping[str, tuple[bytes, str]]:
        return self._files

    def state(self, since: int) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if self._snapshot is None or now - self._read_at >= READ_EVERY_S:
                self._snapshot, self._read_at = self._read(now), now
            return {**self._snapshot, "now": time.time() * 1000.0}

    def _read(self, now: float) -> dict[str, Any]:
        ctx = self._ctx
        jobs = ctx.list_jobs()
        if self._links is None:
            self._links = dict(ctx.engine_links())
        running = {info.id for info in jobs if info.status is JobStatus.RUNNING}
        for gone in set(self._announced) - running:
            del self._announced[gone]
        newest = sorted(jobs, key=lambda info: info.submission_time or 0.0, reverse=True)[:MAX_JOBS]
        rows = [job_row(info, self._live(info.id, now) if info.id in running else None) for info in newest]
        return {
            "full": True,
            "cursor": 0,
            "backend": ctx.backend,
            "where": ctx.describe(),
            "nodes": ctx.node_status(),
            "links": self._links,
            "note": ENGINE_NOTES.get(ctx.backend, ""),
            "counts": dict(Counter(info.status.value for info in jobs)),
            "total": len(jobs),
            "jobs": [dataclasses.asdict(row) for row in rows],
        }

    def _live(self, job_id: str, now: float) -> LivePage | None:
        """The running job's live page from the end of its log (read again only after LINK_EVERY_S)."""
        known = self._announced.get(job_id)
        if known is not None and (known.page is not None or now - known.read_at < LINK_EVERY_S):
            return known.page
        try:
            found = list(ANNOUNCED.finditer(self._ctx.get_job_logs(job_id, tail=LOG_LINES)))
        except Exception:  # it ended and was deleted between the listing and now: no page
            found = []
        page = None
        if found:
            host = found[-1].group("host")
            page = LivePage(found[-1].group("url"), host, host == self._host)
        self._announced[job_id] = _Announced(page, now)
        return page

    def write_timeline(self, directory: str) -> Path:
        path = Path(directory) / "timeline.json"
        timeline.write(path, [job_events(self._ctx.list_jobs())])
        return path
