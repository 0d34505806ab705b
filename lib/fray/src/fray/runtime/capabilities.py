"""Capabilities: what a backend can do beyond the core semantics every backend gives.

A backend declares the set it has (`JobContext.capabilities`, `ClusterContext.capabilities`). Using a feature
whose capability is missing raises `UnsupportedFeatureError` naming it; conformance tests that need a missing
capability are skipped with its name.
"""

from __future__ import annotations

import enum


class Capability(enum.Enum):
    # Features with an API surface: using one the backend lacks raises UnsupportedFeatureError.
    DETACHED_ACTORS = "detached_actors"  # ActorOptions(lifetime=Lifetime.DETACHED)
    TASK_ENV_VARS = "task_env_vars"  # TaskOptions(runtime_env=RuntimeEnv(env={...}))
    TASK_PACKAGES = "task_packages"  # TaskOptions(runtime_env=RuntimeEnv(package_requirements=[...]))
    JOB_PACKAGES = "job_packages"  # ClusterContext.create_job(..., env=RuntimeEnv(package_requirements=[...]))
    JOB_RESOURCES = "job_resources"  # create_job(env=RuntimeEnv(minimum_resources=[...])): reserved for the job
    # create_job(..., detached=True): a job that outlives the process that submitted it and that another process
    # (another `fray job ...` command) can list, follow, stop and delete
    PERSISTENT_JOBS = "persistent_jobs"
    TASK_MAX_CALLS = "task_max_calls"  # TaskOptions(max_calls=N): a task's worker process is replaced after N calls
    CANCEL_RUNNING = "cancel_running"  # cancel(ref) of a task that has started running
    STREAMING = "streaming"  # TaskOptions(streaming=True), handle.method.stream(...): ObjectRefStream
    SPMD_GROUPS = "spmd_groups"  # create_actor_group(..., distributed=True): a process per member, torch env set
    # create_actor_group(distributed=True, options=ActorOptions(max_restarts=N)): a member's death restarts the
    # whole SPMD group together (every member on a fresh process, __init__ again on every rank)
    SPMD_GANG_RESTART = "spmd_gang_restart"
    ASYNC_ACTORS = "async_actors"  # `async def` actor methods run on an event loop inside the actor
    # Properties of the backend, with no call to refuse: tests that need them are skipped by name.
    PROCESS_ISOLATION = "process_isolation"  # tasks/actors run in other processes; a crash is contained
    MULTI_HOST = "multi_host"  # one context can span several machines
    ZERO_COPY_OBJECTS = "zero_copy_objects"  # get of a large numpy array does not copy it
    # an SPMD member whose process stops answering without dying (SIGSTOP, a machine gone quiet) is treated as
    # dead after FRAY_SPMD_HANG_TIMEOUT seconds (fray.runtime.gang.hang_timeout; 30 by default)
    SPMD_HANG_DETECTION = "spmd_hang_detection"
    # device values (CUDA tensors) the driver sends to another process of its host go as shares of its device
    # snapshot (fray.runtime.device_shares), not through host memory, in a context that knows every reader is on its
    # host (docs/gpus.md says which contexts and values, backend by backend)
    DEVICE_SHARES = "device_shares"
    # the spec option gpu_view=host: a process fray starts for work holding GPUs sees every GPU of its host, its
    # own first (fray.runtime.gpus.GPU_VIEWS); a backend without it refuses that option by this name
    GPU_HOST_VIEW = "gpu_host_view"

    @property
    def has_api(self) -> bool:
        """True if the capability is a feature a caller can ask for (and so be refused)."""
        return self not in _PROPERTIES


_PROPERTIES = frozenset(
    {
        Capability.PROCESS_ISOLATION,
        Capability.MULTI_HOST,
        Capability.ZERO_COPY_OBJECTS,
        Capability.SPMD_HANG_DETECTION,
        Capability.DEVICE_SHARES,
        Capability.GPU_HOST_VIEW,
    }
)
