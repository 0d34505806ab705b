"""MonarchJobContext: the JobContext of a Monarch mesh, in the driver and in its workers alike. Each hook packs
its call and hands it to the context's ControllerClient (client.py): the driver's calls its Controller, a
worker's asks the coordinator actor in the driver."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fray.backend import (
    RECORDER,
    ActorGroup,
    ActorHandle,
    ActorRequest,
    Capability,
    GroupRequest,
    JobContext,
    Kind,
    Member,
    ObjectRef,
    ObjectRefStream,
    Outcome,
    PathStats,
    ProcessEvents,
    RecordingChoice,
    TaskRequest,
    dumps,
    dumps_code,
    public_methods,
)
from fray_monarch.core.client import ControllerClient
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import BACKEND, ActorDesc

__all__ = ["BACKEND", "CAPABILITIES", "MonarchJobContext"]

CAPABILITIES = frozenset(
    {
        Capability.CANCEL_RUNNING,
        Capability.TASK_ENV_VARS,
        Capability.PROCESS_ISOLATION,
        Capability.MULTI_HOST,
        Capability.ZERO_COPY_OBJECTS,
        Capability.SPMD_GROUPS,
        Capability.SPMD_GANG_RESTART,  # driver/gangs.py
        Capability.SPMD_HANG_DETECTION,  # driver/gangs.py: pings
        Capability.STREAMING,
        Capability.ASYNC_ACTORS,
        Capability.GPU_HOST_VIEW,
        Capability.DEVICE_SHARES,  # a one-host context's (data/store.py: device_mode); several hosts' are staged
    }
)


class MonarchJobContext(JobContext):
    """Tasks and actors on a Monarch mesh of worker processes (this host, or hosts attached over TCP).

    The driver's context owns the mesh; the one inside tasks and actors (owns_resources=False) belongs to it."""

    backend = BACKEND
    capabilities = CAPABILITIES

    def __init__(
        self, client: ControllerClient, *, owns_resources: bool = True, recording: RecordingChoice | None = None
    ) -> None:
        super().__init__(owns_resources=owns_resources, recording=recording)
        self.client = client

    @property
    def ctl(self) -> Any:
        """The Controller behind a driver's context (tests, debugging); None in a worker."""
        return getattr(self.client, "ctl", None)

    def node_resources(self) -> list[dict[str, float]]:
        return self.client.node_resources()

    def _ref(self, payload: RefPayload) -> ObjectRef:
        return ObjectRef(payload, BACKEND)

    def _handle(self, desc: ActorDesc) -> ActorHandle:
        aid, class_name, methods, name = desc
        return ActorHandle(aid, BACKEND, class_name, methods, name, ctx=self)

    # ------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRef:
        call = self.client.encode_call(request.name, args, kwargs)
        submitted = time.time_ns()  # (before the task can start: its id comes back once it is queued)
        ref = self._ref(self.client.submit(fn, call, request))
        RECORDER.record_at(submitted, Kind.TASK_SUBMIT, ref.payload.id, request.name)
        return ref

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRefStream:
        sid = self._create_task(fn, args, kwargs, request).payload.id
        return ObjectRefStream(self.client.stream(sid), BACKEND)

    def _cancel(self, ref: ObjectRef) -> None:
        self.client.cancel(ref.payload.id)

    # ------------------------------------------------------------ actors and groups
    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle:
        cls_data = dumps_code(klass, f"actor class {klass.__qualname__}").data
        call = self.client.encode_call(klass.__qualname__, args, kwargs)
        handle = self._handle(self.client.create_actor(klass, cls_data, call, request, member))
        RECORDER.record(Kind.ACTOR_CREATE, handle.payload, klass.__name__, {"name": request.options.name})
        return handle

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        submitted = time.time_ns()
        ref = self._ref(self.client.call_actor(handle.payload, handle.class_name, method, args, kwargs))
        name = f"{handle.class_name}.{method}"
        RECORDER.record_at(submitted, Kind.CALL_SUBMIT, ref.payload.id, name, {"actor": handle.payload})
        return ref

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        call = self.client.encode_call(f"{handle.class_name}.{method}", args, kwargs)
        return ObjectRefStream(self.client.call_actor_stream(handle.payload, method, call), BACKEND)

    def _get_actor(self, name: str) -> ActorHandle:
        return self._handle(self.client.get_actor(name))

    def _kill(self, handle: ActorHandle) -> None:
        self._read_before_stopping()
        self.client.kill(handle.payload)

    def _read_before_stopping(self) -> None:
        """An actor's process may go with it: what it recorded and what it moved are read first."""
        self._event_store.refresh()
        self.client.transfer_stats()

    def _create_actor_group(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], group: GroupRequest
    ) -> ActorGroup:
        """One Monarch actor mesh over a process mesh of its own (see driver/meshgroups.py)."""
        cls_data = dumps_code(klass, f"actor class {klass.__qualname__}").data
        call = self.client.encode_call(klass.__qualname__, args, kwargs)
        gid, members = self.client.create_group(klass, cls_data, call, group)
        methods = public_methods(klass)
        handles = [ActorHandle(aid, BACKEND, klass.__name__, methods, name, ctx=self) for aid, name in members]
        return ActorGroup(handles, group.member.options.name, gid, ctx=self)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        name = f"{group.class_name}.{method}"
        call = self.client.encode_call(name, args, kwargs)
        submitted = time.time_ns()
        refs = [self._ref(p) for p in self.client.call_group([h.payload for h in group.handles], method, call)]
        for ref, member in zip(refs, group.handles, strict=True):
            RECORDER.record_at(submitted, Kind.CALL_SUBMIT, ref.payload.id, name, {"actor": member.payload})
        return refs

    def _kill_group(self, group: ActorGroup) -> None:
        self._read_before_stopping()
        self.client.kill_group([h.payload for h in group.handles])

    # ------------------------------------------------------------ objects
    def _put(self, obj: Any) -> ObjectRef:
        blob = dumps(obj, f"put value {type(obj).__name__}", copy=False, device_mode=self.client.device_mode)
        return self._ref(self.client.put(blob))

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        return self.client.get(refs, timeout)

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        return self.client.wait(refs, num_returns, timeout)

    def _outcomes(self, refs: list[ObjectRef]) -> list[Outcome] | None:
        return self.client.outcomes(refs)

    def _future(self, ref: ObjectRef) -> Future[Any]:
        return self.client.future(ref)

    def _transfer_stats(self) -> dict[str, PathStats]:
        return self.client.transfer_stats()

    def _pull_events(self) -> list[ProcessEvents]:
        return self.client.pull_events()

    def _shutdown(self) -> None:
        self.client.close()
