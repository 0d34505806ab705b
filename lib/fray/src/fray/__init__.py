"""Fray: write a distributed pipeline once, run it on in_memory threads, Ray, or Monarch.

import fray
ctx = fray.init()                      # FRAY_BACKEND, else "in_memory"
ref = ctx.create_task(pow, args=(2, 10))
assert ctx.get(ref) == 1024
"""

from typing import TYPE_CHECKING

from fray import _moved
from fray._lazy import lazy_face
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    ActorUnavailableError,
    BackendNotAvailableError,
    FrayError,
    GetTimeoutError,
    InfeasibleResourcesError,
    JobExistsError,
    JobFailedError,
    JobNotFoundError,
    ObjectLostError,
    ObjectStoreFullError,
    SerializationError,
    TaskCancelledError,
    UnsupportedFeatureError,
    WorkerCrashedError,
)

# Eager, unlike the rest: importing the registry installs how a process without a context makes its default one
# (fray.runtime.current), which a worker unpickling a function that refers to a context needs.
from fray.registry import available_backends, cluster, init, register_backend, shutdown

if TYPE_CHECKING:
    from fray.cluster_context import ClusterContext
    from fray.context import JobContext, get_job_context, set_job_context
    from fray.jobs.dirs import job_dir, resuming
    from fray.jobs.handle import JobHandle, wait_jobs
    from fray.runtime.capabilities import Capability
    from fray.runtime.completion import as_completed
    from fray.runtime.current import ActorInfo, clear_job_context, current_actor, current_gpus, using
    from fray.runtime.groups import ActorGroup
    from fray.runtime.refs import ActorHandle, ObjectRef
    from fray.runtime.streams import ObjectRefStream
    from fray.telemetry.transfers import PathStats
    from fray.types import (
        ActorOptions,
        JobAttempt,
        JobError,
        JobInfo,
        JobStatus,
        Lifetime,
        Resource,
        RuntimeEnv,
        TaskOptions,
    )

__getattr__, __dir__ = lazy_face(
    __name__,
    globals(),
    {
        "fray.cluster_context": "ClusterContext",
        "fray.context": "JobContext get_job_context set_job_context",
        "fray.jobs.dirs": "job_dir resuming",
        "fray.jobs.handle": "JobHandle wait_jobs",
        "fray.runtime.capabilities": "Capability",
        "fray.runtime.completion": "as_completed",
        "fray.runtime.current": "ActorInfo clear_job_context current_actor current_gpus using",
        "fray.runtime.groups": "ActorGroup",
        "fray.runtime.refs": "ActorHandle ObjectRef",
        "fray.runtime.streams": "ObjectRefStream",
        "fray.telemetry.transfers": "PathStats",
        "fray.types": "ActorOptions JobAttempt JobError JobInfo JobStatus Lifetime Resource RuntimeEnv TaskOptions",
    },
)

__version__ = "0.1.0"

_moved.install()  # the import paths of before fray-core's rooms, for one release

# fmt: off
__all__ = [
    "ActorAlreadyExistsError", "ActorDiedError", "ActorGroup", "ActorHandle", "ActorInfo", "ActorNotFoundError",
    "ActorOptions", "ActorUnavailableError", "BackendNotAvailableError", "Capability", "ClusterContext",
    "FrayError", "GetTimeoutError", "InfeasibleResourcesError", "JobAttempt", "JobContext", "JobError",
    "JobExistsError", "JobFailedError", "JobHandle", "JobInfo", "JobNotFoundError", "JobStatus", "Lifetime",
    "ObjectLostError", "ObjectRef", "ObjectRefStream", "ObjectStoreFullError", "PathStats", "Resource",
    "RuntimeEnv", "SerializationError", "TaskCancelledError", "TaskOptions", "UnsupportedFeatureError",
    "WorkerCrashedError", "as_completed", "available_backends", "clear_job_context", "cluster", "current_actor",
    "current_gpus", "get_job_context", "init", "job_dir", "register_backend", "resuming", "set_job_context",
    "shutdown", "using", "wait_jobs",
]
# fmt: on
