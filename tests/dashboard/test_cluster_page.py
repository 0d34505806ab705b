"""A cluster's live page (fray.dashboard.cluster) on a real in_memory cluster: what it says of a job that succeeded,
one that failed with exit code 3, one that runs (with its own live page) and is then stopped; how often it reads
the cluster; and `ctx.dashboard()`'s page saying where the engine's own page is."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cluster_jobs import Jobs, submit_jobs

import fray
from fray.dashboard.cluster import LINK_EVERY_S, READ_EVERY_S, ClusterPage
from fray.dashboard.job_page import ENGINE_NOTES, JobPage
from fray.in_memory.cluster import InMemoryClusterContext
from fray.jobs.events import job_events
from fray.telemetry import timeline
from fray.types import JobInfo

pytestmark = pytest.mark.timeout(180)


class CountingCluster(InMemoryClusterContext):
    """The in_memory cluster, counting what the page asks of it."""

    def __init__(self, state_dir: str) -> None:
        super().__init__(state_dir=state_dir)
        self.listed = 0
        self.logs_read: dict[str, int] = {}

    def list_jobs(self) -> list[JobInfo]:
        self.listed += 1
        return super().list_jobs()

    def get_job_logs(self, job_id: str, tail: int | None = None) -> str:
        self.logs_read[job_id] = self.logs_read.get(job_id, 0) + 1
        return super().get_job_logs(job_id, tail)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CountingCluster, Jobs]]:
    where = tmp_path_factory.mktemp("jobs")
    cluster = CountingCluster(str(where / "state"))
    try:
        yield cluster, submit_jobs(cluster, where)
    finally:
        cluster.shutdown()


def _by_id(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["id"]: job for job in state["jobs"]}


def test_the_page_shows_each_jobs_state_exit_code_message_attempts_and_the_running_ones_live_page(
    cluster: tuple[CountingCluster, Jobs],
) -> None:
    ctx, jobs = cluster
    state = ClusterPage(ctx).state(0)
    assert state["backend"] == "in_memory" and state["where"] == ctx.describe()
    assert [node["node"] for node in state["nodes"]] == [node["node"] for node in ctx.node_status()]
    assert state["counts"] == {"SUCCEEDED": 1, "FAILED": 1, "RUNNING": 1} and state["total"] == 3
    assert [job["id"] for job in state["jobs"]] == [jobs.running, jobs.failed, jobs.succeeded]  # newest first
    shown = _by_id(state)
    ok, bad, running = shown[jobs.succeeded], shown[jobs.failed], shown[jobs.running]
    assert (ok["state"], ok["exit_code"], ok["live"]) == ("SUCCEEDED", 0, None)
    assert (bad["state"], bad["exit_code"], bad["message"]) == ("FAILED", 3, "exited with code 3")
    assert [(a["number"], a["status"], a["exit_code"]) for a in bad["attempts"]] == [(1, "FAILED", 3)]
    assert bad["started"] <= bad["attempts"][0]["end"] == bad["ended"]
    assert (running["state"], running["name"], running["ended"]) == ("RUNNING", "trainer", None)
    assert running["attempts"][0]["end"] is None
    assert running["live"] == {"url": jobs.running_url, "host": running["live"]["host"], "here": True}


def test_the_cluster_is_read_at_most_once_a_second_whatever_the_number_of_tabs(
    cluster: tuple[CountingCluster, Jobs],
) -> None:
    ctx, jobs = cluster
    page = ClusterPage(ctx)
    listed, logs = ctx.listed, dict(ctx.logs_read)
    began = time.monotonic()
    tabs = [threading.Thread(target=lambda: [page.state(0) for _ in range(50)]) for _ in range(4)]
    for tab in tabs:
        tab.start()
    for tab in tabs:
        tab.join(timeout=60)
    elapsed = time.monotonic() - began
    assert not any(tab.is_alive() for tab in tabs)
    assert 1 <= ctx.listed - listed <= 1 + elapsed / READ_EVERY_S  # 200 polls
    # the running job's page, found at the first read, is kept: its log is read once, never again
    assert ctx.logs_read.get(jobs.running, 0) - logs.get(jobs.running, 0) == 1
    assert all(ctx.logs_read.get(job, 0) == logs.get(job, 0) for job in (jobs.succeeded, jobs.failed))
    assert LINK_EVERY_S >= READ_EVERY_S


def test_the_timeline_validates_and_a_stopped_job_ends_stopped_without_its_page(
    cluster: tuple[CountingCluster, Jobs], tmp_path: Path
) -> None:
    ctx, jobs = cluster
    page = ClusterPage(ctx)
    path = page.write_timeline(str(tmp_path))
    trace = json.loads(path.read_text())
    assert timeline.validate(trace) == []
    spans = {e["args"]["key"]: e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert spans == {jobs.succeeded: "job,SUCCEEDED", jobs.failed: "job,FAILED", jobs.running: "job,RUNNING"}
    ctx.stop_job(jobs.running)
    stopped = _by_id(ClusterPage(ctx).state(0))[jobs.running]
    assert (stopped["state"], stopped["live"]) == ("STOPPED", None)
    assert stopped["ended"] is not None and stopped["attempts"][0]["status"] == "STOPPED"
    after, _ = timeline.build([job_events(ctx.list_jobs())])
    assert timeline.validate(after) == []
    assert {e["cat"] for e in after["traceEvents"] if e["ph"] == "X" and e["args"]["key"] == jobs.running} == {
        "job,STOPPED"
    }


def test_the_job_page_gives_the_engines_links_and_its_note() -> None:
    with fray.init("in_memory") as ctx:
        state = JobPage(ctx).state(0)
        assert (state["links"], state["note"]) == ({}, "")
    assert "asks for no credentials" in ENGINE_NOTES["monarch"]
