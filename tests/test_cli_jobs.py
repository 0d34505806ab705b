"""The `fray` command's job commands end to end: the real `fray` entry point in subprocesses, each test with a
state directory of its own. Ray: one cluster for the whole module (`fray cluster start` / `fray cluster stop`),
checked to leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fray_cli import FRAY, race_one_name, state_env
from _fray_cli import cli_env as _env
from _fray_cli import run_fray as _fray

import fray
from fray.host import procfs
from fray.host.procfs import group_members

_running: list[subprocess.Popen[str]] = []  # `fray` commands a test started: ended after it, whatever happened


@pytest.fixture(autouse=True)
def _end_what_a_test_started() -> Iterator[None]:
    yield
    while _running:
        proc = _running.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    with state_env(tmp_path) as env:
        yield env


def _start(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([FRAY, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _running.append(proc)
    return proc


def _json(done: subprocess.CompletedProcess[str]) -> object:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _marked(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (unique to one test)."""
    found = []
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        argv = procfs.cmdline(pid)
        if argv is not None and marker in " ".join(argv) and procfs.state(pid) not in (None, "Z"):
            found.append(pid)
    return found


def _sleeping(marker: str) -> list[int]:
    """Live `sleep MARKER` processes (a job's: the duration is unique to one test)."""
    found = []
    for pid in procfs.pids():
        argv = procfs.cmdline(pid)
        if argv is not None and argv[:2] == ["sleep", marker] and procfs.state(pid) not in (None, "Z"):
            found.append(pid)
    return found


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def _project(tmp_path: Path, code: str, name: str = "job.py") -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / name).write_text(code)
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    return project


EXIT_3 = "print('hello from the job', flush=True)\nraise SystemExit(3)\n"


