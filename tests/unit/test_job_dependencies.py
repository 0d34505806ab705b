"""Job dependencies (fray.jobs.dependencies) on a real in_memory cluster of its own: what the context's shutdown does
to a waiting job, a waiting run of a name is live, and what `fray job list` and the cluster's live page show of a
job that waits."""

from __future__ import annotations

import shlex
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import JobStatus
from fray.cli.jobs import job_table
from fray.dashboard.cluster import ClusterPage
from fray.errors import FrayError, JobExistsError
from fray.in_memory.cluster import InMemoryClusterContext

pytestmark = pytest.mark.timeout(120)

SLEEP = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)'"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[InMemoryClusterContext]:
    cluster = InMemoryClusterContext(state_dir=str(tmp_path / "state"))
    try:
        yield cluster
    finally:
        cluster.shutdown()


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fray-job-waits"]


def test_shutdown_ends_every_wait_and_its_watcher(tmp_path: Path) -> None:
    cluster = InMemoryClusterContext(state_dir=str(tmp_path / "state"))
    running = cluster.create_job(SLEEP)
    waiting = cluster.create_job("true", after=[running])
    assert waiting.status() is JobStatus.PENDING and _watchers()
    cluster.shutdown()
    info = waiting.info()
    assert info.status is JobStatus.STOPPED and info.start_time is None
    assert "shut down while it waited" in info.message
    assert waiting.wait(1, raise_on_failure=False).status is JobStatus.STOPPED
    assert not [t for t in _watchers() if t.is_alive()]
    with pytest.raises(FrayError, match="shut down"):
        cluster.create_job("true", after=[running])


def test_a_waiting_run_of_a_name_is_live(cluster: InMemoryClusterContext) -> None:
    running = cluster.create_job(SLEEP)
    first = cluster.create_job("true", name="after-live", after=[running])
    assert cluster.create_job("true", name="after-live") == first  # if_exists="return": the waiting run
    with pytest.raises(JobExistsError, match="PENDING"):
        cluster.create_job("true", name="after-live", if_exists="refuse")
    second = cluster.create_job("true", name="after-live", if_exists="replace")  # stops the waiting run
    assert (first.id, second.id) == ("after-live.1", "after-live.2")
    assert first.status() is JobStatus.STOPPED and second.wait(60).status is JobStatus.SUCCEEDED
    with pytest.raises(JobExistsError):
        cluster.create_job("true", job_id=second.id, after=[running])
    running.stop()


def test_fray_job_list_and_the_live_page_show_what_a_job_waits_for(cluster: InMemoryClusterContext) -> None:
    running = cluster.create_job(SLEEP, name="prep")
    waiting = cluster.create_job("true", name="train", after=["prep"])
    table = job_table(cluster.list_jobs())
    assert "WAITS FOR" in table[0]
    row = next(line for line in table if line.startswith("train.1"))
    assert "PENDING" in row and "prep.1" in row
    shown = {job["id"]: job for job in ClusterPage(cluster).state(0)["jobs"]}
    assert shown[waiting.id]["waits_for"] == [running.id] and shown[waiting.id]["state"] == "PENDING"
    assert shown[running.id]["waits_for"] == []
    running.stop()
    assert waiting.wait(30, raise_on_failure=False).status is JobStatus.FAILED
    assert "WAITS FOR" not in job_table(cluster.list_jobs())[0]  # nothing waits: the column is gone
