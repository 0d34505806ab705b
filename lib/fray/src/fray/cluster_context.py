"""ClusterContext: whole jobs (a shell command or argv, its environment, its logs) on a backend's cluster.

Its public methods validate input and enforce the shared semantics; backends implement the `_hooks`.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from fray._validation import check_timeout
from fray.capabilities import Capability
from fray.errors import UnsupportedFeatureError
from fray.interrupts import interrupted
from fray.plain_text import plain, plain_pieces
from fray.types import JobInfo, RuntimeEnv

__all__ = ["ClusterContext"]

# fray.registry.ENV_VAR (not imported: the registry imports this module)
BACKEND_VAR = "FRAY_BACKEND"


def _interruptible(pieces: Iterator[str], what: str) -> Iterator[str]:
    try:
        yield from pieces
    except KeyboardInterrupt as exc:
        raise interrupted(exc, what) from None


class ClusterContext(ABC):
    """Run whole programs (jobs) as commands, watch their status, follow and read their logs, stop them."""

    backend: ClassVar[str] = "?"
    # What this context can do; a backend's class declares it, and one context may have less than its class (a
    # Ray head private to this process keeps no job once this process ends: no persistent_jobs).
    capabilities: frozenset[Capability] = frozenset()
    # Where jobs run when create_job is given no working_dir: None means the caller's current directory.
    default_working_dir: str | None = None
    # Where other processes reach this cluster (Ray: its dashboard URL; monarch: its head's socket); None where
    # its jobs live in this process only.
    address: str | None = None
    _shut_down: bool = False  # set by the first shutdown(); later ones do nothing

    def create_job(
        self,
        entrypoint: str | Sequence[str],
        env: RuntimeEnv | None = None,
        working_dir: str | os.PathLike[str] | None = None,
        detached: bool = False,
    ) -> str:
        """Start `entrypoint` (a shell command string, or an argv list run without a shell); return its id.

        working_dir: the directory the job runs in (default: the caller's current directory). On this machine the
        job runs in place there; a backend whose jobs run elsewhere may send it along (Ray uploads a directory as
        its working_dir only when one is named, as `ray job submit` does).
        detached: the job outlives this process and this context, and any process can find it (list, logs, stop,
        delete); needs the persistent_jobs capability. A job that is not detached ends when its owner ends,
        however the owner ends, unless it runs on a cluster the user started (whose jobs outlive their submitter).
        """
        if isinstance(entrypoint, str):
            if not entrypoint.strip():
                raise ValueError("entrypoint must not be empty")
        elif isinstance(entrypoint, (list, tuple)):
            if not entrypoint or not all(isinstance(a, str) for a in entrypoint):
                raise TypeError("an argv entrypoint must be a non-empty list of strings")
            entrypoint = list(entrypoint)
        else:
            raise TypeError(f"entrypoint must be a str or a list of str, got {type(entrypoint).__name__}")
        if env is not None and not isinstance(env, RuntimeEnv):
            raise TypeError(f"env must be a fray.RuntimeEnv, got {type(env).__name__}")
        if env is not None and env.package_requirements and Capability.JOB_PACKAGES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_PACKAGES, self.backend, "RuntimeEnv.package_requirements")
        if env is not None and env.maximum_resources:
            raise ValueError(
                "RuntimeEnv.maximum_resources bounds a task's request; no backend can cap a whole job's usage. "
                "Use minimum_resources to reserve resources for the job."
            )
        if env is not None and env.minimum_resources and Capability.JOB_RESOURCES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_RESOURCES, self.backend, "RuntimeEnv.minimum_resources")
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
        return self._create_job(entrypoint, self._reaching_this_cluster(env or RuntimeEnv()), directory, detached)

    def _reaching_this_cluster(self, env: RuntimeEnv) -> RuntimeEnv:
        # A job's bare fray.init() reads FRAY_BACKEND: without it set here, it would read the submitter's (or
        # nothing, and run on in_memory) whatever backend the job was submitted to. The job's own env wins.
        spec = self._job_backend()
        if spec is None or BACKEND_VAR in env.env:
            return env
        return replace(env, env={BACKEND_VAR: spec, **env.env})

    def list_jobs(self) -> list[JobInfo]:
        """Every job this context can see, oldest first where the backend knows the order."""
        return self._list_jobs()

    def get_job(self, job_id: str) -> JobInfo:
        """The current JobInfo of one job (JobNotFoundError if unknown)."""
        return self._get_job(job_id)

    def stop_job(self, job_id: str) -> None:
        """Stop a pending or running job (its whole process group: SIGTERM, then SIGKILL after a grace period) and
        return once it has ended. It ends STOPPED and stays listed, with its logs. A job that has already ended is
        left as it is."""
        self._stop_job(job_id)

    def delete_job(self, job_id: str) -> None:
        """Stop the job if it runs (its whole process group), then forget it."""
        self._delete_job(job_id)

    def get_job_logs(self, job_id: str) -> str:
        """Everything the job wrote to stdout and stderr so far (readable while it runs and after), as plain text:
        terminal escape sequences (colours) removed (fray.plain_text)."""
        return plain(self._get_job_logs(job_id))

    def tail_job_logs(self, job_id: str) -> Iterator[str]:
        """Follow the job's output: an iterator of text pieces, first what the job wrote so far, then each new
        piece as it comes; it ends once the job has ended and everything it wrote has been given. Joined, the
        pieces are the job's whole log (as get_job_logs gives it). Unknown ids raise JobNotFoundError here, not
        at the first piece."""
        self._get_job(job_id)
        return _interruptible(plain_pieces(self._tail_job_logs(job_id)), f"the log of job {job_id}")

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job ends; GetTimeoutError after timeout."""
        try:
            return self._wait_job(job_id, check_timeout(timeout))
        except KeyboardInterrupt as exc:
            raise interrupted(exc, f"job {job_id}") from None

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

    def shutdown(self) -> None:
        """Release what this context started: its jobs that are not detached end; detached ones go on.
        Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self._shutdown()

    def __enter__(self) -> ClusterContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- backend hooks
    @abstractmethod
    def _create_job(self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool) -> str:
        """Start the job in working_dir (an absolute path that exists here); detached only with persistent_jobs."""

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
