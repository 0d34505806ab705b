"""MonarchJobContext: the JobContext of the client process, backed by a Controller."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fray.context import JobContext
from fray.errors import GetTimeoutError
from fray.groups import ActorGroup, Member
from fray.outcome import Outcome, first_failure
from fray.refs import ActorHandle, ObjectRef, public_methods
from fray.serialization import dumps
from fray.streams import ObjectRefStream
from fray.transfers import PathStats
from fray.types import ActorOptions, TaskOptions
from fray_monarch import _runtime
from fray_monarch.controller import Controller
from fray_monarch.protocol import StoreConfig
from fray_monarch.streaming import DriverStream
from fray_monarch.worker_runtime import BACKEND, CAPABILITIES, pack_call


class MonarchJobContext(JobContext):
    """Tasks and actors on a Monarch mesh of worker processes (this host, or hosts attached over TCP)."""

    backend = BACKEND
    capabilities = CAPABILITIES

    def __init__(
        self,
        hosts: list[Any],
        procs_per_host: int,
        host_resources: dict[str, float],
        stores: StoreConfig,
        on_shutdown: Callable[[], None] | None = None,
        host_mesh: Any = None,
        log_to_driver: bool = True,
    ) -> None:
        super().__init__()
        self.ctl = Controller(hosts, procs_per_host, host_resources, stores, host_mesh, log_to_driver)
        self._on_shutdown = on_shutdown

    def node_resources(self) -> list[dict[str, float]]:
        return self.ctl.node_resources()

    def _ref(self, payload: Any) -> ObjectRef:
        return ObjectRef(payload, BACKEND)

    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef:
        self._refuse_if_shut_down()
        fn_key, fn_data = self.ctl.scheduler.fn_blob(fn)
        blob, deps = pack_call(getattr(fn, "__qualname__", "task"), args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        payload = self.ctl.scheduler.submit(fn_key, fn_data, call, [d.id for d in deps], options, [*keep, *deps])
        return self._ref(payload)

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRefStream:
        payload = self._create_task(fn, args, kwargs, options).payload
        return ObjectRefStream(DriverStream(self.ctl.streams.get(payload.id), self.ctl.close_stream), BACKEND)

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        self._refuse_if_shut_down()
        blob, deps = pack_call(f"{handle.class_name}.{method}", args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        sid = self.ctl.actors.call_stream(handle.payload, method, call, [d.id for d in deps], [*keep, *deps])
        return ObjectRefStream(DriverStream(self.ctl.streams.get(sid), self.ctl.close_stream), BACKEND)

    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
        member: Member | None = None,
    ) -> ActorHandle:
        self._refuse_if_shut_down()
        cls_data = dumps(klass, f"actor class {klass.__qualname__}").data
        blob, deps = pack_call(klass.__qualname__, args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        aid, class_name, methods, name = self.ctl.actors.create(
            cls_data, klass.__name__, public_methods(klass), call, [d.id for d in deps], [*keep, *deps], options, member
        )
        return ActorHandle(aid, BACKEND, class_name, methods, name, ctx=self)

    def _create_actor_group(
        self,
        klass: type,
        count: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
        placement: str,
        strict: bool,
        distributed: bool,
    ) -> ActorGroup:
        """One Monarch actor mesh over a process mesh of its own (see meshgroups.py)."""
        self._refuse_if_shut_down()
        cls_data = dumps(klass, f"actor class {klass.__qualname__}").data
        blob, deps = pack_call(klass.__qualname__, args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        methods = public_methods(klass)
        gid, members = self.ctl.groups.create(
            cls_data,
            klass.__name__,
            methods,
            call,
            [d.id for d in deps],
            [*keep, *deps],
            options,
            count,
            placement,
            distributed,
        )
        handles = [ActorHandle(aid, BACKEND, klass.__name__, methods, name, ctx=self) for aid, name in members]
        return ActorGroup(handles, options.name, gid, ctx=self)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        self._refuse_if_shut_down()
        blob, deps = pack_call(f"{group.class_name}.{method}", args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        if deps:
            keep = [*keep, *deps]
        payloads = self.ctl.groups.call([h.payload for h in group.handles], method, call, [d.id for d in deps], keep)
        return [self._ref(p) for p in payloads]

    def _kill_group(self, group: ActorGroup) -> None:
        self.ctl.groups.kill([h.payload for h in group.handles])

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        self._refuse_if_shut_down()
        blob, deps = pack_call(f"{handle.class_name}.{method}", args, kwargs)
        call, keep = self.ctl.encode_call(blob)
        if deps:
            keep = [*keep, *deps]
        return self._ref(self.ctl.actors.call(handle.payload, method, call, [d.id for d in deps], keep))

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        entries = [self.ctl.directory.get(r.payload.id) for r in refs]
        outcomes = [e.outcome for e in entries]
        if sum(1 for o in outcomes if not o.done()) > 1:  # one wake-up for all (a group call's answers), not one per
            self.ctl.directory.wait(entries, len(entries), timeout, stop_on_failure=True)  # entry; or the first failure
        failed = first_failure(outcomes)  # the first failure in ref order, even where an earlier ref is not done
        if failed is not None:  # (as Ray)
            raise self.ctl.error_of(entries[failed])
        out = []
        for ref, entry in zip(refs, entries, strict=True):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.ctl.actors.resolve(entry, remaining):
                if os.environ.get("FRAY_MONARCH_DEBUG"):
                    print(self.ctl.debug_state(), file=sys.stderr)
                raise GetTimeoutError(f"get of {ref!r} did not finish within {timeout} s")
            if entry.error is not None:
                raise self.ctl.error_of(entry)
            out.append(self.ctl.value_of(entry))
        return out

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        return self.ctl.directory.wait([self.ctl.directory.get(r.payload.id) for r in refs], num_returns, timeout)

    def _outcomes(self, refs: list[ObjectRef]) -> list[Outcome]:
        """The directory's own outcomes (no value is loaded to tell)."""
        return self.ctl.directory.awaited([self.ctl.directory.get(r.payload.id) for r in refs])

    def _future(self, ref: ObjectRef) -> Future[Any]:
        """Settled by the entry's outcome (no thread per ref); the value is loaded on fray's callback loop, outside
        the controller's lock."""
        entry = self.ctl.directory.get(ref.payload.id)

        def load(outcome: Outcome) -> Any:
            del keep[:]  # (the object lived until the future has its value)
            if outcome.failed():
                raise self.ctl.error_of(entry)
            return self.ctl.value_of(entry)

        def call_soon(settle: Callable[[], None]) -> None:
            _runtime.loop().call_soon_threadsafe(settle)

        keep = [ref.payload]
        return self.ctl.directory.awaited([entry])[0].to_future(load, call_soon)

    def _put(self, obj: Any) -> ObjectRef:
        self._refuse_if_shut_down()
        return self._ref(self.ctl.put_blob(dumps(obj, f"put value {type(obj).__name__}", copy=False)))

    def _transfer_stats(self) -> dict[str, PathStats]:
        self._refuse_if_shut_down()
        return self.ctl.transfer_stats()

    def _get_actor(self, name: str) -> ActorHandle:
        aid, class_name, methods, actor_name = self.ctl.actors.info(name)
        return ActorHandle(aid, BACKEND, class_name, methods, actor_name, ctx=self)

    def _kill(self, handle: ActorHandle) -> None:
        self.ctl.actors.kill(handle.payload)

    def _cancel(self, ref: ObjectRef) -> None:
        self.ctl.scheduler.cancel(ref.payload.id)

    def _shutdown(self) -> None:
        self.ctl.shutdown()
        if self.ctl.log_file is not None:
            try:
                os.unlink(self.ctl.log_file)
            except OSError:
                pass
        if self._on_shutdown is not None:
            self._on_shutdown()
