"""Shared by the tests of the `fray` command (tests/test_cli_jobs.py, tests/test_cli_job_shapes.py): the real
entry point run in subprocesses, each test with a state directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fray.detached import DetachedJobs

FRAY = str(Path(sys.executable).parent / "fray")


def cli_env(state: Path) -> dict[str, str]:
    """This environment for a `fray` command with `state` as its state directory and no backend chosen."""
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_BACKEND", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["FRAY_STATE_DIR"] = str(state)
    return env


@contextmanager
def state_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """cli_env of a state directory under tmp_path; afterwards no detached job of it is left running (a failed
    test must not leave one)."""
    env = cli_env(tmp_path / "state")
    yield env
    jobs = DetachedJobs(tmp_path / "state" / "jobs")
    for info in jobs.list():
        if not info.status.is_terminal:
            jobs.stop(info.id)


def run_fray(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FRAY, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
