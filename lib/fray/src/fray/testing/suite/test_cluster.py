"""ClusterContext: whole jobs with statuses as they happen and logs readable during and after."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

from fray import GetTimeoutError, JobNotFoundError, JobStatus, Resource, RuntimeEnv
from fray.cluster_context import ClusterContext
from fray.testing import requires_capability
from fray.testing.plugin import spec_options

PY = shlex.quote(sys.executable)


def _python(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_two_jobs_are_listed_and_succeed(fray_cluster: ClusterContext) -> None:
    first = fray_cluster.create_job(_python("print('job one')"))
    second = fray_cluster.create_job([sys.executable, "-c", "print('job two')"])
    assert first != second
    listed = {info.id for info in fray_cluster.list_jobs()}
    assert {first, second} <= listed
    for job_id, text in ((first, "job one"), (second, "job two")):
        info = fray_cluster.wait_job(job_id, timeout=120)
        assert info.status is JobStatus.SUCCEEDED, (info, fray_cluster.get_job_logs(job_id))
        assert text in fray_cluster.get_job_logs(job_id)
        assert info.submission_time is not None and info.end_time is not None
    statuses = {info.id: info.status for info in fray_cluster.list_jobs()}
    assert statuses[first] is JobStatus.SUCCEEDED and statuses[second] is JobStatus.SUCCEEDED


def test_env_vars_reach_the_job(fray_cluster: ClusterContext) -> None:
    value = uuid.uuid4().hex
    job = fray_cluster.create_job(
        _python("import os; print('got', os.environ['FRAY_JOB_VAR'])"), env=RuntimeEnv(env={"FRAY_JOB_VAR": value})
    )
    assert fray_cluster.wait_job(job, timeout=120).status is JobStatus.SUCCEEDED
    assert f"got {value}" in fray_cluster.get_job_logs(job)


def test_a_jobs_bare_init_reaches_the_backend_it_was_submitted_to(
    fray_cluster: ClusterContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's `fray.init()` with no spec runs on the backend (and cluster) the job was submitted to, whatever the
    submitter's own FRAY_BACKEND says (here: a name no backend has, which a job inheriting it would fail on)."""
    monkeypatch.setenv("FRAY_BACKEND", "not_the_submitted_backend")
    code = "import fray; ctx = fray.init(); print('the job runs on', ctx.backend, flush=True); fray.shutdown()"
    job = fray_cluster.create_job(_python(code))
    monkeypatch.delenv("FRAY_BACKEND")
    info = fray_cluster.wait_job(job, timeout=180)
    logs = fray_cluster.get_job_logs(job)
    assert info.status is JobStatus.SUCCEEDED, logs
    assert f"the job runs on {fray_cluster.backend}" in logs


def test_a_jobs_log_is_plain_text(fray_cluster: ClusterContext) -> None:
    """What the job's tasks print reaches its log with the prefix saying who printed it, and no terminal colour
    codes: a job's log is a file (Ray coloured its prefixes there)."""
    code = (
        "import fray\n"
        "def hello():\n    print('hello from a task', flush=True)\n"
        "ctx = fray.init()\nctx.get(ctx.create_task(hello))\nfray.shutdown()"
    )
    job = fray_cluster.create_job(_python(code))
    info = fray_cluster.wait_job(job, timeout=180)
    logs = fray_cluster.get_job_logs(job)
    assert info.status is JobStatus.SUCCEEDED, logs
    assert "hello from a task" in logs and "\x1b[" not in logs, repr(logs[-2000:])


def test_failing_job_is_failed_with_its_output(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("import sys; print('about to fail'); sys.exit(3)"))
    info = fray_cluster.wait_job(job, timeout=120)
    assert info.status is JobStatus.FAILED
    assert "about to fail" in fray_cluster.get_job_logs(job)
    missing = fray_cluster.create_job(f"{PY} /nonexistent/fray_missing_script.py")
    assert fray_cluster.wait_job(missing, timeout=120).status is JobStatus.FAILED
    assert "fray_missing_script" in fray_cluster.get_job_logs(missing)


def test_logs_readable_while_running_then_delete(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("import time; print('started', flush=True); time.sleep(120)"))
    _wait_for(lambda: "started" in fray_cluster.get_job_logs(job), 60, "the job's first line")
    assert fray_cluster.get_job(job).status is JobStatus.RUNNING
    with pytest.raises(GetTimeoutError):
        fray_cluster.wait_job(job, timeout=0.5)
    start = time.monotonic()
    fray_cluster.delete_job(job)
    assert time.monotonic() - start < 30
    assert job not in {info.id for info in fray_cluster.list_jobs()}
    with pytest.raises(JobNotFoundError):
        fray_cluster.get_job(job)


def test_one_megabyte_of_output_does_not_hang(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("import sys; sys.stdout.write('x' * 1_000_000 + '\\nend\\n')"))
    assert fray_cluster.wait_job(job, timeout=120).status is JobStatus.SUCCEEDED
    logs = fray_cluster.get_job_logs(job)
    assert len(logs) >= 1_000_000 and "end" in logs


def test_unknown_job_id(fray_cluster: ClusterContext) -> None:
    with pytest.raises(JobNotFoundError):
        fray_cluster.get_job_logs("no-such-job")


