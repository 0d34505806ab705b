"""The worker's side of a MonarchJobContext (the context of tasks and actors): each call is a request to the
coordinator actor in the driver's process, which serves it against the controller's tables."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fray.backend import (
    ActorRequest,
    Blob,
    GroupRequest,
    Member,
    ObjectRef,
    PathStats,
    ProcessEvents,
    StreamSource,
    TaskRequest,
    dumps_code,
)
from fray.errors import GetTimeoutError
from fray_monarch.core import runtime
from fray_monarch.core.calls import Call, pack_call
from fray_monarch.core.client import MemberIds
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import BACKEND, ActorDesc, Reply
from fray_monarch.workers.runtime import REPLY_MARGIN, WorkerRuntime
from fray_monarch.workers.tasks import lending

__all__ = ["RemoteStream", "WorkerClient"]

GROUP_MARGIN = 120.0  # creating a group starts a process per member: the coordinator's answer may take this long


def _reply(fut: Any, timeout: float | None) -> Reply:
    """The coordinator's answer to a request that waits up to `timeout` there."""
    try:
        reply: Reply = fut.get(timeout=None if timeout is None else timeout + REPLY_MARGIN)
    except TimeoutError as exc:
        raise GetTimeoutError("the fray coordinator did not answer in time") from exc
    return reply


def _desc(value: Any) -> ActorDesc:
    aid, class_name, methods, name = value
    return aid, class_name, methods, name


class RemoteStream:
    """The StreamSource of a stream consumed in a worker: each next item is asked of the coordinator."""

    def __init__(self, rt: WorkerRuntime, sid: str) -> None:
        self.rt = rt
        self.sid = sid

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        with lending():
            reply = _reply(self.rt.coord.stream_next.call_one(self.rt.credential, self.sid, timeout), timeout)
        if reply.timed_out:
            raise GetTimeoutError(f"no next item of the stream within {timeout} s")
        oid = reply.unwrap()
        return None if oid is None else ObjectRef(RefPayload(oid), BACKEND)  # its hold was counted there

    def close(self) -> None:
        if not self.rt.stopped:
            self.rt.coord.stream_close.broadcast(self.sid)


class WorkerClient:
    """A ControllerClient in a worker process (nodes: the context's node_resources, as the driver saw them)."""

    def __init__(self, rt: WorkerRuntime, nodes: list[dict[str, float]]) -> None:
        self.rt = rt
        self.coord = rt.coord
        self.credential = rt.credential  # proves which process asks (processes.ProcessPool.proven)
        self.nodes = nodes

    @staticmethod
    def _ask(fut: Any, timeout: float = REPLY_MARGIN) -> Any:
        """The value of the coordinator's answer (its error raised here)."""
        reply: Reply = fut.get(timeout=timeout)
        return reply.unwrap()

    def node_resources(self) -> list[dict[str, float]]:
        return [dict(n) for n in self.nodes]

    def encode_call(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        """Large arguments are registered as an object of this process's (the call keeps it until sent); the
        coordinator keeps the ref arguments alive from there."""
        blob, deps = pack_call(what, args, kwargs, self.rt.store.device_mode)
        wire, payload = self.rt.encode_call(blob)
        return Call(wire, [d.id for d in deps], [] if payload is None else [payload])

    def put(self, blob: Blob) -> RefPayload:
        payload, _ = self.rt.register(blob)
        return payload

    @property
    def device_mode(self) -> str:
        return self.rt.store.device_mode

    # ------------------------------------------------------------ tasks, actors, groups, streams
    def submit(self, fn: Callable[..., Any], call: Call, request: TaskRequest) -> RefPayload:
        fn_data = dumps_code(fn, f"task function {getattr(fn, '__qualname__', fn)}").data  # (keyed by its hash there)
        return RefPayload(
            self._ask(self.coord.submit.call_one(self.credential, fn_data, call.args, call.deps, request))
        )

    def stream(self, sid: str) -> StreamSource:
        return RemoteStream(self.rt, sid)

    def create_actor(
        self, klass: type, cls_data: bytes, call: Call, request: ActorRequest, member: Member | None
    ) -> ActorDesc:
        asked = self.coord.create_actor.call_one(self.credential, cls_data, call.args, call.deps, request, member)
        return _desc(self._ask(asked))

    def create_group(self, klass: type, cls_data: bytes, call: Call, group: GroupRequest) -> tuple[str, MemberIds]:
        asked = self.coord.create_group.call_one(self.credential, cls_data, call.args, call.deps, group)
        gid, members = self._ask(asked, REPLY_MARGIN + GROUP_MARGIN)
        return str(gid), [(str(aid), name) for aid, name in members]

    def call_actor(
        self, aid: str, class_name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RefPayload:
        call = self.encode_call(f"{class_name}.{method}", args, kwargs)
        request = self.coord.call_actor.call_one(self.credential, aid, method, call.args, call.deps)
        return RefPayload(self._ask(request))

    def call_actor_stream(self, aid: str, method: str, call: Call) -> StreamSource:
        request = self.coord.call_actor_stream.call_one(self.credential, aid, method, call.args, call.deps)
        return RemoteStream(self.rt, self._ask(request))

    def call_group(self, aids: list[str], method: str, call: Call) -> list[RefPayload]:
        request = self.coord.call_group.call_one(self.credential, aids, method, call.args, call.deps)
        return [RefPayload(oid) for oid in self._ask(request)]

    def kill_group(self, aids: list[str]) -> None:
        self._ask(self.coord.kill_group.call_one(aids))

    def get_actor(self, name: str) -> ActorDesc:
        return _desc(self._ask(self.coord.get_actor.call_one(name)))

    def kill(self, aid: str) -> None:
        self._ask(self.coord.kill.call_one(aid))

    def cancel(self, oid: str) -> None:
        self._ask(self.coord.cancel.call_one(oid))

    # ------------------------------------------------------------ waiting
    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        with lending():
            reply = _reply(self.coord.get.call_one(self.credential, [r.payload.id for r in refs], timeout), timeout)
        if reply.timed_out:
            raise GetTimeoutError(f"get did not finish within {timeout} s")
        values = reply.unwrap()
        return [self.rt.load(v, f"the value of {r!r}") for v, r in zip(values, refs, strict=True)]

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        with lending():
            oids = [r.payload.id for r in refs]
            reply = _reply(self.coord.wait.call_one(self.credential, oids, num_returns, timeout), timeout)
        return set(reply.unwrap())

    def outcomes(self, refs: list[ObjectRef]) -> None:
        """None: the core's one watcher thread asks `wait` (a request per ref's outcome would cost more)."""
        return None

    def future(self, ref: ObjectRef) -> Future[Any]:
        """Settled when the coordinator answers (a Monarch future's callback: no thread per ref)."""
        future: Future[Any] = Future()

        def settle(reply: Any, exc: BaseException | None) -> None:
            try:
                if exc is not None:
                    raise exc
                value = reply.unwrap()[0]
                future.set_result(self.rt.load(value, f"the value of {ref!r}"))
            except BaseException as error:  # the future carries it to whoever awaits
                future.set_exception(error)

        runtime.on_done(self.coord.get.call_one(self.credential, [ref.payload.id], None), settle)
        return future

    def transfer_stats(self) -> dict[str, PathStats]:
        """This process's own transfers (the driver's context sums those of every process)."""
        return self.rt.transfer_stats()

    def pull_events(self) -> list[ProcessEvents]:
        """None: a worker's context sees its own process's events (the driver's sees every process's)."""
        return []

    def close(self) -> None:
        """A worker's context belongs to the driver's: shutting it down from inside ends nothing."""