# ---------------------------------------------------------------------------------------------- in_memory
def test_version_and_doctor(env: dict[str, str]) -> None:
    version = _fray(env, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"fray {fray.__version__}"
    doctor = _fray(env, "doctor", "--no-probes")
    assert doctor.returncode == 0, doctor.stderr
    assert "packages" in doctor.stdout and "fray-core" in doctor.stdout


def test_exit_code_working_dir_and_signals(env: dict[str, str], tmp_path: Path) -> None:
    project = _project(tmp_path, EXIT_3)
    done = _fray(
        env, "job", "submit", "--working-dir", "../project", "--", "python", "job.py", cwd=tmp_path / "elsewhere"
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "hello from the job\n"
    assert "exited with code 3" in done.stderr
    ran = _fray(
        env, "run", "--env", "FRAY_CLI_VAR=seen", "--", "sh", "-c", "echo $FRAY_CLI_VAR; python job.py", cwd=project
    )
    assert ran.returncode == 3 and ran.stdout == "seen\nhello from the job\n", ran.stderr  # default: where it runs
    killed = _fray(env, "run", "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 128 + 9, killed.stderr
    assert _fray(env, "run", "--").returncode == 2
    assert _fray(env, "job", "submit", "--working-dir", str(tmp_path / "missing"), "--", "true").returncode == 1


def test_no_wait_follow_status_list_stop_delete(env: dict[str, str], tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    code = (
        "import os, time\nprint('first', flush=True)\nend = time.time() + 60\n"
        f"while not os.path.exists({str(gate)!r}) and time.time() < end:\n    time.sleep(0.05)\nprint('second')\n"
    )
    submitted = _fray(env, "job", "submit", "--no-wait", "--", sys.executable, "-c", code)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    assert job and "fray job logs" in submitted.stderr
    follower = _start(env, "job", "logs", job, "--follow")  # another invocation follows the running job
    assert follower.stdout is not None
    assert follower.stdout.readline() == "first\n"
    assert _json(_fray(env, "job", "status", job, "--json"))["status"] == "RUNNING"  # type: ignore[index]
    gate.write_text("go")
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0 and out == "second\n", err
    status = _json(_fray(env, "job", "status", job, "--json"))
    assert status["status"] == "SUCCEEDED" and status["exit_code"] == 0  # type: ignore[index]
    assert _fray(env, "job", "logs", job).stdout == "first\nsecond\n"

    marker = f"{uuid.uuid4().int % 10**6 + 300}"
    sleeper = _fray(env, "job", "submit", "--no-wait", "--", "sleep", marker).stdout.strip()
    listed = {info["id"]: info["status"] for info in _json(_fray(env, "job", "list", "--json"))}  # type: ignore[attr-defined]
    assert listed == {job: "SUCCEEDED", sleeper: "RUNNING"}
    assert job in _fray(env, "job", "list").stdout
    overview = _json(_fray(env, "status", "--json"))
    assert overview["backend"] == "in_memory" and overview["nodes"][0]["total"]["CPU"] >= 1  # type: ignore[index]
    assert {info["id"] for info in overview["jobs"]} == {job, sleeper}  # type: ignore[index]
    assert "RUNNING" in _fray(env, "status").stdout
    stopped = _fray(env, "job", "stop", sleeper)
    assert stopped.returncode == 0 and "STOPPED" in stopped.stderr, stopped.stderr
    assert not _sleeping(marker)
    assert _json(_fray(env, "job", "status", sleeper, "--json"))["status"] == "STOPPED"  # type: ignore[index]
    shown = _fray(env, "job", "status", sleeper).stdout  # 128+15, as docs/cli.md says (was -15)
    assert "  exit code: 143 (ended by SIGTERM)\n" in shown, shown
    assert _fray(env, "job", "delete", sleeper).returncode == 0
    gone = _fray(env, "job", "status", sleeper)
    assert gone.returncode == 1 and "no job" in gone.stderr and "Traceback" not in gone.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_of_an_attached_submit_stops_the_job(env: dict[str, str], signum: int) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 300}"
    submit = _start(env, "job", "submit", "--", "sh", "-c", f"echo up; sleep {marker} & sleep {marker}; wait")
    assert submit.stdout is not None
    assert submit.stdout.readline() == "up\n"
    _wait_for(lambda: len(_sleeping(marker)) == 2, 10, "the job's processes")
    submit.send_signal(signum)
    _out, err = submit.communicate(timeout=30)
    assert submit.returncode == 128 + signum, err
    assert "Traceback" not in err and "stopping job" in err
    _wait_for(lambda: not _sleeping(marker), 10, "the job's processes to end")
    (info,) = _json(_fray(env, "job", "list", "--json"))  # type: ignore[misc]
    assert info["status"] == "STOPPED"


def test_on_interrupt_leave_leaves_the_job_running(env: dict[str, str]) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 300}"
    submit = _start(env, "job", "submit", "--on-interrupt", "leave", "--", "sh", "-c", f"echo up; sleep {marker}")
    assert submit.stdout is not None
    assert submit.stdout.readline() == "up\n"
    submit.send_signal(signal.SIGINT)
    _out, err = submit.communicate(timeout=30)
    assert submit.returncode == 130 and "Traceback" not in err, err
    (info,) = _json(_fray(env, "job", "list", "--json"))  # type: ignore[misc]
    assert f"fray job logs {info['id']} --follow" in err
    time.sleep(0.5)
    assert info["status"] == "RUNNING" and _sleeping(marker)
    assert _fray(env, "job", "stop", info["id"]).returncode == 0
    assert not _sleeping(marker)


def test_monarch_without_a_cluster_says_how_to_start_one(env: dict[str, str]) -> None:
    """Monarch keeps jobs across commands on a cluster `fray cluster start` started (tests/monarch/
    test_multihost.py); without one, each command says how to start it."""
    pytest.importorskip("fray_monarch")
    for args in (["job", "list"], ["job", "submit", "--no-wait"], ["status"]):
        done = (
            _fray(env, *args, "--backend", "monarch", "--", "true")
            if "submit" in args
            else _fray(env, *args, "--backend", "monarch")
        )
        assert done.returncode == 1 and "no monarch cluster to talk to" in done.stderr, (args, done.stderr)
        assert "fray cluster start --backend monarch" in done.stderr and "Traceback" not in done.stderr


SAYS_ITS_BACKEND = (
    "import fray\nctx = fray.init()\n"
    "print('the job runs on', ctx.backend, 'with', len(ctx.node_resources()), 'hosts')\nfray.shutdown()\n"
)


def test_monarch_jobs_run_on_monarch_by_fray_run_and_on_a_started_cluster(env: dict[str, str], tmp_path: Path) -> None:
    """A monarch job's bare fray.init() runs on monarch, on the cluster's hosts (here two host workers of this
    machine, job=process), not on the in_memory default: `fray run`, and `fray job submit` to the head `fray
    cluster start` started (issue 28: both printed in_memory)."""
    pytest.importorskip("fray_monarch")
    project = _project(tmp_path, SAYS_ITS_BACKEND)
    spec = "monarch?procs=1&job=process&hosts=2"
    ran = _fray(env, "run", "--backend", spec, "--", "python", "job.py", cwd=project, timeout=240)
    assert ran.returncode == 0 and "the job runs on monarch with 2 hosts" in ran.stdout, (ran.stdout, ran.stderr)
    started = _fray(env, "cluster", "start", "--backend", spec, timeout=240)
    assert started.returncode == 0, started.stderr
    try:
        done = _fray(env, "job", "submit", "--backend", "monarch", "--", "python", "job.py", cwd=project, timeout=240)
        assert done.returncode == 0 and "the job runs on monarch with 2 hosts" in done.stdout, (
            done.stdout,
            done.stderr,
        )
    finally:
        assert _fray(env, "cluster", "stop", "--backend", "monarch").returncode == 0


# ---------------------------------------------------------------------------------------------- ray
@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One Ray head for the module, started and stopped through the command; nothing of it may be left."""
    pytest.importorskip("fray_ray")
    state = tmp_path_factory.mktemp("ray-state")
    env = _env(state)
    started = _fray(env, "cluster", "start", "--backend", "ray?num_cpus=2&object_store_memory=200000000", timeout=180)
    record = json.loads((state / "clusters" / "ray.json").read_text()) if started.returncode == 0 else None
    try:
        assert record is not None, started.stderr
        assert started.stdout.strip() == record["address"].strip() and record["address"].startswith("http://127.0.0.1:")
        again = _fray(env, "cluster", "start", "--backend", "ray")
        assert again.returncode == 0 and "running already" in again.stderr
        yield env
    finally:
        _stop_ray_cluster(env, state, record)


def _stop_ray_cluster(env: dict[str, str], state: Path, record: dict[str, Any] | None) -> None:
    """`fray cluster stop`, then check that nothing of the cluster is left (and kill what is, to leave nothing)."""
    stopped = _fray(env, "cluster", "stop", "--backend", "ray", timeout=120)
    if record is not None:
        leftover = group_members(record["leader"]["pid"]) + _marked(record["temp_dir"])
        if leftover:  # never leave a Ray behind, even when the command failed
            for pid in leftover:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(record["temp_dir"], ignore_errors=True)
        assert stopped.returncode == 0 and "stopped the ray cluster" in stopped.stderr, stopped.stderr
        assert not leftover, f"processes of the ray cluster left after fray cluster stop: {leftover}"
        assert not (state / "clusters" / "ray.json").exists()


def test_ray_submit_exit_code_working_dir_list_status(ray_env: dict[str, str], tmp_path: Path) -> None:
    _project(tmp_path, EXIT_3)
    done = _fray(
        ray_env,
        "job",
        "submit",
        "--backend",
        "ray",
        "--working-dir",
        "../project",
        "--",
        "python",
        "job.py",
        cwd=tmp_path / "elsewhere",
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "hello from the job\n"
    listed = _json(_fray(ray_env, "job", "list", "--backend", "ray", "--json"))
    assert [info["status"] for info in listed if info["entrypoint"] == "python job.py"] == ["FAILED"]  # type: ignore[union-attr, index]
    overview = _json(_fray(ray_env, "status", "--backend", "ray", "--json"))
    assert overview["backend"] == "ray" and overview["dashboard"].startswith("http://127.0.0.1:")  # type: ignore[index]
    assert "python job.py" in {info["entrypoint"] for info in overview["jobs"]}  # type: ignore[index]


def test_ray_no_wait_follow_and_interrupt(ray_env: dict[str, str]) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 300}"
    ticking = "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick $i; sleep 0.3; done"
    job = _fray(ray_env, "job", "submit", "--backend", "ray", "--no-wait", "--", "sh", "-c", ticking).stdout.strip()
    assert job
    follow = _fray(ray_env, "job", "logs", job, "--follow", "--backend", "ray")  # ends with the job
    assert follow.returncode == 0 and follow.stdout.splitlines()[-1] == "tick 10", follow.stderr
    assert _json(_fray(ray_env, "job", "status", job, "--backend", "ray", "--json"))["status"] == "SUCCEEDED"  # type: ignore[index]
    submit = _start(ray_env, "run", "--backend", "ray", "--", "sh", "-c", f"echo up; sleep {marker}")
    assert submit.stdout is not None
    assert submit.stdout.readline() == "up\n"
    submit.send_signal(signal.SIGINT)
    _out, err = submit.communicate(timeout=60)
    assert submit.returncode == 130 and "Traceback" not in err, err
    _wait_for(lambda: not _sleeping(marker), 10, "the Ray job's processes to end")


def test_ray_a_deleted_running_job_is_never_listed_again(ray_env: dict[str, str]) -> None:
    """Ray's job manager wrote a job deleted while running back about 1 s later, as FAILED (issue 20)."""
    marker = f"{uuid.uuid4().int % 10**6 + 300}"
    job = _fray(ray_env, "job", "submit", "--backend", "ray", "--no-wait", "--", "sleep", marker).stdout.strip()
    assert job
    status = ["job", "status", job, "--backend", "ray", "--json"]
    _wait_for(lambda: _json(_fray(ray_env, *status))["status"] == "RUNNING", 60, "the job to run")  # type: ignore[index]
    deleted = _fray(ray_env, "job", "delete", job, "--backend", "ray")
    assert deleted.returncode == 0, deleted.stderr
    _wait_for(lambda: not _sleeping(marker), 10, "the job's processes to end")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        listed = _json(_fray(ray_env, "job", "list", "--backend", "ray", "--json"))
        assert job not in [info["id"] for info in listed], listed  # type: ignore[index, union-attr]
    assert _fray(ray_env, *status).returncode == 1


def test_one_name_from_four_processes_is_one_job_on_ray(ray_env: dict[str, str]) -> None:
    """tests/test_cli_job_shapes.py's race (4 processes submitting one name make one job), on this module's head."""
    assert race_one_name(ray_env, ["--backend", "ray"], "race", each=2) == {"race.1"}
    listed = _json(_fray(ray_env, "job", "list", "--backend", "ray", "--json"))
    assert [job["id"] for job in listed if job["name"] == "race"] == ["race.1"]  # type: ignore[attr-defined, index]
    assert _fray(ray_env, "job", "stop", "race", "--backend", "ray").returncode == 0


def test_ray_without_a_cluster_says_how_to_start_one(tmp_path: Path) -> None:
    pytest.importorskip("fray_ray")
    done = _fray(_env(tmp_path / "empty"), "job", "list", "--backend", "ray")
    assert done.returncode == 1 and "fray cluster start --backend ray" in done.stderr and "Traceback" not in done.stderr


def _machine_address() -> str | None:
    """This machine's own non-loopback IPv4 address (the one that routes out; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_ray_cluster_listening_elsewhere_gets_only_a_named_working_dir_uploaded(tmp_path: Path) -> None:
    """A cluster not on loopback is treated as remote: --working-dir is uploaded as Ray's working_dir (the job
    runs in Ray's unpacked copy), as `ray job submit` does; without --working-dir nothing is uploaded, not the
    current directory (issue 20: it may hold anything). `fray cluster start --listen` makes such a cluster."""
    pytest.importorskip("fray_ray")
    address = _machine_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the cluster to listen on")
    state = tmp_path / "state"
    env = _env(state)
    spec = "ray?num_cpus=1&object_store_memory=100000000"
    started = _fray(env, "cluster", "start", "--backend", spec, "--listen", address, timeout=180)
    record = json.loads((state / "clusters" / "ray.json").read_text()) if started.returncode == 0 else None
    try:
        assert record is not None, started.stderr
        assert record["address"].startswith(f"http://{address}:"), record
        project = tmp_path / "project"
        project.mkdir()
        (project / "data.txt").write_text("uploaded\n")
        (project / "job.py").write_text("import os\nprint(open('data.txt').read().strip(), os.getcwd())\n")
        done = _fray(
            env,
            "job",
            "submit",
            "--backend",
            "ray",
            "--working-dir",
            str(project),
            "--",
            "python",
            "job.py",
            timeout=240,
        )
        assert done.returncode == 0, done.stderr
        text, cwd = done.stdout.split()
        assert text == "uploaded" and cwd != str(project), done.stdout  # Ray's unpacked copy, not the directory
        assert "_ray_pkg_" in cwd, cwd
        here = tmp_path / "here"
        here.mkdir()
        (here / "secret.txt").write_text("not for the cluster\n")
        look = "import os; print(os.path.exists('secret.txt'), os.getcwd())"
        done = _fray(env, "job", "submit", "--backend", "ray", "--", "python", "-c", look, cwd=here, timeout=240)
        assert done.returncode == 0, done.stderr
        found, cwd = done.stdout.split()
        assert found == "False" and "_ray_pkg_" not in cwd and cwd != str(here), done.stdout  # Ray's default dir
    finally:
        _stop_ray_cluster(env, state, record)
