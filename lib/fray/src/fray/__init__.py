"""Fray: write a distributed pipeline once, run it on in_memory threads, Ray, or Monarch.

import fray
ctx = fray.init()                      # FRAY_BACKEND, else "in_memory"
ref = ctx.create_task(pow, args=(2, 10))
assert ctx.get(ref) == 1024
"""

from fray.capabilities import Capability
from fray.context import ClusterContext, JobContext
from fray.current import clear_job_context, get_job_context, set_job_context, using
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    ActorUnavailableError,
    BackendNotAvailableError,
    FrayError,
    GetTimeoutError,
    InfeasibleResourcesError,
    JobNotFoundError,
    ObjectLostError,
    ObjectStoreFullError,
    SerializationError,
    TaskCancelledError,
    UnsupportedFeatureError,
    WorkerCrashedError,
)
from fray.refs import ActorHandle, ObjectRef
from fray.registry import available_backends, cluster, init, shutdown
from fray.transfers import PathStats
from fray.types import ActorOptions, JobInfo, JobStatus, Lifetime, Resource, RuntimeEnv, TaskOptions

__version__ = "0.1.0"

__all__ = [
    "ActorAlreadyExistsError",
    "ActorDiedError",
    "ActorHandle",
    "ActorNotFoundError",
    "ActorOptions",
    "ActorUnavailableError",
    "BackendNotAvailableError",
    "Capability",
    "ClusterContext",
    "FrayError",
    "GetTimeoutError",
    "InfeasibleResourcesError",
    "JobContext",
    "JobInfo",
    "JobNotFoundError",
    "JobStatus",
    "Lifetime",
    "ObjectLostError",
    "ObjectRef",
    "ObjectStoreFullError",
    "PathStats",
    "Resource",
    "RuntimeEnv",
    "SerializationError",
    "TaskCancelledError",
    "TaskOptions",
    "UnsupportedFeatureError",
    "WorkerCrashedError",
    "available_backends",
    "clear_job_context",
    "cluster",
    "get_job_context",
    "init",
    "set_job_context",
    "shutdown",
    "using",
]
