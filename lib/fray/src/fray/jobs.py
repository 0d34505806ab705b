"""Jobs as local subprocesses: each in its own process group, output to a log file (never a pipe that can fill),
status updated by a waiter thread as it happens. Used by in_memory's ClusterContext and by backends that run
jobs on their own hosts."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from fray.errors import GetTimeoutError, JobNotFoundError
from fray.types import JobInfo, JobStatus, RuntimeEnv

__all__ = ["LocalJobs"]


@dataclass
class _Job:
    info: JobInfo
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    stop_requested: bool = False
    ended: threading.Event = field(default_factory=threading.Event)


def _command(entrypoint: str | list[str], env: RuntimeEnv, site_dir: Path) -> tuple[list[str], bool]:
    """The argv to run, and whether it needs a shell. Packages are installed by the job itself, first, so the
    install's output lands in the job's log and a failed install fails the job."""
    if not env.package_requirements:
        return ([entrypoint], True) if isinstance(entrypoint, str) else (entrypoint, False)
    install = shlex.join(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site_dir), *env.package_requirements]
    )
    run = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
    return ([f"{install} && {{ {run}\n}}"], True)


class LocalJobs:
    """A table of jobs run as subprocesses on this host."""

    def __init__(self, root: Path, stop_grace: float = 3.0) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.stop_grace = stop_grace
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def start(self, entrypoint: str | list[str], env: RuntimeEnv, job_id: str | None = None) -> str:
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
        job_dir = self.root / job_id
        job_dir.mkdir(parents=True)
        text = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
        job = _Job(JobInfo(job_id, JobStatus.PENDING, submission_time=time.time(), entrypoint=text), job_dir / "log")
        with self._lock:
            self._jobs[job_id] = job
        site_dir = job_dir / "site-packages"
        argv, shell = _command(entrypoint, env, site_dir)
        child_env = {**os.environ, **env.env}
        if env.package_requirements:
            child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site_dir), child_env.get("PYTHONPATH")]))
        with open(job.log_path, "wb") as log:
            try:
                proc = subprocess.Popen(
                    argv[0] if shell else argv,
                    shell=shell,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    cwd=job_dir,
                    start_new_session=True,  # its own process group, so stop reaches every child
                )
            except OSError as exc:  # e.g. argv[0] not found: the job fails, with the reason in its log
                log.write(f"fray: could not start {text!r}: {exc}\n".encode())
                self._finish(job, JobStatus.FAILED, None, str(exc))
                return job_id
        with self._lock:
            job.proc = proc
            job.info = replace(job.info, status=JobStatus.RUNNING, start_time=time.time())
        threading.Thread(target=self._wait_for, args=(job,), name=f"fray-job-{job_id}", daemon=True).start()
        return job_id

    def _wait_for(self, job: _Job) -> None:
        assert job.proc is not None
        code = job.proc.wait()
        if job.stop_requested:
            self._finish(job, JobStatus.STOPPED, code, "stopped by request")
        elif code == 0:
            self._finish(job, JobStatus.SUCCEEDED, code, "")
        else:
            self._finish(job, JobStatus.FAILED, code, f"exited with code {code}")

    def _finish(self, job: _Job, status: JobStatus, code: int | None, message: str) -> None:
        with self._lock:
            job.info = replace(job.info, status=status, end_time=time.time(), exit_code=code, message=message)
        job.ended.set()

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job {job_id!r} here (it never existed or was deleted)")
        return job

    def info(self, job_id: str) -> JobInfo:
        return self._job(job_id).info

    def list(self) -> list[JobInfo]:
        with self._lock:
            return [job.info for job in self._jobs.values()]

    def logs(self, job_id: str) -> str:
        return self._job(job_id).log_path.read_bytes().decode(errors="replace")

    def stop(self, job_id: str) -> None:
        """SIGTERM the job's process group; SIGKILL it if it is still there after stop_grace seconds."""
        job = self._job(job_id)
        proc = job.proc
        if proc is None or job.ended.is_set():
            return
        job.stop_requested = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            if job.ended.wait(self.stop_grace):
                break
        job.ended.wait(self.stop_grace)
        # The leader may be gone while children of its group live on: make sure none survive.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def delete(self, job_id: str) -> None:
        self.stop(job_id)
        with self._lock:
            self._jobs.pop(job_id, None)

    def wait(self, job_id: str, timeout: float | None) -> JobInfo:
        job = self._job(job_id)
        if not job.ended.wait(timeout):
            raise GetTimeoutError(f"job {job_id} did not end within {timeout} s (status {job.info.status.name})")
        return job.info

    def close(self) -> None:
        for info in self.list():
            self.stop(info.id)
