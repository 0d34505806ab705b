"""Owners join their threads: an in_memory JobContext, and a ClusterContext that ran one job, leave no thread
fray named (`fray-...`) alive after shutdown, but the process-wide ones fray.testing.threads.PROCESS_WIDE allows
by name. The same case runs on every backend in the conformance suite (suite/test_thread_owners.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fray
from fray import JobStatus
from fray.testing import job_workloads as w
from fray.testing.threads import exercise, fray_threads, leftover_threads


def test_an_in_memory_context_leaves_no_thread_of_its_own() -> None:
    before = fray_threads()
    ctx = fray.init("in_memory")
    try:
        exercise(ctx)
    finally:
        fray.shutdown()
    assert leftover_threads(before) == []


def test_a_cluster_context_with_one_job_leaves_no_thread_of_its_own() -> None:
    before = fray_threads()
    cluster = fray.cluster("in_memory")
    try:
        assert cluster.create_job(w.add, args=(2,)).wait(120).status is JobStatus.SUCCEEDED
    finally:
        cluster.shutdown()
    assert leftover_threads(before) == []


def test_a_cluster_context_shut_down_under_a_running_and_a_waiting_job_leaves_no_thread_of_its_own() -> None:
    before = fray_threads()
    cluster = fray.cluster("in_memory")
    try:
        running = cluster.create_job("sleep 60", stop_grace=2.0)
        cluster.create_job("true", after=[running])  # held here (fray-job-waits) until the first succeeds
    finally:
        cluster.shutdown()
    assert leftover_threads(before) == []


def test_a_cluster_contexts_detached_job_leaves_no_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))
    before = fray_threads()
    cluster = fray.cluster("in_memory")
    try:
        job = cluster.create_job("sleep 60", detached=True)
        try:
            cluster.shutdown()
            assert leftover_threads(before) == []
        finally:  # the detached job outlives its context: stopped from another
            other = fray.cluster("in_memory")
            other.stop_job(job)
            other.shutdown()
    finally:
        cluster.shutdown()
