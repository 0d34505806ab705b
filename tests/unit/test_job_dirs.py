"""fray.job_dir() and fray.resuming() in a process, and the job_dirs spec option: private directories only, and
clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fray
from fray.errors import FrayError
from fray.jobs.dirs import NAME_VAR, RESUMING_VAR, ROOT_VAR


def test_the_job_dirs_option_is_any_backends_and_must_be_absolute(tmp_path: Path) -> None:
    with fray.cluster(f"in_memory?job_dirs={tmp_path}") as cluster:
        assert cluster.job_dirs == str(tmp_path)
    with pytest.raises(ValueError, match="absolute path"):
        fray.cluster("in_memory?job_dirs=relative/dir")


def test_a_job_dir_is_private_and_never_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOT_VAR, str(tmp_path))
    monkeypatch.setenv(NAME_VAR, "train")
    (tmp_path / "train").mkdir(mode=0o755)
    assert fray.job_dir() == tmp_path / "train"
    assert os.stat(tmp_path / "train").st_mode & 0o777 == 0o700  # a looser mode of ours is made private
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "planted").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv(NAME_VAR, "planted")
    with pytest.raises(FrayError, match="not a directory of this user's"):
        fray.job_dir()
    monkeypatch.setenv(ROOT_VAR, str(tmp_path / "missing"))
    with pytest.raises(FrayError, match="not a directory on this host"):
        fray.job_dir()


def test_resuming_is_a_later_attempt_or_a_directory_left_with_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROOT_VAR, str(tmp_path))
    monkeypatch.setenv(NAME_VAR, "train")
    monkeypatch.delenv(RESUMING_VAR, raising=False)
    monkeypatch.setenv("FRAY_JOB_ATTEMPT", "1")
    assert not fray.resuming()
    (fray.job_dir() / "checkpoint.pt").write_bytes(b"x")
    assert fray.resuming()
    monkeypatch.setenv(RESUMING_VAR, "0")  # the supervisor's look, before the attempt's ranks started, wins
    assert not fray.resuming()
    monkeypatch.delenv(RESUMING_VAR)
    monkeypatch.delenv(NAME_VAR)
    monkeypatch.setenv("FRAY_JOB_ATTEMPT", "2")
    assert fray.resuming()  # an unnamed job resumes only as a later attempt
    monkeypatch.setenv("FRAY_JOB_ATTEMPT", "1")
    assert not fray.resuming()
