"""What a MonarchJobContext needs of its controller, as one protocol with two transports: the driver's
context calls the Controller in its own process (driver_client.DriverClient); a worker's context asks the
coordinator actor in the driver's process (worker_client.WorkerClient)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from fray.backend import (
    ActorRequest,
    Blob,
    GroupRequest,
    Member,
    ObjectRef,
    Outcome,
    PathStats,
    ProcessEvents,
    StreamSource,
    TaskRequest,
)
from fray_monarch.core.calls import Call
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import ActorDesc

__all__ = ["ControllerClient", "MemberIds"]

MemberIds = list[tuple[str, str | None]]  # a group's members, by rank: (actor id, name)


class ControllerClient(Protocol):
    """One controller, seen from the process a context runs in. Refs returned are counted here."""

    def node_resources(self) -> list[dict[str, float]]: ...

    def encode_call(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        """A call's arguments ready to send (large ones stored here, as a put)."""
        ...

    def put(self, blob: Blob) -> RefPayload: ...

    @property
    def device_mode(self) -> str:
        """How this process serializes device values (fray.runtime.device_shares.values): its store decides."""
        ...

    def submit(self, fn: Callable[..., Any], call: Call, request: TaskRequest) -> RefPayload: ...

    def stream(self, sid: str) -> StreamSource:
        """Where the items of the stream `sid` are read (a streaming task's, an actor method's)."""
        ...

    def create_actor(
        self, klass: type, cls_data: bytes, call: Call, request: ActorRequest, member: Member | None
    ) -> ActorDesc: ...

    def create_group(self, klass: type, cls_data: bytes, call: Call, group: GroupRequest) -> tuple[str, MemberIds]: ...

    def call_actor(
        self, aid: str, class_name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RefPayload:
        """A call of one actor's method (encoded here: the driver sends plain arguments by a shorter path)."""
        ...

    def call_actor_stream(self, aid: str, method: str, call: Call) -> StreamSource: ...

    def call_group(self, aids: list[str], method: str, call: Call) -> list[RefPayload]: ...

    def kill_group(self, aids: list[str]) -> None: ...

    def get_actor(self, name: str) -> ActorDesc: ...

    def kill(self, aid: str) -> None: ...

    def cancel(self, oid: str) -> None: ...

    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        """The values, loaded here; the first failure in list order as soon as one has failed."""
        ...

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]: ...

    def outcomes(self, refs: list[ObjectRef]) -> list[Outcome] | None:
        """The refs' own outcomes, if this side has them (None: the core watches them through wait)."""
        ...

    def future(self, ref: ObjectRef) -> Future[Any]: ...

    def transfer_stats(self) -> dict[str, PathStats]: ...

    def pull_events(self) -> list[ProcessEvents]:
        """The events of the context's other processes since the last pull (fray.telemetry.events)."""
        ...

    def close(self) -> None:
        """The context is shut down (a worker's side has nothing to end: its context is the driver's)."""
        ...
