"""A named job's own directory, for its checkpoints: `fray.job_dir()` and `fray.resuming()`, called in the job.

The directory belongs to the job's name (create_job(name=...)): every attempt and every run of that name finds
the same one. It is private (mode 0700, owned by the user, never a symlink: fray.host.state_dir.private_dir). Where it
is:
`ROOT/NAME`, ROOT being the cluster's `job_dirs` spec option (`fray.cluster("ray?job_dirs=/shared/ckpt")`, a
directory that exists where the job runs: shared storage on a cluster of several hosts), else the job's host's
fray state directory (`job-dirs/NAME` in it): the same directory for every run on one host, not shared between
hosts.

`resuming()` is true when this attempt is not the job's first (FRAY_JOB_ATTEMPT > 1), or when the job's
directory already held something as the attempt began (a previous attempt or run of the name left a checkpoint).
The job's supervisor looks once before it starts an attempt's ranks (FRAY_JOB_RESUMING), so that a rank that
writes early does not make another rank think it resumes; in a job fray does not supervise (a plain named command)
it is looked at when resuming() is called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fray.errors import FrayError
from fray.host import settings
from fray.host.state_dir import private_dir, state_subdir


class _Cluster(Protocol):  # a ClusterContext (not imported: it imports this module)
    job_dirs: str | None


_C = TypeVar("_C", bound=_Cluster)

__all__ = [
    "NAME_VAR",
    "RESUMING_VAR",
    "ROOT_VAR",
    "SPEC_OPTION",
    "check_root",
    "cluster_with_job_dirs",
    "job_dir",
    "job_env",
    "resuming",
    "resuming_now",
]

NAME_VAR = settings.JOB_NAME.name  # a named job's name, in its environment
ROOT_VAR = settings.JOB_DIRS.name  # the cluster's job_dirs option, in its jobs' environment
RESUMING_VAR = settings.JOB_RESUMING.name  # "1" or "0": the supervisor's look before the attempt's ranks start
SPEC_OPTION = "job_dirs"


def check_root(root: str) -> str:
    """The job_dirs spec option: an absolute path (it must exist where the jobs run, which may not be here)."""
    if not root or not os.path.isabs(root):
        raise ValueError(f"job_dirs must be an absolute path (a directory on the jobs' shared storage), got {root!r}")
    return root


def job_dir(name: str | None = None) -> Path:
    """This job's directory (made if missing): see the module's docstring. FrayError outside a named job, or
    where the directory is not this user's (a symlink, another user's)."""
    name = name or settings.JOB_NAME.read()
    if not name:
        raise FrayError(
            "fray.job_dir() is the directory of a named job, and this process is not one: submit it with "
            "create_job(..., name=NAME) or `fray job submit --name NAME`"
        )
    root = settings.JOB_DIRS.read()
    if root is None:
        return private_dir(state_subdir("job-dirs") / name)
    if not os.path.isdir(root):
        raise FrayError(
            f"the cluster's job_dirs {root} is not a directory on this host ({os.uname().nodename}): make it, or "
            "mount the shared storage it names"
        )
    return private_dir(Path(root) / name)


def resuming_now(name: str | None, attempt: int) -> bool:
    """Whether an attempt beginning now resumes (see the module's docstring)."""
    if attempt > 1:
        return True
    if not name:
        return False
    with os.scandir(job_dir(name)) as entries:
        return any(True for _ in entries)


def resuming() -> bool:
    """True when this attempt of the job is not its first, or a previous attempt or run of its name left
    something in its directory (fray.job_dir()) before this attempt began."""
    flag = settings.JOB_RESUMING.read()
    if flag is not None:
        return flag
    return resuming_now(settings.JOB_NAME.read(), settings.JOB_ATTEMPT.read())


def cluster_with_job_dirs(make: Callable[..., _C], options: dict[str, Any]) -> _C:
    """make(**options), the backend's ClusterContext, with the job_dirs spec option (any backend's) taken out and
    kept on it for its jobs."""
    root = options.pop(SPEC_OPTION, None)
    ctx = make(**options)
    if root is not None:
        ctx.job_dirs = check_root(str(root))
    return ctx


def job_env(name: str | None, root: str | None) -> dict[str, str]:
    """The variables job_dir() reads, for a job submitted with this name to a cluster with this job_dirs."""
    return {**({NAME_VAR: name} if name else {}), **({ROOT_VAR: root} if root else {})}
