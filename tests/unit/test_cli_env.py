"""A job's environment variables without their values in `fray`'s own arguments (issue 29, item 7): a process's
argv is readable by every user of the machine (/proc/PID/cmdline, ps) while it runs, so `--env K=V` showed V to
them for as long as `fray job submit` waited. `--env K` takes the value from fray's environment, `--env-file` from a
file; K=V still works, with a warning."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

NOBODY = 65534
# The job prints its token, then runs until the test has looked at fray's arguments (the gate file), 60 s at most.
JOB = (
    "import os, sys, time\nprint(os.environ['JOB_TOKEN'], flush=True)\nend = time.time() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < end:\n    time.sleep(0.02)\n"
)


def _cmdline_as_another_user(pid: int) -> str:
    """What another user sees of process `pid`'s arguments (as nobody where this runs as root)."""
    read = ["cat", f"/proc/{pid}/cmdline"]
    if os.getuid() == 0:
        read = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *read]
    done = subprocess.run(read, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.replace(b"\0", b" ").decode()


def _run_and_look(env_args: list[str], tmp_path: Path, secret: str, exported: str | None = None) -> tuple[str, str]:
    """`fray run` with these --env arguments (and JOB_TOKEN=`exported`, default `secret`, in its environment):
    check that its job printed `secret`; what another user saw of fray's argv while the job ran, and its stderr."""
    env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state"), "JOB_TOKEN": exported or secret}
    argv = [sys.executable, "-m", "fray.cli", "run", "--backend", "in_memory", *env_args, "--"]
    gate = tmp_path / "looked"
    fray = subprocess.Popen(
        [*argv, sys.executable, "-c", JOB, str(gate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert fray.stdout is not None
        printed = fray.stdout.readline().strip()  # the job runs now, and until the gate opens
        seen = _cmdline_as_another_user(fray.pid) if printed else ""
        gate.touch()
        _, errors = fray.communicate(timeout=120)
    finally:
        fray.kill()
        fray.wait(timeout=30)
    assert printed == secret, errors
    assert fray.returncode == 0, errors
    assert "fray.cli" in seen  # it was readable: what is not in it was not hidden by chance
    return seen, errors


def test_a_value_passed_by_name_reaches_the_job_but_not_the_arguments_others_see(tmp_path: Path) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    seen, errors = _run_and_look(["--env", "JOB_TOKEN"], tmp_path, secret)
    assert secret not in seen and "warning" not in errors


def test_a_value_from_an_env_file_reaches_the_job(tmp_path: Path) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    env_file = tmp_path / "job.env"
    env_file.write_text(f"# the job's token\n\nJOB_TOKEN={secret}\n")
    seen, _ = _run_and_look(["--env-file", str(env_file)], tmp_path, secret, exported="not-this-one")
    assert secret not in seen


def test_a_value_in_the_arguments_is_seen_by_others_and_warned_about(tmp_path: Path) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    seen, errors = _run_and_look(["--env", f"JOB_TOKEN={secret}"], tmp_path, secret)
    assert secret in seen  # what the warning is about
    assert "every user of this machine can read" in errors and "--env JOB_TOKEN" in errors, errors


@pytest.mark.parametrize(
    "args, said",
    [
        (["--env", "FRAY_TEST_UNSET_VARIABLE"], "is not set in this environment"),
        (["--env", "=x"], "--env takes K"),
        (["--env-file", "/nonexistent/job.env"], "--env-file /nonexistent/job.env"),
    ],
)
def test_a_bad_env_option_is_refused_naming_it(args: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fray.cli", "run", "--backend", "in_memory", *args, "--", "true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr
