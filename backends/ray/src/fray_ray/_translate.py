"""The translation between fray and Ray: fray's task, actor and job options as Ray's, and Ray's exceptions as
fray's."""

from __future__ import annotations

import math
import re
from typing import Any

import ray.exceptions as rex

from fray import errors
from fray.backend import (
    OWNER_SIGNALS_ALL_VAR,
    ActorRequest,
    Lifetime,
    RuntimeEnv,
    TaskRequest,
    kill_delay,
)
from fray.errors import RemoteExceptionProxy, attach_remote_traceback


# --------------------------------------------------------------------------------------- options
def _resource_options(resources: dict[str, float] | None, default_cpus: float) -> dict[str, Any]:
    raw = dict(resources or {})
    out: dict[str, Any] = {"num_cpus": float(raw.pop("CPU", default_cpus))}
    if "GPU" in raw:
        out["num_gpus"] = float(raw.pop("GPU"))
    if "memory" in raw:
        out["memory"] = int(raw.pop("memory"))
    custom = {k: float(v) for k, v in raw.items() if v}
    if custom:
        out["resources"] = custom
    return out


def entrypoint_options(env: RuntimeEnv) -> dict[str, Any]:
    """A job's RuntimeEnv.minimum_resources, reserved for its entrypoint by Ray's Job API."""
    out = _resource_options({r.name: float(r.quantity) for r in env.minimum_resources}, 0.0)
    mapped = {"entrypoint_num_cpus": out["num_cpus"]}
    if "num_gpus" in out:
        mapped["entrypoint_num_gpus"] = out["num_gpus"]
    if "memory" in out:
        mapped["entrypoint_memory"] = out["memory"]
    if "resources" in out:
        mapped["entrypoint_resources"] = out["resources"]
    return mapped


def runtime_env_dict(env: RuntimeEnv | None) -> dict[str, Any] | None:
    if env is None:
        return None
    out: dict[str, Any] = {}
    if env.env:
        out["env_vars"] = dict(env.env)
    if env.package_requirements:
        out["pip"] = list(env.package_requirements)
    return out or None


def stop_vars(grace: float) -> dict[str, str]:
    """A supervised job's variables for Ray's stop: Ray's JobSupervisor reads its wait before SIGKILL from its
    own environment (a job's env_vars), in whole seconds; and its SIGTERM reaches every rank (fray.jobs.policy)."""
    return {"RAY_JOB_STOP_WAIT_TIME_S": str(math.ceil(kill_delay(grace))), OWNER_SIGNALS_ALL_VAR: "1"}


def is_default_task(request: TaskRequest) -> bool:
    """True when Ray's defaults already say everything (1 CPU, 3 retries, no exception retries)."""
    options = request.options
    return (
        options.resources is None
        and options.runtime_env is None
        and options.name is None
        and options.max_calls is None
        and options.max_retries == 3
        and options.retry_exceptions is False
    )


def worker_calls(request: TaskRequest) -> int | None:
    """Ray's max_calls for a task: the user's, else 1 for a task holding GPUs. Ray sets CUDA_VISIBLE_DEVICES per
    task in a reused worker, but CUDA reads it once, when it starts in the process: a worker reused for a GPU task
    given another device computes on the first one. Ray's own max_calls=1 default for GPU functions applies only to
    `@ray.remote(num_gpus=...)`, not to `.options(num_gpus=...)`, which is how fray gives each call its GPUs."""
    if request.options.max_calls is not None:
        return request.options.max_calls
    return 1 if request.resource_dict().get("GPU", 0.0) > 0 else None


def task_options(request: TaskRequest) -> dict[str, Any]:
    options = request.options
    out = _resource_options(request.resource_dict(), 1.0)  # (with the runtime_env's minimum_resources)
    env = runtime_env_dict(options.runtime_env)
    if env:
        out["runtime_env"] = env
    if options.name:
        out["name"] = options.name
    out["max_retries"] = options.max_retries
    retry = options.retry_exceptions
    out["retry_exceptions"] = retry if isinstance(retry, bool) else list(retry)
    return out


def actor_options(request: ActorRequest) -> dict[str, Any]:
    # Actors hold only what they ask for (0 CPU by default), as fray's contract and Ray's runtime default say.
    options = request.options
    out = _resource_options(request.resource_dict(), 0.0)
    if options.name is not None:
        out["name"] = options.name  # get_if_exists is done by RayJobContext (Ray's is racy)
    if options.lifetime is Lifetime.DETACHED:
        out["lifetime"] = "detached"
    out["max_restarts"] = options.max_restarts
    out["max_concurrency"] = options.max_concurrency
    return out


# --------------------------------------------------------------------------------------- exceptions
_MEMBER_NAME = re.compile(r"^\s*name: (\S+)/(\d+)\s*$", re.MULTILINE)


def _member_prefix(message: str) -> str:
    """'member rank R of actor group G: ' when Ray's message names a group member (Ray names them "G/R")."""
    found = _MEMBER_NAME.search(message)
    if found is None:
        return ""
    group, rank = found.groups()
    label = "an unnamed actor group" if group.startswith("fray-group-") else f"actor group {group!r}"
    return f"member rank {rank} of {label}: "


def translate(exc: BaseException) -> BaseException:
    """The fray exception for a Ray exception (the user's original exception for a failed task)."""
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause
        if isinstance(cause, rex.RayError) and not isinstance(cause, rex.RayTaskError):
            # a plain RayError is Ray's stand-in for an exception that did not pickle
            cause = RemoteExceptionProxy("exception", str(cause)) if type(cause) is rex.RayError else translate(cause)
        if cause is None:
            return exc
        if getattr(cause, "remote_traceback", None) is None:
            attach_remote_traceback(cause, exc.__dict__.get("traceback_str") or str(exc))
        return cause  # type: ignore[no-any-return]
    if isinstance(exc, rex.RaySystemError) and "deserializ" in str(exc):
        # Ray could not unpickle a value where it landed (a result in the driver, an argument in a worker)
        text = str(exc)
        first = text.splitlines()[0] if text else type(exc).__name__
        error = errors.SerializationError(f"cannot deserialize a value where it arrived: {first}")
        return attach_remote_traceback(error, text)
    if isinstance(exc, rex.GetTimeoutError):
        return errors.GetTimeoutError(str(exc) or "get timed out")
    if isinstance(exc, rex.TaskCancelledError):
        return errors.TaskCancelledError(str(exc) or "the task was cancelled")
    if isinstance(exc, rex.ActorUnavailableError):
        return errors.ActorUnavailableError(_member_prefix(str(exc)) + str(exc))
    if isinstance(exc, rex.RayActorError):
        return errors.ActorDiedError(_member_prefix(str(exc)) + str(exc))
    if isinstance(exc, rex.WorkerCrashedError):
        return errors.WorkerCrashedError(str(exc))
    if isinstance(exc, rex.UnserializableException):
        return RemoteExceptionProxy("exception", str(exc))
    return exc