@requires_capability("job_packages")
def test_job_package_requirements_are_installed(fray_cluster: ClusterContext, probe_ok_wheel: Path) -> None:
    wheel = probe_ok_wheel
    # Plain `python`, not this interpreter's absolute path: a backend may install packages into an environment
    # of the job's own (Ray builds a virtualenv) that only the job's `python` sees.
    job = fray_cluster.create_job(
        "python -c " + shlex.quote("import frayprobe; print('probe says', frayprobe.VALUE)"),
        env=RuntimeEnv(package_requirements=[str(wheel)]),
    )
    info = fray_cluster.wait_job(job, timeout=300)
    logs = fray_cluster.get_job_logs(job)
    assert info.status is JobStatus.SUCCEEDED, logs
    assert "probe says probe-ok" in logs


@requires_capability("job_resources")
def test_job_minimum_resources_are_reserved(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("print('reserved')"), env=RuntimeEnv(minimum_resources=[Resource("CPU", 1)]))
    assert fray_cluster.wait_job(job, timeout=120).status is JobStatus.SUCCEEDED
    assert "reserved" in fray_cluster.get_job_logs(job)


def test_job_maximum_resources_are_refused(fray_cluster: ClusterContext) -> None:
    with pytest.raises(ValueError, match="maximum_resources"):
        fray_cluster.create_job("true", env=RuntimeEnv(maximum_resources=[Resource("CPU", 1)]))


def test_job_runs_in_its_working_dir(
    fray_cluster: ClusterContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fray_wd_probe.py").write_text("import os\nprint('ran in', os.path.realpath(os.getcwd()))\n")
    where = f"ran in {os.path.realpath(tmp_path)}"
    job = fray_cluster.create_job(f"{PY} fray_wd_probe.py", working_dir=tmp_path)
    assert fray_cluster.wait_job(job, timeout=120).status is JobStatus.SUCCEEDED, fray_cluster.get_job_logs(job)
    assert where in fray_cluster.get_job_logs(job)
    monkeypatch.chdir(tmp_path)  # by default a job runs where its submitter is
    job = fray_cluster.create_job([sys.executable, "fray_wd_probe.py"])
    assert fray_cluster.wait_job(job, timeout=120).status is JobStatus.SUCCEEDED, fray_cluster.get_job_logs(job)
    assert where in fray_cluster.get_job_logs(job)
    with pytest.raises(ValueError, match="not a directory"):
        fray_cluster.create_job("true", working_dir=tmp_path / "missing")


def test_stop_job_keeps_it_listed_as_stopped(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("import time; print('started', flush=True); time.sleep(300)"))
    _wait_for(lambda: "started" in fray_cluster.get_job_logs(job), 60, "the job's first line")
    start = time.monotonic()
    fray_cluster.stop_job(job)
    assert time.monotonic() - start < 30
    info = fray_cluster.get_job(job)
    assert info.status is JobStatus.STOPPED, info
    assert job in {i.id for i in fray_cluster.list_jobs()}
    assert "started" in fray_cluster.get_job_logs(job)
    fray_cluster.stop_job(job)  # a job that has ended is left as it is
    assert fray_cluster.get_job(job).status is JobStatus.STOPPED
    fray_cluster.delete_job(job)


def test_tail_job_logs_follows_a_running_job_to_its_end(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    code = (
        "import os, time\nprint('first', flush=True)\ndeadline = time.time() + 120\n"
        f"while not os.path.exists({str(gate)!r}) and time.time() < deadline:\n    time.sleep(0.05)\n"
        "print('second', flush=True)\n"
    )
    job = fray_cluster.create_job(_python(code))
    seen = ""
    for piece in fray_cluster.tail_job_logs(job):
        assert isinstance(piece, str) and piece
        seen += piece
        if "first" in seen and not gate.exists():
            assert "second" not in seen
            assert not fray_cluster.get_job(job).status.is_terminal  # it is followed while it runs
            gate.write_text("go")
    assert gate.exists() and seen.index("first") < seen.index("second"), seen
    assert fray_cluster.get_job(job).status is JobStatus.SUCCEEDED  # the iterator ended with the job
    with pytest.raises(JobNotFoundError):
        fray_cluster.tail_job_logs("no-such-job")


@requires_capability("persistent_jobs")
def test_detached_job_outlives_its_submitter(
    fray_cluster: ClusterContext, fray_backend_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))  # in_memory keeps detached jobs there
    options = spec_options(fray_backend_name, "cluster_test_spec")
    if fray_cluster.address:
        options["address"] = fray_cluster.address
    spec = fray_backend_name + ("?" + urlencode(options) if options else "")
    command = _python("import time\nfor i in range(300):\n    print('tick', i, flush=True)\n    time.sleep(0.2)")
    submit = f"import fray\nc = fray.cluster({spec!r})\nprint(c.create_job({command!r}, detached=True))\nc.shutdown()"
    done = subprocess.run([sys.executable, "-c", submit], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[-1]
    try:
        _wait_for(lambda: "tick 3" in fray_cluster.get_job_logs(job), 60, "the detached job's output")
        assert fray_cluster.get_job(job).status is JobStatus.RUNNING  # its submitter has ended, it has not
        assert job in {info.id for info in fray_cluster.list_jobs()}
        fray_cluster.stop_job(job)
        assert fray_cluster.get_job(job).status is JobStatus.STOPPED
    finally:
        fray_cluster.delete_job(job)
    with pytest.raises(JobNotFoundError):
        fray_cluster.get_job(job)
