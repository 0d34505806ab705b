"""The driver's side of a MonarchJobContext: its calls go straight to the Controller in this process, and its
gets and waits read the controller's object directory here."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fray.backend import (
    ActorRequest,
    Blob,
    GroupRequest,
    HostGpus,
    Member,
    ObjectRef,
    Outcome,
    PathStats,
    ProcessEvents,
    RecordingChoice,
    StreamSource,
    TaskRequest,
    first_failure,
    plain_pickle,
    public_methods,
    rebuild,
    settings,
    wait_for_get,
)
from fray.errors import GetTimeoutError
from fray_monarch.core import runtime
from fray_monarch.core.calls import Call, contained_ids, pack_call
from fray_monarch.core.client import MemberIds
from fray_monarch.core.context import MonarchJobContext
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import ActorDesc, Inline, StoreConfig, Value, WireValue
from fray_monarch.driver.controller import Controller
from fray_monarch.driver.directory import Entry
from fray_monarch.driver.functions import TaskFunctions
from fray_monarch.driver.streaming import DriverStream

__all__ = ["DriverClient", "driver_context"]


def driver_context(
    hosts: list[Any],
    procs_per_host: int,
    host_resources: dict[str, float],
    stores: StoreConfig,
    on_shutdown: Callable[[], None] | None = None,
    host_mesh: Any = None,
    log_to_driver: bool = True,
    host_addresses: list[str] | None = None,
    gpus: HostGpus | None = None,
    recording: RecordingChoice | None = None,
) -> MonarchJobContext:
    """A new context with a controller of its own: worker processes on `hosts` (see fray_monarch.cluster.topology),
    whose host workers listen at `host_addresses` (none: this machine, or a Monarch job object's hosts), with
    `gpus` on each host (none: as many as host_resources says, of those found here, each process seeing its own)."""
    ctl = Controller(hosts, procs_per_host, host_resources, stores, host_mesh, log_to_driver, host_addresses, gpus)
    return MonarchJobContext(DriverClient(ctl, on_shutdown), recording=recording)


class DriverClient:
    """A ControllerClient in the controller's own process (on_shutdown: what else ends with the context, such as
    the hosts its topology launched)."""

    def __init__(self, ctl: Controller, on_shutdown: Callable[[], None] | None = None) -> None:
        self.ctl = ctl
        self._functions = TaskFunctions()
        self.on_shutdown = on_shutdown

    def node_resources(self) -> list[dict[str, float]]:
        return self.ctl.node_resources()

    # ------------------------------------------------------------ the driver's values
    def put(self, blob: Blob) -> RefPayload:
        """A value made in the driver: stored in the driver's store (large) or inline."""
        return self._store(blob)[0]

    def _store(self, blob: Blob) -> tuple[RefPayload, Value]:
        """put, with where the value now is (what a call that carries it sends)."""
        ctl = self.ctl
        with ctl.lock:
            entry, payload = ctl.directory.new(ctl.ids.object())
        value = ctl.store.encode(blob, entry.id)
        with ctl.lock:
            ctl.directory.complete(entry, value, None)
            entry.keep = list(blob.contained)
        return payload, value

    @property
    def device_mode(self) -> str:
        return self.ctl.store.device_mode

    def encode_call(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        """The call keeps alive its ref arguments, the refs inside its arguments and, when they are large, their
        object (stored like a put), until it is sent."""
        data = self._small_plain(args, kwargs)
        return self._pack(what, args, kwargs) if data is None else Call(WireValue(Inline(data)), [], [])

    def _small_plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | None:
        """The pickle of small plain arguments (most calls': no refs, no buffers, under the inline limit), which
        is all such a call needs; None for any other."""
        data = plain_pickle((args, kwargs))
        return data if data is not None and len(data) < self.ctl.store.inline_limit else None

    def _pack(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        """encode_call of arguments that are not small and plain: refs, buffers, anything large."""
        blob, deps = pack_call(what, args, kwargs, self.ctl.store.device_mode)
        contained = contained_ids(blob)
        if blob.nbytes < self.ctl.store.inline_limit and not blob.share_tokens():
            return Call(WireValue(Inline.of(blob), contained), [d.id for d in deps], [*blob.contained, *deps])
        payload, value = self._store(blob)
        wire = WireValue(value, contained)
        return Call(wire, [d.id for d in deps], [payload, *blob.contained, *deps])

    def _load(self, entry: Entry) -> Any:
        return self.ctl.store.load(entry.stored(), f"the value of object {entry.id}")

    # ------------------------------------------------------------ tasks, actors, groups, streams
    def submit(self, fn: Callable[..., Any], call: Call, request: TaskRequest) -> RefPayload:
        fn_key, fn_data = self._functions.blob(fn)
        return self.ctl.scheduler.submit(fn_key, fn_data, call.args, call.deps, request, call.keep)

    def stream(self, sid: str) -> StreamSource:
        return DriverStream(self.ctl.streams.get(sid), self.ctl.close_stream)

    def create_actor(
        self, klass: type, cls_data: bytes, call: Call, request: ActorRequest, member: Member | None
    ) -> ActorDesc:
        methods = public_methods(klass)
        return self.ctl.actors.create(
            cls_data, klass.__name__, methods, call.args, call.deps, call.keep, request, member
        )

    def create_group(self, klass: type, cls_data: bytes, call: Call, group: GroupRequest) -> tuple[str, MemberIds]:
        methods = public_methods(klass)
        return self.ctl.groups.create(cls_data, klass.__name__, methods, call.args, call.deps, call.keep, group)

    def call_actor(
        self, aid: str, class_name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RefPayload:
        data = self._small_plain(args, kwargs)
        if data is not None:  # (an actor round trip's usual call)
            return self.ctl.actors.call_plain(aid, method, data)
        call = self._pack(f"{class_name}.{method}", args, kwargs)
        return self.ctl.actors.call(aid, method, call.args, call.deps, call.keep)

    def call_actor_stream(self, aid: str, method: str, call: Call) -> StreamSource:
        return self.stream(self.ctl.actors.call_stream(aid, method, call.args, call.deps, call.keep))

    def call_group(self, aids: list[str], method: str, call: Call) -> list[RefPayload]:
        return self.ctl.groups.call(aids, method, call.args, call.deps, call.keep)

    def kill_group(self, aids: list[str]) -> None:
        self.ctl.groups.kill(aids)

    def get_actor(self, name: str) -> ActorDesc:
        return self.ctl.actors.info(name)

    def kill(self, aid: str) -> None:
        self.ctl.actors.kill(aid)

    def cancel(self, oid: str) -> None:
        self.ctl.scheduler.cancel(oid)

    # ------------------------------------------------------------ waiting
    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        directory = self.ctl.directory
        if len(refs) == 1:  # (an actor round trip's get: the same steps, without the lists)
            return [self._resolved(refs[0], directory.get(refs[0].payload.id), timeout, timeout)]
        deadline = None if timeout is None else time.monotonic() + timeout
        entries = [directory.get(r.payload.id) for r in refs]
        outcomes = [e.outcome for e in entries]
        if sum(1 for o in outcomes if not o.done()) > 1:  # one wake-up for all (a group call's answers), not one per
            failed = wait_for_get(directory.awaited(entries), timeout)  # entry (fray.runtime.outcome: get's one rule)
        else:  # (one left: read below, an actor's reply from its future)
            failed = first_failure(outcomes)  # the first failure in ref order, even where an earlier ref is not done
        if failed is not None:  # (as Ray)
            raise rebuild(entries[failed].error)
        out = []
        for ref, entry in zip(refs, entries, strict=True):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(self._resolved(ref, entry, remaining, timeout))
        return out

    def _resolved(self, ref: ObjectRef, entry: Entry, remaining: float | None, timeout: float | None) -> Any:
        """The value of entry, waiting up to `remaining` seconds (an actor's reply is read from its future here)."""
        if not self.ctl.actors.resolve(entry, remaining):
            if settings.MONARCH_DEBUG.read():
                print(self.ctl.debug_state(), file=sys.stderr)
            raise GetTimeoutError(f"get of {ref!r} did not finish within {timeout} s")
        outcome = entry.outcome
        if outcome.failed():
            raise rebuild(outcome.error)
        return self._load(entry)

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        directory = self.ctl.directory
        return directory.wait([directory.get(r.payload.id) for r in refs], num_returns, timeout)

    def outcomes(self, refs: list[ObjectRef]) -> list[Outcome]:
        """The directory's own outcomes (no value is loaded to tell)."""
        directory = self.ctl.directory
        return directory.awaited([directory.get(r.payload.id) for r in refs])

    def future(self, ref: ObjectRef) -> Future[Any]:
        """Settled by the entry's outcome (no thread per ref); the value is loaded on fray's callback loop, outside
        the controller's lock."""
        entry = self.ctl.directory.get(ref.payload.id)

        def load(outcome: Outcome) -> Any:
            del keep[:]  # (the object lived until the future has its value)
            if outcome.failed():
                raise rebuild(entry.error)
            return self._load(entry)

        def call_soon(settle: Callable[[], None]) -> None:
            runtime.loop().call_soon_threadsafe(settle)

        keep = [ref.payload]
        return self.ctl.directory.awaited([entry])[0].to_future(load, call_soon)

    def transfer_stats(self) -> dict[str, PathStats]:
        return self.ctl.transfer_stats()

    def pull_events(self) -> list[ProcessEvents]:
        return self.ctl.events.pull()

    def close(self) -> None:
        self.ctl.shutdown()
        if self.ctl.log_file is not None:
            try:
                os.unlink(self.ctl.log_file)
            except OSError:
                pass
        if self.on_shutdown is not None:
            self.on_shutdown()
