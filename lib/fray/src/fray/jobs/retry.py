"""Retry in place: a new run of a finished job with the command, callable and options it was submitted with
(ClusterContext.retry_job, JobHandle.retry, `fray job retry`).

What a job was submitted with (its final command, which holds the supervisor's options; its environment, which
holds a callable's pickle; its working directory, resources and packages) is not all on any backend's record
(Ray's record keeps no callable: fray.jobs.call keeps it out), so the submitting process keeps it: one private
file (0600, in a private directory: fray.host.state_dir) per job in the state directory of the user on the host that
submitted it, under the cluster's identity. A job submitted elsewhere, or by another user, cannot be retried here:
retry says so. Files older than KEEP_DAYS are removed as new ones are written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fray.errors import FrayError
from fray.host.state_dir import state_subdir
from fray.jobs.requests import name_of
from fray.types import JobInfo, Resource, RuntimeEnv

__all__ = ["remember", "retry"]

KEEP_DAYS = 30


class _Cluster(Protocol):  # a ClusterContext (not imported: it imports this module)
    @property
    def backend(self) -> str: ...

    def describe(self) -> dict[str, str]: ...
    def get_job(self, job_id: str) -> JobInfo: ...
    def _submit(
        self, entrypoint: str | list[str], env: RuntimeEnv, directory: str, detached: bool, job_id: str | None
    ) -> str: ...
    def _submit_named(self, name: str, if_exists: str, submit: Callable[[str], str]) -> str: ...


def _where(cluster: _Cluster) -> Path:
    identity = json.dumps([cluster.backend, cluster.describe()], sort_keys=True)
    return state_subdir("job-submissions", f"{cluster.backend}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}")


def _path(cluster: _Cluster, job_id: str) -> Path:
    return _where(cluster) / f"{hashlib.sha256(job_id.encode()).hexdigest()[:32]}.json"


def remember(
    cluster: _Cluster, job_id: str, entrypoint: str | list[str], env: RuntimeEnv, directory: str, detached: bool
) -> None:
    """Keep what job_id was submitted with (replacing an older record of that id)."""
    record = {
        "id": job_id,
        "entrypoint": entrypoint,
        "env": dict(env.env),
        "packages": list(env.package_requirements),
        "resources": [[r.name, float(r.quantity)] for r in env.minimum_resources],
        "working_dir": directory,
        "detached": detached,
    }
    try:
        path = _path(cluster, job_id)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(partial, path)
        _prune(path.parent)
    except (OSError, FrayError):  # the job runs all the same; a retry of it says it is not kept here
        return


def _prune(directory: Path) -> None:
    old = time.time() - KEEP_DAYS * 86400
    for entry in os.scandir(directory):
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < old:
                os.unlink(entry.path)
        except OSError:
            continue  # (another process pruned it first)


def _recall(cluster: _Cluster, info: JobInfo) -> dict[str, Any]:
    try:
        fd = os.open(_path(cluster, info.id), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise FrayError(
            f"job {info.id} cannot be retried from here: its submission is kept by the process that submitted it, "
            "in that user's state directory on that host (submit it again, or retry it there)"
        ) from None
    with os.fdopen(fd) as f:
        record: dict[str, Any] = json.load(f)
    given = record["entrypoint"]
    text = given if isinstance(given, str) else shlex.join(given)
    if record.get("id") != info.id or text != info.entrypoint:
        raise FrayError(f"the submission kept for job {info.id} is not that job's (its command differs): not retried")
    return record


def retry(cluster: _Cluster, job_id: str) -> str:
    """Start a new run of the finished job `job_id` (an id) as it was submitted: a named job's next run
    (`NAME.K+1`), else a job with a new id. FrayError while it is pending or running, or where its submission is
    not kept here."""
    info = cluster.get_job(job_id)
    if not info.status.is_terminal:
        raise FrayError(
            f"job {job_id} is {info.status.value}: retry starts a finished job again; wait for it or stop it first"
        )
    record = _recall(cluster, info)
    env = RuntimeEnv(
        package_requirements=list(record["packages"]),
        minimum_resources=[Resource(str(n), float(q)) for n, q in record["resources"]],
        env={str(k): str(v) for k, v in record["env"].items()},
    )
    given = record["entrypoint"]
    command = given if isinstance(given, str) else [str(word) for word in given]

    def submit(new_id: str | None) -> str:
        return cluster._submit(command, env, str(record["working_dir"]), bool(record["detached"]), new_id)

    named = name_of(job_id)
    if named is not None:  # (a live run of the name refuses: JobExistsError naming it)
        return cluster._submit_named(named[0], "refuse", submit)
    return submit(None)
