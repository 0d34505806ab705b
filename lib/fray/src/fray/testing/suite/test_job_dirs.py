"""A named job's directory (fray.job_dir) persists across its attempts and runs, and fray.resuming() says when a
job picks up where a previous attempt or run left off."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from fray import JobStatus
from fray.cluster_context import ClusterContext
from fray.testing import job_workloads as w

TIMEOUT = 120


def test_a_named_job_resumes_from_its_directory_across_attempts_and_runs(
    fray_cluster: ClusterContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fray_cluster, "job_dirs", str(tmp_path))  # as the job_dirs spec option sets it
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    first = fray_cluster.create_job(w.checkpointed_steps, args=(10, 4), name=name, max_retries=1).wait(TIMEOUT)
    assert [a.outcome for a in first.attempts] == ["failed", "succeeded"]
    assert first.result["dir"] == str(tmp_path / name) and first.result["mode"] == 0o700
    assert (first.result["resuming"], first.result["started_at"]) == (True, 4)  # attempt 2 went on from step 4
    second = fray_cluster.create_job(w.checkpointed_steps, args=(12, 4), name=name).wait(TIMEOUT)
    assert second.id == f"{name}.2" and second.result["attempt"] == 1
    assert (second.result["resuming"], second.result["started_at"]) == (True, 10)  # the last run's checkpoint


def test_a_named_jobs_directory_defaults_to_its_hosts_state_directory(fray_cluster: ClusterContext) -> None:
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    info = fray_cluster.create_job(w.checkpointed_steps, args=(3, -1), name=name).wait(TIMEOUT)
    try:
        assert info.status is JobStatus.SUCCEEDED
        assert info.result["dir"].endswith(f"/job-dirs/{name}") and info.result["mode"] == 0o700
        assert (info.result["resuming"], info.result["started_at"]) == (False, 0)  # a new name starts afresh
    finally:
        shutil.rmtree(info.result["dir"], ignore_errors=True)


def test_an_unnamed_job_has_no_directory(fray_cluster: ClusterContext) -> None:
    info = fray_cluster.create_job(w.checkpointed_steps, args=(3, -1)).wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED and info.error is not None
    assert info.error.type == "FrayError" and "name=NAME" in info.error.message
