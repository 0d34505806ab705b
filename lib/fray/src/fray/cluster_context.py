"""ClusterContext: whole jobs (a command or a Python callable, with ranks, retries, a name; their logs) on a
backend's cluster.

Its public methods validate input and enforce the shared semantics; backends implement the `_hooks`.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

from fray.errors import FrayError, JobExistsError, JobNotFoundError, UnsupportedFeatureError
from fray.host import settings
from fray.host.interrupts import interrupted, interruptible
from fray.jobs.dependencies import Waits, waits_of
from fray.jobs.dirs import job_env
from fray.jobs.handle import JobHandle
from fray.jobs.job_info import with_record
from fray.jobs.plain_text import last_lines, plain, plain_pieces
from fray.jobs.policy import JobPolicy
from fray.jobs.requests import (
    IF_EXISTS,
    check_name,
    checked_command,
    is_name,
    latest_run,
    launch_of,
    next_id,
    place,
    run_of,
)
from fray.jobs.retry import remember, retry
from fray.runtime.arguments import check_timeout
from fray.runtime.capabilities import Capability
from fray.types import JobInfo, RuntimeEnv

__all__ = ["ClusterContext"]

BACKEND_VAR = settings.BACKEND.name


_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_NAME_TRIES = 20
_DASHBOARD_LOCK = threading.Lock()  # (one for every context: a page is started once in a context's life)


class ClusterContext(ABC):
    """Run whole programs (jobs) as commands, watch their status, follow and read their logs, stop them."""

    backend: ClassVar[str] = "?"
    # What this context can do; a backend's class declares it, and one context may have less than its class (a
    # Ray head private to this process keeps no job once this process ends: no persistent_jobs).
    capabilities: frozenset[Capability] = frozenset()
    # Where jobs run when create_job is given no working_dir: None means the caller's current directory.
    default_working_dir: str | None = None
    # Where other processes reach this cluster (Ray: its dashboard URL; monarch: its head's socket), if they can.
    address: str | None = None
    _shut_down: bool = False  # set by the first shutdown(); later ones do nothing
    _dashboard: Any = None  # its live page's server, once asked for (fray.dashboard)
    job_dirs: str | None = None  # the job_dirs spec option: where named jobs' directories are (fray.jobs.dirs)
    # A supervised job's ranks holding resources run apart from its first process, which holds nothing (ONE_NODE).
    ranks_apart: ClassVar[bool] = False

    def create_job(
        self,
        entrypoint: str | Sequence[str] | Callable[..., Any],
        env: RuntimeEnv | None = None,
        working_dir: str | os.PathLike[str] | None = None,
        detached: bool = False,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        if_exists: str = "return",
        job_id: str | None = None,
        max_retries: int = 0,
        replicas: int | tuple[int, int] = 1,
        resources: Mapping[str, float] | None = None,
        placement: str | None = None,
        max_recoveries: int | None = None,
        retry_on_exit_codes: Sequence[int] | None = None,
        no_retry_on_exit_codes: Sequence[int] | None = None,
        stop_grace: float | None = None,
        after: Sequence[str] | None = None,
    ) -> JobHandle:
        """Start a job; return its handle (which is also its id, a str).

        entrypoint: a shell command string, an argv list run without a shell, or a Python callable, run as
        `fn(*args, **kwargs)` in the job's own process(es); its return value (if plain data) and its exception go
        on the job's record (JobInfo.result, .error).
        working_dir: the directory the job runs in (default: the caller's current directory). On this machine the
        job runs in place there; a backend whose jobs run elsewhere may send it along (Ray uploads a directory as
        its working_dir only when one is named, as `ray job submit` does).
        detached: the job outlives this process and this context, and any process can find it (list, logs, stop,
        delete); needs the persistent_jobs capability. A job that is not detached ends when its owner ends,
        however the owner ends, unless it runs on a cluster the user started (whose jobs outlive their submitter).
        name: at most one live job has it: with a pending or running job of that name, `if_exists` says what
        happens: "return" that job (default), "replace" it (stop it, then start this one) or "refuse"
        (JobExistsError). Its runs' ids are `name.1`, `name.2`...; every verb takes the name for its latest run.
        job_id: the id to give it (JobExistsError if taken), as Ray's submission_id.
        max_retries: run it again after a failed attempt (non-zero exit or exception; not after stop), up to this
        many times; retry_on_exit_codes / no_retry_on_exit_codes: only those / all but those exit codes.
        max_recoveries: run it again after a lost attempt (preempted: SIGTERM not from fray's stop; a node lost),
        up to this many times (default 10). stop_grace: seconds a rank has between SIGTERM and SIGKILL (default 5).
        replicas: start that many ranks, with torch.distributed's variables set (RANK, WORLD_SIZE,
        LOCAL_RANK, MASTER_ADDR, MASTER_PORT); one failing fails the attempt, and the others are stopped.
        (min, max): elastic, as many as fit the nodes' totals, at least min (fray.jobs.elastic).
        resources: what each rank needs (CPU, GPU, memory in bytes, custom); the job holds it for all its ranks.
        placement: where the ranks run. None (default): all on the job's host where they fit one node, else over
        the nodes as "pack" would; "pack" / "spread": as an SPMD actor group of this backend placed over its nodes
        (as create_actor_group places one), each rank holding its own resources. On Ray a supervised job's ranks that
        hold resources are such a group even with None, on one node where they fit: its first process holds nothing.
        Ranks, retries and callables run under fray.jobs.supervisor.
        after: jobs of this cluster (handles, ids or names) it waits for, PENDING, listed at once; it starts when
        all have SUCCEEDED and ends FAILED without running when one fails, is stopped or deleted
        (fray.jobs.dependencies). Not with detached.
        """
        policy = JobPolicy.of(max_retries, max_recoveries, retry_on_exit_codes, no_retry_on_exit_codes, stop_grace)
        launch = launch_of(entrypoint, args, kwargs, policy, replicas, resources, placement)
        # where the ranks go, checked against the nodes' totals (asked only for several ranks with resources)
        launch = place(
            launch, self.node_status, Capability.MULTI_HOST in self.capabilities, self.backend, self.ranks_apart
        )
        command = None if launch.call is not None else checked_command(entrypoint)
        if env is not None and not isinstance(env, RuntimeEnv):
            raise TypeError(f"env must be a fray.RuntimeEnv, got {type(env).__name__}")
        env = env or RuntimeEnv()
        if launch.per_rank:
            if env.minimum_resources:
                raise ValueError("give a job's resources once: resources= (per rank) or RuntimeEnv.minimum_resources")
            env = replace(env, minimum_resources=launch.whole_job())
        self._check_env(env)
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be True or False, got {detached!r}")
        if detached and Capability.PERSISTENT_JOBS not in self.capabilities:
            why = f"create_job(detached=True) needs it: {self._no_persistent_jobs()}"
            raise UnsupportedFeatureError(Capability.PERSISTENT_JOBS, self.backend, why)
        if working_dir is None:
            working_dir = self.default_working_dir or os.getcwd()
        elif not isinstance(working_dir, (str, os.PathLike)):
            raise TypeError(f"working_dir must be a path (str or os.PathLike), got {type(working_dir).__name__}")
        directory = os.path.abspath(os.fspath(working_dir))
        if not os.path.isdir(directory):
            raise ValueError(f"working_dir {directory!r} is not a directory")
        if if_exists not in IF_EXISTS:
            raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}")
        if name is not None and job_id is not None:
            raise ValueError("give a job a name or a job_id, not both (a named job's ids are name.1, name.2, ...)")
        if job_id is not None and (not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id)):
            raise ValueError(f"job_id {job_id!r} is not valid: letters, digits, '.', '-' or '_' (at most 128)")
        if launch.supervised:
            env = replace(env, env={**env.env, **launch.call_env()})  # a callable that cannot travel fails here
            command = launch.command(command, self._job_python())
        assert command is not None  # (a callable is always supervised)
        env = self._reaching_this_cluster(replace(env, env={**job_env(name, self.job_dirs), **env.env}))
        submit: Callable[[str | None], str] = partial(self._submit, command, env, directory, detached)
        waits_for = self._waits.targets(after, detached, self.backend, self._resolve)
        if waits_for:
            submit = self._waits.deferring(submit, waits_for, command)
        if name is None:
            return JobHandle(submit(job_id), self)
        return JobHandle(self._submit_named(check_name(name), if_exists, submit), self)

    def _check_env(self, env: RuntimeEnv) -> None:
        if env.package_requirements and Capability.JOB_PACKAGES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_PACKAGES, self.backend, "RuntimeEnv.package_requirements")
        if env.maximum_resources:
            raise ValueError(
                "RuntimeEnv.maximum_resources bounds a task's request; no backend can cap a whole job's usage. "
                "Use minimum_resources to reserve resources for the job."
            )
        if env.minimum_resources and Capability.JOB_RESOURCES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_RESOURCES, self.backend, "a job's resources")

    def _submit(
        self, entrypoint: str | list[str], env: RuntimeEnv, directory: str, detached: bool, job_id: str | None
    ) -> str:
        made = self._create_job(entrypoint, env, directory, detached, job_id)
        if job_id is not None and made != job_id:
            raise RuntimeError(f"the {self.backend} backend gave job {job_id!r} the id {made!r}")
        remember(self, made, entrypoint, env, directory, detached)  # for retry_job (fray.jobs.retry)
        return made

    def _submit_named(self, name: str, if_exists: str, submit: Callable[[str], str]) -> str:
        """Create a run of `name` unless one is live (see create_job). Each try lists the runs and creates the next
        id; a backend refuses an id that exists, so a racing submitter's job is found on a later try. Tries back off:
        a backend may take the id a moment before it lists the job (a detached job's directory before its record)."""
        for attempt in range(_NAME_TRIES):
            if attempt:
                time.sleep(min(0.01 * 2 ** (attempt - 1), 0.25))
            jobs = self._waits.merged(self._list_jobs())
            live = [info for info in jobs if run_of(info.id, name) and not info.status.is_terminal]
            if live and if_exists == "return":
                return latest_run(live, name)
            if live and if_exists == "refuse":
                raise JobExistsError(f"job {name!r} is {live[0].status.value} (id {live[0].id}); if_exists='refuse'")
            for info in live:
                self._stop(info.id)
            try:
                return submit(next_id(name, jobs))
            except JobExistsError:
                continue  # another submitter made that run first: look again
        raise JobExistsError(f"could not start a run of job {name!r}: its ids were taken {_NAME_TRIES} times over")

    def _reaching_this_cluster(self, env: RuntimeEnv) -> RuntimeEnv:
        # A job's bare fray.init() reads FRAY_BACKEND: without it set here, it would read the submitter's (or
        # nothing, and run on in_memory) whatever backend the job was submitted to. The job's own env wins.
        spec = self._job_backend()
        if spec is None or BACKEND_VAR in env.env:
            return env
        return replace(env, env={BACKEND_VAR: spec, **env.env})

    def list_jobs(self) -> list[JobInfo]:
        """Every job this context can see, oldest first where the backend knows the order."""
        return self._waits.merged([self._with_record(info) for info in self._list_jobs()])

    def job(self, job: str) -> JobHandle:
        """The handle of a job, by id or name (JobNotFoundError if unknown)."""
        return JobHandle(self._resolve(job), self)

    def get_job(self, job_id: str) -> JobInfo:
        """The current JobInfo of one job, by id or name (JobNotFoundError if unknown). For a job fray supervises
        (a callable, ranks or retries) it holds its attempts, and its callable's result or exception."""
        job_id = self._resolve(job_id)
        return self._waits.info(job_id) or self._with_record(self._get_job(job_id))

    def stop_job(self, job_id: str) -> None:
        """Stop a pending or running job (its whole process group: SIGTERM, then SIGKILL after a grace period) and
        return once it has ended. It ends STOPPED and stays listed, with its logs. A job that has already ended is
        left as it is. A job stopped is not retried."""
        self._stop(self._resolve(job_id))

    def _stop(self, job_id: str) -> None:
        if not self._waits.stop(job_id):
            self._stop_job(job_id)

    def retry_job(self, job_id: str) -> JobHandle:
        """Start a new run of a finished job with its recorded command, callable and options (fray.jobs.retry)."""
        return JobHandle(retry(self, self._resolve(job_id)), self)

    def delete_job(self, job_id: str) -> None:
        """Stop the job if it runs (its whole process group), then forget it."""
        job_id = self._resolve(job_id)
        if not self._waits.delete(job_id):
            self._delete_job(job_id)

    def get_job_logs(self, job_id: str, tail: int | None = None) -> str:
        """Everything the job wrote to stdout and stderr so far (readable while it runs and after), as plain text:
        terminal escape sequences (colours) removed (fray.jobs.plain_text). With `tail`, its last `tail` lines only,
        read from the log's end (as cheap for a log of gigabytes as of kilobytes, where the backend can)."""
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise ValueError(f"tail must be a number of lines >= 0, got {tail!r}")
        job_id = self._resolve(job_id)
        if self._waits.info(job_id) is not None:
            return ""  # it has not started
        if tail is None:
            return plain(self._get_job_logs(job_id))
        return last_lines(plain(self._get_job_log_end(job_id, tail + 1)), tail)

    def tail_job_logs(self, job_id: str) -> Iterator[str]:
        """Follow the job's output: an iterator of text pieces, first what the job wrote so far, then each new
        piece as it comes; it ends once the job has ended and everything it wrote has been given. Joined, the
        pieces are the job's whole log (as get_job_logs gives it). Unknown ids raise JobNotFoundError here, not
        at the first piece."""
        job_id = self._resolve(job_id)  # (it is known: an unknown one raised here)
        pieces = self._waits.tail(job_id, self._tail_job_logs)
        return interruptible(plain_pieces(pieces), f"the log of job {job_id}")

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job ends; GetTimeoutError after timeout."""
        job_id = self._resolve(job_id)
        try:
            ended, timeout = self._waits.wait(job_id, check_timeout(timeout))
            return ended or self._with_record(self._wait_job(job_id, timeout))
        except KeyboardInterrupt as exc:
            raise interrupted(exc, f"job {job_id}") from None

    def _resolve(self, job: str) -> str:
        """The id of `job`, an id or a name (a name: its latest run)."""
        if not isinstance(job, str):
            raise TypeError(f"a job is named by its id or name (a str), got {type(job).__name__}")
        try:
            if self._waits.info(job) is None:
                self._get_job(job)
            return str(job)
        except JobNotFoundError:
            if not is_name(job):
                raise
        runs = [info for info in self._waits.merged(self._list_jobs()) if run_of(info.id, job)]
        if not runs:
            raise JobNotFoundError(f"no job with id or name {job!r} on this {self.backend} cluster")
        return latest_run(runs, job)

    def _with_record(self, info: JobInfo) -> JobInfo:
        """info with its name, and (for a supervised job) what its log's record says."""
        return with_record(info, self._get_job_log_end)

    def node_status(self) -> list[dict[str, Any]]:
        """The nodes jobs run on, as far as this context can see them: `{"node": name, "total": {resource:
        quantity}, "free": {...}}` each (resource names as in node_resources). Empty where it cannot tell."""
        return []

    def running_work(self) -> dict[str, list[dict[str, Any]]] | None:
        """Tasks running and actors alive on the cluster, where another process can see them: `{"tasks":
        [{"name", "state", "node"}...], "actors": [{"name", "class", "state", "node"}...]}`; None where it cannot
        (in_memory and monarch tasks live inside their own driver)."""
        return None

    def describe(self) -> dict[str, str]:
        """Where this cluster is, for `fray status`: its address, or where its jobs are kept."""
        return {"address": self.address} if self.address else {}

    def engine_links(self) -> dict[str, str]:
        """The engine's own pages for this cluster (name -> URL: Ray's dashboard), for `fray dashboard`."""
        return {}

    def dashboard(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start this cluster's live page (docs/dashboard.md: its jobs, their states and attempts, its nodes) if it
        is not running, and return its URL, which holds the page's access token: keep it private. Loopback only
        unless `host` says otherwise; stops at shutdown."""
        with _DASHBOARD_LOCK:
            if self._shut_down:
                raise FrayError(f"this {self.backend} cluster context is shut down")
            if self._dashboard is None:
                from fray.dashboard import Dashboard
                from fray.dashboard.cluster import ClusterPage

                self._dashboard = Dashboard(ClusterPage(self), host, port)
            return str(self._dashboard.url)

    def persistent_jobs_unavailable(self) -> str:
        """Why this context keeps no job beyond its owner's life (the persistent_jobs refusal says it)."""
        return self._no_persistent_jobs()

    def tie_job(self, job_id: str) -> None:
        """Make a detached job end when this process ends, however it ends (what a job that is not detached
        does), while other processes can still reach it: `fray job submit` waiting for a job."""
        self._tie_job(job_id)

    def untie_job(self, job_id: str) -> None:
        """Undo tie_job (the job has ended, or is left running on purpose)."""
        self._untie_job(job_id)

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down  # (shutdown() has been called)

    def shutdown(self) -> None:
        """Release what this context started: its jobs that are not detached end; detached ones go on.
        Idempotent."""
        with _DASHBOARD_LOCK:
            if self._shut_down:
                return
            self._shut_down = True
        if self._dashboard is not None:
            self._dashboard.stop()
        self._waits.close()  # (before the backend's: a job it hands over meanwhile ends with the others)
        self._shutdown()

    @property
    def _waits(self) -> Waits:
        """The jobs this context holds back until those they wait for succeed (create_job(after=...))."""
        return waits_of(self, self._get_job, self._with_record, self.backend, self.describe)

    def __enter__(self) -> ClusterContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- backend hooks
    @abstractmethod
    def _create_job(
        self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool, job_id: str | None
    ) -> str:
        """Start the job in working_dir (an absolute path that exists here); detached only with persistent_jobs.
        With a job_id, create it under that id or raise JobExistsError if one exists, atomically: of two
        processes creating one id at once, one fails."""

    @abstractmethod
    def _list_jobs(self) -> list[JobInfo]: ...

    @abstractmethod
    def _get_job(self, job_id: str) -> JobInfo: ...

    @abstractmethod
    def _stop_job(self, job_id: str) -> None: ...

    @abstractmethod
    def _delete_job(self, job_id: str) -> None: ...

    @abstractmethod
    def _get_job_logs(self, job_id: str) -> str: ...

    @abstractmethod
    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo: ...

    @abstractmethod
    def _shutdown(self) -> None: ...

    def _tail_job_logs(self, job_id: str) -> Iterator[str]:
        """Default: poll the status, then the logs, and give what is new (polls 20 times a second at first, then
        down to twice a second while nothing comes). Backends with a log file of their own do better."""
        shown, pause = 0, 0.05
        while True:
            ended = self._get_job(job_id).status.is_terminal  # before reading: what it wrote before ending is read
            logs = self._get_job_logs(job_id)
            if len(logs) > shown:
                yield logs[shown:]
                shown, pause = len(logs), 0.05
            if ended:
                return
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def _get_job_log_end(self, job_id: str, lines: int) -> str:
        """The raw log's last `lines` lines (all of it, if it has fewer). Default: all of it, cut; backends with a
        log file read only its end (fray.jobs.local.read_log_end)."""
        return last_lines(self._get_job_logs(job_id), lines)

    def _job_python(self) -> str:
        """The interpreter a supervised job (fray.jobs.supervisor) runs with. Default: this one (jobs run on this
        machine, or on hosts with the same installation)."""
        return sys.executable

    def _job_backend(self) -> str | None:
        """The backend spec a job's bare `fray.init()` gets (its FRAY_BACKEND), naming this backend and, where it
        takes one, this cluster. Default: the backend's name. None: the cluster this context talks to sets it."""
        return self.backend

    def _no_persistent_jobs(self) -> str:
        """Why this context keeps no job beyond its owner's life (for the persistent_jobs refusal)."""
        return f"the {self.backend} backend's jobs live in the processes of the program that submitted them"

    def _tie_job(self, job_id: str) -> None:
        """Hook of tie_job. Default: no way to (a cluster the user started keeps its jobs)."""
        return None

    def _untie_job(self, job_id: str) -> None:
        """Hook of untie_job."""
        return None
