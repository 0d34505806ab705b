"""ClusterContext: whole jobs with statuses as they happen and logs readable during and after."""

from __future__ import annotations

import base64
import hashlib
import shlex
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from fray import GetTimeoutError, JobNotFoundError, JobStatus, Resource, RuntimeEnv
from fray.context import ClusterContext
from fray.testing import requires_capability

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


def _probe_wheel(directory: Path, value: str) -> Path:
    """A minimal pure-Python wheel, built by hand so the test needs no network and no build backend."""
    files = {
        "frayprobe.py": f"VALUE = {value!r}\n",
        "frayprobe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: frayprobe\nVersion: 0.1\n",
        "frayprobe-0.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: fray\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("frayprobe-0.1.dist-info/RECORD,,")
    files["frayprobe-0.1.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = directory / "frayprobe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


@requires_capability("job_packages")
def test_job_package_requirements_are_installed(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    wheel = _probe_wheel(tmp_path, "probe-ok")
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
