"""Jobs as local subprocesses: each in its own process group, output to a log file (never a pipe that can fill),
status updated by a waiter thread as it happens, run in the working directory given (by default the job's own
directory). Used by in_memory's ClusterContext and by backends that run jobs on their own hosts. A job's group
is signalled only while it is proven the job's (its leader's fray.host.procfs.Identity, recorded at start). Detached
jobs, which outlive this process, are in fray.jobs.detached."""

from __future__ import annotations

import codecs
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from fray.errors import GetTimeoutError, InfeasibleResourcesError, JobExistsError, JobNotFoundError
from fray.host import settings, watchdog
from fray.host.procfs import Identity, stop_group
from fray.host.state_dir import private_dir
from fray.jobs.plain_text import last_lines
from fray.jobs.policy import kill_delay
from fray.runtime.gpus import DevicePool, HostGpus, discover, process_env
from fray.runtime.resources import add, fits, format_resources, short_of, subtract
from fray.types import JobInfo, JobStatus, RuntimeEnv

__all__ = [
    "LocalJobs",
    "ended_status",
    "follow_log",
    "job_command",
    "job_environment",
    "missing_dir_message",
    "private_dir",
    "read_log_end",
]


@dataclass
class _Job:
    info: JobInfo
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    stop_requested: bool = False
    ended: threading.Event = field(default_factory=threading.Event)
    need: dict[str, float] = field(default_factory=dict)  # resources it holds (or waits for)
    detached: bool = False  # outlives the process that started it
    working_dir: str | None = None  # where it runs (None: its own directory)
    leader: Identity | None = None  # its process (pid, start time, boot): what proves its group is still its own
    devices: tuple[int, ...] = ()  # the GPUs it holds (its CUDA_VISIBLE_DEVICES)
    grace: float | None = None  # a supervised job's ranks' grace (fray.jobs.policy): its stop goes to the supervisor


def host_resources(gpus: HostGpus | None = None) -> dict[str, float]:
    """This host's CPU count, memory (bytes) and GPUs (`gpus`, else those found here: fray.runtime.gpus)."""
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 8.0 * 2**30
    found = len(gpus if gpus is not None else discover())
    return {"CPU": float(os.cpu_count() or 1), "memory": memory, **({"GPU": float(found)} if found else {})}


def job_command(entrypoint: str | list[str], env: RuntimeEnv, site_dir: Path) -> tuple[list[str], bool]:
    """The argv to run, and whether it needs a shell. Packages are installed by the job itself, first, so the
    install's output lands in the job's log and a failed install fails the job."""
    if not env.package_requirements:
        return ([entrypoint], True) if isinstance(entrypoint, str) else (entrypoint, False)
    install = shlex.join(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site_dir), *env.package_requirements]
    )
    # An argv replaces the shell once installed (exec): the job's first process is then the command itself, which
    # a supervised job needs (its stop goes to the supervisor alone: LocalJobs.stop, fray.jobs.signals).
    run = entrypoint if isinstance(entrypoint, str) else "exec " + shlex.join(entrypoint)
    return ([f"{install} && {{ {run}\n}}"], True)


def job_environment(env: RuntimeEnv, site_dir: Path) -> dict[str, str]:
    """The environment of a job: this process's, with this interpreter's bin directory first on PATH (`python` in a
    job is the interpreter of the program that started it, as in an activated environment), the job's own
    variables (they win), and the directory its packages are installed into on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [os.path.dirname(sys.executable), os.environ.get("PATH")]))
    child_env = {**os.environ, "PATH": path, **env.env}
    if env.package_requirements:
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site_dir), child_env.get("PYTHONPATH")]))
    return child_env


def ended_status(code: int) -> tuple[JobStatus, int, str]:
    """Status, exit code and message of a job whose process returned `code` (negative: killed by that signal)."""
    if code == 0:
        return JobStatus.SUCCEEDED, code, ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return JobStatus.FAILED, code, f"killed by {name}"
    return JobStatus.FAILED, code, f"exited with code {code}"


def missing_dir_message(working_dir: str) -> str:
    return f"fray: the working directory {working_dir} does not exist on this host ({socket.gethostname()})\n"


def read_log_end(path: Path, lines: int, block: int = 64 * 1024) -> str:
    """The last `lines` lines of the file at `path` (all of it if fewer), read backwards from its end a block at
    a time: the cost is that of the lines asked for, whatever the file's size."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        start = end
        while start > 0 and data.count(b"\n") <= lines:
            step = min(block, start)
            start -= step
            f.seek(start)
            data = f.read(step) + data
            block *= 2
    return last_lines(data.decode(errors="replace"), lines)


