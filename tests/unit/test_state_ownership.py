"""The state directory decides which processes fray signals, so only this user's private directories and files are
trusted (issue 29, item 7). Before, a state directory another user made first (a FRAY_STATE_DIR under /tmp) was
used as it was: a `state.json` planted there, naming a live process of this user's by its real identity (pid,
start time, boot id: all readable in /proc), made `fray job stop` kill that process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fray.errors import FrayError
from fray.host.procfs import Identity
from fray.host.state_dir import read_cluster, read_json, state_subdir
from fray.jobs.detached import DetachedJobs

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="planting files as another user needs root (setpriv)")

# As another user: a state directory with one detached job whose state names the victim process as its leader.
PLANT = """
import json, os, sys
state, leader = sys.argv[1], json.loads(sys.argv[2])
job = os.path.join(state, "jobs", "job-planted")
os.makedirs(job, 0o755)
os.chmod(state, 0o755)
os.chmod(os.path.join(state, "jobs"), 0o755)
with open(os.path.join(job, "job.json"), "w") as f:
    json.dump({"id": "job-planted", "entrypoint": "true", "text": "true", "submission_time": 0}, f)
with open(os.path.join(job, "state.json"), "w") as f:
    json.dump({"status": "RUNNING", "leader": leader, "runner": leader}, f)
"""


def _as_nobody(*argv: str) -> None:
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@as_root
def test_fray_job_stop_never_trusts_a_state_directory_another_user_made() -> None:
    base = Path(tempfile.mkdtemp(prefix="fray-test-state-", dir="/tmp"))  # /tmp itself: others reach it
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a process of ours, leading its group
    try:
        base.chmod(0o1777)
        state = base / "state"
        leader = Identity.of(victim.pid)
        assert leader is not None
        _as_nobody("-c", PLANT, str(state), json.dumps(leader.record()))
        env = {**os.environ, "FRAY_STATE_DIR": str(state)}
        stop = subprocess.run(
            [sys.executable, "-m", "fray.cli", "job", "stop", "job-planted"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert victim.poll() is None, f"a planted state.json made `fray job stop` kill pid {victim.pid}"
        assert stop.returncode != 0
        assert str(state) in stop.stderr and "not a directory of this user's" in stop.stderr, stop.stderr
    finally:
        victim.kill()
        victim.wait(timeout=30)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


@as_root
def test_a_file_of_another_users_in_a_directory_of_ours_is_not_read(tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="fray-test-state-", dir="/tmp"))
    try:
        shared.chmod(0o1777)  # as a loose directory of ours would be: others could put files in it
        _as_nobody("-c", "import sys; open(sys.argv[1], 'w').write('{\"status\": \"RUNNING\"}')", str(shared / "x"))
        with pytest.raises(FrayError, match="belongs to another user"):
            read_json(shared / "x")
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(shared)], check=False)


def test_a_symlinked_state_directory_or_job_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "link"))
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(FrayError, match="symlink"):
        state_subdir("jobs")
    with pytest.raises(FrayError, match="symlink"):
        read_cluster("ray")
    with pytest.raises(FrayError, match="symlink"):
        DetachedJobs().list()
    jobs = DetachedJobs(tmp_path / "jobs")
    jobs.root.mkdir(exist_ok=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "job.json").write_text("{}")
    (jobs.root / "job-linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FrayError, match="symlink"):
        jobs.info("job-linked")


def test_a_state_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "target.json").write_text('{"status": "RUNNING"}')
    (tmp_path / "state.json").symlink_to(tmp_path / "target.json")
    assert read_json(tmp_path / "target.json") == {"status": "RUNNING"}
    assert read_json(tmp_path / "state.json") is None
