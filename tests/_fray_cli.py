"""Shared by the tests of the `fray` command (tests/test_cli_jobs.py, tests/test_cli_job_shapes.py): the real
entry point run in subprocesses, each test with a state directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from fray.jobs.detached import DetachedJobs

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


def race_one_name(env: dict[str, str], backend: list[str], name: str, each: int = 5) -> set[str]:
    """4 processes at once, each submitting `name` `each` times (--no-wait): the ids they were given. (The issue's
    20 from 4 on in_memory; 8 on Ray and monarch, whose `fray` commands take seconds each to reach the cluster.)"""
    script = (
        "import subprocess, sys\n"
        f"for _ in range({each}):\n"
        "    done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
        "    print(done.stdout.strip() if done.returncode == 0 else 'ERROR ' + done.stderr, flush=True)\n"
    )
    argv = [sys.executable, "-c", script, FRAY, "job", "submit", *backend, "--no-wait", "--name", name, "--",
            "sleep", "60"]  # fmt: skip

    def one(_: int) -> list[str]:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300).stdout.splitlines()

    with ThreadPoolExecutor(4) as pool:
        ids = [line for lines in pool.map(one, range(4)) for line in lines]
    assert len(ids) == 4 * each and not [i for i in ids if i.startswith("ERROR")], ids
    return set(ids)
