"""Retry in place (fray.jobs.retry) where the job's submission is not kept: a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

import fray
from fray.errors import FrayError


def test_a_job_whose_submission_is_not_kept_here_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """retry_job needs what the job was submitted with, which its submitter's state directory keeps."""
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "here"))
    with fray.cluster("in_memory") as cluster:
        job = cluster.create_job("true", name="kept")
        job.wait(60)
        monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "elsewhere"))  # (another host's or user's)
        with pytest.raises(FrayError, match="cannot be retried from here"):
            job.retry()
        monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "here"))
        assert job.retry().wait(60).id == "kept.2"
