"""The in_memory JobContext: tasks and actors on threads of this process (the kit's thread engine, fray.kit).

It behaves like the distributed backends: arguments, results and put values are serialized by default (so an
unpicklable value or hidden shared state fails here, not on the cluster), resources are accounted, a failed
task raises its original exception type, refs passed as top-level arguments arrive as values. What it adds to
the kit: tasks with environment variables in a child process of their own (in_memory/_subprocess.py), and SPMD
members in processes that fail and restart together (in_memory/_process_member.py, _gang.py).
"""

from __future__ import annotations

from typing import Any

from fray.backend import (
    SHARED,
    ActorGroup,
    Blob,
    Capability,
    GroupRequest,
    KeptToken,
    ObjectRef,
    create_one_by_one,
    dumps,
    group_label,
    hang_timeout,
    loads,
    process_env,
    with_values,
)
from fray.in_memory._gang import Gang
from fray.kit import Actor, KitJobContext, Serialized, TaskRun

__all__ = ["InMemoryJobContext"]


class InMemoryJobContext(KitJobContext):
    backend = "in_memory"
    # Events off unless asked: three a task cost a no-op in-process task more than recording may
    # (fray.telemetry.events); the kit's other users pay them beside work that crosses a process
    records_by_default = False
    capabilities = frozenset(
        {
            Capability.DETACHED_ACTORS,  # detached actors outlive their context, within this process
            Capability.TASK_ENV_VARS,  # such tasks run in a child process with that environment
            # no worker process outlives a call to be replaced: a task runs on a thread of this process, or in a
            # child process of its own (runtime_env)
            Capability.TASK_MAX_CALLS,
            Capability.CANCEL_RUNNING,  # interrupted at the next Python bytecode, as Ray does
            Capability.ZERO_COPY_OBJECTS,  # get of numpy returns read-only views of the stored copy
            Capability.STREAMING,
            Capability.SPMD_GROUPS,  # SPMD members run in child processes of their own
            Capability.SPMD_GANG_RESTART,  # those processes fail and restart together (in_memory/_gang.py)
            Capability.SPMD_HANG_DETECTION,  # and send heartbeats
            Capability.ASYNC_ACTORS,
            Capability.DEVICE_SHARES,  # with its child processes (in_memory/_channel.py)
            Capability.GPU_HOST_VIEW,  # (its child processes': its threads see what the driver sees)
        }
    )

    def _run_task(self, run: TaskRun, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        env = run.request.options.runtime_env
        if env is not None and env.env:
            from fray.in_memory._subprocess import run_in_child

            return run_in_child(run.fn, args, kwargs, {**process_env(run.gpus, self.gpus), **env.env})
        return super()._run_task(run, args, kwargs)

    def _create_actor_group(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], group: GroupRequest
    ) -> ActorGroup:
        # An SPMD group's members share a Gang: one member's death stops (and restarts) them all.
        options = group.member.options
        label = group_label(klass.__name__, group.count, options.name)
        gang = Gang(label, group.count, options.max_restarts, hang_timeout()) if group.distributed else None
        return create_one_by_one(self, klass, args, kwargs, group, gang)

    # ------------------------------------------------------------------ SPMD members: a process each
    def _new_instance(self, actor: Actor, call: Any) -> Any:
        member = actor.member
        if member is None or not member.distributed:
            return super()._new_instance(actor, call)
        from fray.in_memory._process_member import ProcessMember

        args, kwargs = self._stored_call(call, f"the arguments of {actor.klass.__name__}()")
        cpus = actor.request.resource_dict().get("CPU")
        env = {**self._member_gpu_env(actor), **member.env}
        return ProcessMember(actor.klass, args, kwargs, actor.info, env, member.gang, cpus)

    def _run_method(self, actor: Actor, method: str, call: Any, life: int) -> Any:
        if actor.member is None or not actor.member.distributed:
            return super()._run_method(actor, method, call, life)
        # its process's call waits for, or fails with, its group's restart (a ProcessMember)
        args, kwargs = self._stored_call(call, f"the arguments of {actor.klass.__name__}.{method}")
        return actor.instance._fray_call(life, method, args, kwargs)

    def _stored_call(self, call: Any, what: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A call for a member process: its top-level refs by their objects as stored (a Serialized blob's buffers
        go there as they are, lent from this process's pool)."""
        args, kwargs = self._decode(call, what)
        return with_values(args, kwargs, self._stored_value_of)

    def _stored_value_of(self, ref: ObjectRef) -> Any:
        """A ref's object as stored: a Serialized blob, or the value itself; raises Failure if its task failed."""
        stored = self._entry_of(ref).result()
        if isinstance(stored, Blob) and any(type(k) is KeptToken for k in stored.keep):  # CUDA copies kept here:
            stored = dumps(loads(stored, "a stored value"), "a stored value", device_mode=SHARED)  # (its share)
        return Serialized(stored) if isinstance(stored, Blob) else stored

    def _member_gpu_env(self, actor: Actor) -> dict[str, str]:
        """An SPMD member's GPU variables: it sees its whole group's devices, in rank order, so that
        `torch.cuda.set_device(LOCAL_RANK)` picks its own (as torchrun's members see the host's)."""
        gang = actor.member.gang if actor.member is not None else None
        if not actor.gpus or gang is None:
            return process_env(actor.gpus, self.gpus)
        group = gang.devices_of_all(actor.info.rank, actor.gpus, lambda: actor.death is not None)
        return process_env(actor.gpus, self.gpus, visible=group)