def follow_log(path: Path, ended: Callable[[], bool], poll: float = 0.05, max_poll: float = 0.5) -> Iterator[str]:
    """Yield what the log file at `path` holds, then each piece written to it, until `ended()` is true and
    everything written before was yielded. Decodes UTF-8 across reads (a character split between two reads is
    yielded whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pause = poll
    with open(path, "rb") as log:
        while True:
            done = ended()  # asked before reading: whatever the job wrote before it ended is read below
            data = log.read()
            text = decoder.decode(data, final=done)
            if text:
                yield text
            if done:
                return
            if data:
                pause = poll
            else:
                time.sleep(pause)
                pause = min(pause * 1.5, max_poll)


class LocalJobs:
    """A table of jobs run as subprocesses on this host.

    A job whose RuntimeEnv has minimum_resources holds them while it runs and stays PENDING until this host's
    free resources (`totals`, default: CPU count, memory and GPUs) cover them; one that could never fit is refused.
    A job holding GPUs gets its own devices (DevicePool): CUDA_VISIBLE_DEVICES and FRAY_GPUS name them."""

    def __init__(
        self,
        root: Path,
        stop_grace: float = 3.0,
        totals: Mapping[str, float] | None = None,
        gpus: HostGpus | None = None,
    ) -> None:
        self.root = Path(root)
        private_dir(self.root)
        self.stop_grace = stop_grace
        self.gpus = gpus if gpus is not None else discover()
        self.totals = dict(totals) if totals is not None else host_resources(self.gpus)
        self._free = dict(self.totals)
        self._devices = DevicePool(self.gpus.ids)
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Condition()

    def start(
        self,
        entrypoint: str | list[str],
        env: RuntimeEnv,
        job_id: str | None = None,
        detached: bool = False,
        working_dir: str | None = None,
        resume: bool = False,
    ) -> str:
        """Start a job in `working_dir` (default: its own directory); it dies with this process (fray.host.watchdog)
        unless `detached`. A working directory that does not exist here fails the job, saying so in its log.
        `resume`: the job's directory and log are under this root already (a run of it whose host was lost, on
        storage that outlived it): it runs again there, its log going on."""
        need = {r.name: float(r.quantity) for r in env.minimum_resources}
        short = short_of(self.totals, need)
        if short:
            raise InfeasibleResourcesError(
                f"the job needs {format_resources(need)} but this host has {format_resources(self.totals)}; lower "
                "its minimum_resources"
            )
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
        job_dir = self.root / job_id
        text = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
        job = _Job(JobInfo(job_id, JobStatus.PENDING, submission_time=time.time(), entrypoint=text), job_dir / "log")
        job.need = need
        job.detached = detached
        job.working_dir = working_dir
        grace = settings.JOB_STOP_GRACE.read(env.env)
        if grace is not None:
            job.grace = grace
        # Taken and listed in one step: a racing submitter of the same name that is refused this id must find the
        # job when it lists again (create_job's named runs count on it).
        with self._lock:
            if job_id in self._jobs:
                raise JobExistsError(f"a job with id {job_id!r} exists here")
            if resume:
                private_dir(job_dir, create=False)
                os.close(os.open(job.log_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW))
            else:
                try:
                    job_dir.mkdir(mode=0o700)  # atomic: of two starts of one id, one fails here
                except FileExistsError:
                    raise JobExistsError(f"a job with id {job_id!r} exists here") from None
                os.close(os.open(job.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            self._jobs[job_id] = job
        if need:
            threading.Thread(
                target=self._launch, args=(job, entrypoint, env), name=f"fray-job-start-{job_id}", daemon=True
            ).start()
        else:
            self._launch(job, entrypoint, env)
        return job_id

    def _launch(self, job: _Job, entrypoint: str | list[str], env: RuntimeEnv) -> None:
        gpus = job.need.get("GPU", 0.0)
        with self._lock:  # wait (PENDING) until the job's resources are free, unless it is stopped first
            while not job.stop_requested and not (
                fits(self._free, job.need) and self._devices.choose(gpus) is not None
            ):
                self._lock.wait()
            if job.stop_requested:
                job.need = {}
            subtract(self._free, job.need)
            job.devices = self._devices.take(gpus) or () if job.need else ()
        if job.stop_requested:
            self._finish(job, JobStatus.STOPPED, None, "stopped before it started")
            return
        site_dir = job.log_path.parent / "site-packages"
        argv, shell = job_command(entrypoint, env, site_dir)
        child_env = {**job_environment(env, site_dir), **process_env(job.devices, self.gpus)}
        if not job.detached:  # it dies with this process (the watchdog): its supervisor starts nothing after that
            child_env[settings.JOB_OWNER.name] = str(os.getpid())
        with open(job.log_path, "ab") as log:
            if job.working_dir is not None and not os.path.isdir(job.working_dir):
                log.write(missing_dir_message(job.working_dir).encode())
                self._finish(job, JobStatus.FAILED, None, f"the working directory {job.working_dir} does not exist")
                return
            try:
                proc = subprocess.Popen(
                    argv[0] if shell else argv,
                    shell=shell,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    cwd=job.working_dir or job.log_path.parent,
                    start_new_session=True,  # its own process group, so stop reaches every child
                )
            except OSError as exc:  # e.g. argv[0] not found: the job fails, with the reason in its log
                log.write(f"fray: could not start {job.info.entrypoint!r}: {exc}\n".encode())
                self._finish(job, JobStatus.FAILED, None, str(exc))
                return
        if not job.detached:
            watchdog.watch_group(proc.pid)  # killed with its owner, however the owner ends
        leader = Identity.of(proc.pid, zombie_ok=True)  # our child: nothing reaps it before we do
        with self._lock:
            job.proc = proc
            job.leader = leader
            job.info = replace(job.info, status=JobStatus.RUNNING, start_time=time.time())
        threading.Thread(target=self._wait_for, args=(job,), name=f"fray-job-{job.info.id}", daemon=True).start()

    def _wait_for(self, job: _Job) -> None:
        assert job.proc is not None
        code = job.proc.wait()
        if not job.detached:
            watchdog.forget_group(job.proc.pid)  # its number may be reused once its group is empty
        if job.stop_requested:
            self._finish(job, JobStatus.STOPPED, code, "stopped by request")
        else:
            self._finish(job, *ended_status(code))

    def _finish(self, job: _Job, status: JobStatus, code: int | None, message: str) -> None:
        with self._lock:
            job.info = replace(job.info, status=status, end_time=time.time(), exit_code=code, message=message)
            add(self._free, job.need)
            self._devices.give(job.devices, job.need.get("GPU", 0.0))
            job.need, job.devices = {}, ()
            self._lock.notify_all()
        job.ended.set()

    def adopt(self, info: JobInfo) -> None:
        """List a job that ended elsewhere, whose directory and log are under this root (a job whose host was lost,
        on storage that outlived it): it is read, waited for and deleted as if it had run here."""
        job = _Job(info, self.root / info.id / "log")
        private_dir(job.log_path.parent, create=False)
        job.ended.set()
        with self._lock:
            if info.id in self._jobs:
                raise JobExistsError(f"a job with id {info.id!r} exists here")
            self._jobs[info.id] = job

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job {job_id!r} here (it never existed or was deleted)")
        return job

    def has(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._jobs

    def info(self, job_id: str) -> JobInfo:
        return self._job(job_id).info

    def list(self) -> list[JobInfo]:
        with self._lock:
            return [job.info for job in self._jobs.values()]

    def logs(self, job_id: str) -> str:
        return self._job(job_id).log_path.read_bytes().decode(errors="replace")

    def log_end(self, job_id: str, lines: int) -> str:
        return read_log_end(self._job(job_id).log_path, lines)

    def tail(self, job_id: str) -> Iterator[str]:
        """The job's output as it comes, until it has ended (see follow_log)."""
        job = self._job(job_id)
        return follow_log(job.log_path, job.ended.is_set)

    def stop(self, job_id: str) -> None:
        """SIGTERM the job's process group; SIGKILL what is left of it after stop_grace seconds. The group is
        signalled only while it is proven the job's (fray.host.procfs.stop_group): once the job and its group have
        ended, the number may already be another process's group. A supervised job's SIGTERM goes to its
        supervisor alone, which gives its ranks their grace (each gets one SIGTERM) and ends them: its group is
        killed after that grace and a margin (fray.jobs.policy.kill_delay)."""
        job = self._job(job_id)
        with self._lock:
            job.stop_requested = True
            self._lock.notify_all()  # a PENDING job stops without starting
            proc, leader = job.proc, job.leader
        if proc is None or job.ended.is_set():
            job.ended.wait(self.stop_grace)
            return
        if leader is not None and job.grace is not None:
            if leader.running():  # (proven ours: pid, start time and boot)
                try:
                    os.kill(leader.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            job.ended.wait(kill_delay(job.grace))
            stop_group(leader, 1.0)  # whatever the supervisor left
        elif leader is not None:
            stop_group(leader, self.stop_grace)  # (its children in the group too, the leader gone or not)
        job.ended.wait(self.stop_grace)

    def delete(self, job_id: str) -> None:
        """Stop the job if it runs, then forget it: its directory and log go, and its id is free again."""
        job = self._job(job_id)
        self.stop(job_id)
        with self._lock:
            self._jobs.pop(job_id, None)
        shutil.rmtree(job.log_path.parent, ignore_errors=True)

    def wait(self, job_id: str, timeout: float | None) -> JobInfo:
        job = self._job(job_id)
        if not job.ended.wait(timeout):
            raise GetTimeoutError(f"job {job_id} did not end within {timeout} s (status {job.info.status.name})")
        return job.info

    def close(self) -> None:
        for info in self.list():
            self.stop(info.id)
