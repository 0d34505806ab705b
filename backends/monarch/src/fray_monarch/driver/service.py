"""What worker processes ask of the controller, through the Coordinator actor in the driver: create tasks,
actors and groups, call them, get and wait on objects, register their own values, report results and ref holds.

A request from a worker holds a ref to what it creates (`entry.remote[proc_key]`, counted there when the id
arrives) and keeps its arguments alive by id (the worker does not wait for the call to be sent).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

from fray.backend import ActorRequest, Blob, GroupRequest, Member, TaskRequest, first_failure, loads, public_methods
from fray.errors import FrayError
from fray_monarch.core import runtime
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import ActorDesc, Reply, StreamItem, TaskResult, WireValue, send_reply
from fray_monarch.driver.actor_registry import ActorRegistry
from fray_monarch.driver.directory import ObjectDirectory
from fray_monarch.driver.meshgroups import GroupRegistry
from fray_monarch.driver.scheduler import TaskScheduler
from fray_monarch.driver.streaming import StreamRegistry

__all__ = ["WorkerService"]


def _keep(args: WireValue, deps: list[str]) -> list[RefPayload]:
    """What a worker's call keeps alive until it is sent: the refs in its arguments, and its ref arguments."""
    return [RefPayload(i) for i in (*args.contained, *deps)]


class _Once:
    """Whoever takes it first answers (a completion, or the timeout)."""

    __slots__ = ("_lock", "taken")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = False

    def take(self) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        self.taken = True
        return True


class WorkerService:
    """The controller's parts as worker processes reach them; owns no state of its own."""

    def __init__(
        self,
        lock: threading.RLock,
        directory: ObjectDirectory,
        scheduler: TaskScheduler,
        streams: StreamRegistry,
        actors: ActorRegistry,
        groups: GroupRegistry,
        close_stream: Callable[[str], None],
    ) -> None:
        self.lock = lock
        self.directory = directory
        self.scheduler = scheduler
        self.streams = streams
        self.actors = actors
        self.groups = groups
        self.close_stream = close_stream  # the controller's: a stream's consumer has gone

    # ------------------------------------------------------------ tasks, actors, groups
    def submit(self, proc_key: str, fn_data: bytes, args: WireValue, deps: list[str], request: TaskRequest) -> str:
        key = hashlib.sha1(fn_data).hexdigest()  # (the driver's functions are keyed by a uuid: never the same)
        return self.scheduler.submit(key, fn_data, args, deps, request, _keep(args, deps), proc_key).id

    def create_actor(
        self,
        proc_key: str,
        cls_data: bytes,
        args: WireValue,
        deps: list[str],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorDesc:
        klass = loads(Blob(cls_data))
        methods = public_methods(klass)
        return self.actors.create(cls_data, klass.__name__, methods, args, deps, _keep(args, deps), request, member)

    def call_actor(self, proc_key: str, aid: str, method: str, args: WireValue, deps: list[str]) -> str:
        return self.actors.call(aid, method, args, deps, _keep(args, deps), proc_key).id

    def call_actor_stream(self, proc_key: str, aid: str, method: str, args: WireValue, deps: list[str]) -> str:
        return self.actors.call_stream(aid, method, args, deps, _keep(args, deps))

    def create_group(
        self,
        proc_key: str,
        cls_data: bytes,
        args: WireValue,
        deps: list[str],
        group: GroupRequest,
    ) -> tuple[str, list[tuple[str, str | None]]]:
        """A group created inside a task or actor (its creation is long: the coordinator's caller waits)."""
        klass = loads(Blob(cls_data))
        methods = public_methods(klass)
        return self.groups.create(cls_data, klass.__name__, methods, args, deps, _keep(args, deps), group)

    def call_group(self, proc_key: str, aids: list[str], method: str, args: WireValue, deps: list[str]) -> list[str]:
        return [p.id for p in self.groups.call(aids, method, args, deps, _keep(args, deps), proc_key)]

    def kill_group(self, aids: list[str]) -> None:
        self.groups.kill(aids)

    def get_actor(self, name: str) -> ActorDesc:
        return self.actors.info(name)

    def kill(self, aid: str) -> None:
        self.actors.kill(aid)

    def cancel(self, oid: str) -> None:
        self.scheduler.cancel(oid)

    # ------------------------------------------------------------ streams
    def stream_next(self, port: Any, proc_key: str, sid: str, timeout: float | None) -> None:
        self.streams.next_remote(port, proc_key, sid, timeout)

    # ------------------------------------------------------------ objects
    def get(self, port: Any, proc_key: str, oids: list[str], timeout: float | None) -> None:
        """A worker's get: the values' locators once all are done, or the first failure in list order as soon as
        one has failed (as the driver's get), or timed_out."""
        entries = [self.directory.get(o) for o in oids]
        once = _Once()

        def reply() -> None:
            if not once.take():
                return
            with self.lock:
                self.scheduler.blocked(proc_key, -1)
            failed = first_failure([e.outcome for e in entries])
            if failed is not None:
                send_reply(port, Reply(error=entries[failed].error))
            else:
                send_reply(port, Reply([e.value for e in entries]))

        def timed_out() -> None:
            if once.take():
                cancel()
                with self.lock:
                    self.scheduler.blocked(proc_key, -1)
                send_reply(port, Reply(timed_out=True))

        with self.lock:
            self.scheduler.blocked(proc_key, +1)
            self.scheduler.pump()
        cancel = self.directory.when(entries, len(entries), reply, stop_on_failure=True)
        if timeout is not None and not once.taken:
            runtime.call_later(timeout, timed_out)

    def wait(self, port: Any, proc_key: str, oids: list[str], num_returns: int, timeout: float | None) -> None:
        entries = [self.directory.get(o) for o in oids]
        once = _Once()

        def reply() -> None:
            if once.take():
                with self.lock:
                    self.scheduler.blocked(proc_key, -1)
                send_reply(port, Reply([i for i, e in enumerate(entries) if e.outcome.done()]))

        def timed_out() -> None:
            cancel()
            reply()

        with self.lock:
            self.scheduler.blocked(proc_key, +1)
            self.scheduler.pump()
        cancel = self.directory.when(entries, num_returns, reply)
        if timeout is not None and not once.taken:
            runtime.call_later(timeout, timed_out)

    def put(self, proc_key: str, oid: str, wire: WireValue) -> str:
        """A value made by a worker (its put, or large call arguments), under the id the worker chose."""
        with self.lock:
            try:
                entry, _ = self.directory.register(oid, proc_key, wire.value)
            except FrayError:
                runtime.log.warning("fray: a worker's put was refused", exc_info=True)
                raise
            entry.remote[proc_key] = 1
            self.directory.complete(entry, wire.value, None, wire.contained)
            return oid

    def report(
        self, proc_key: str, results: list[TaskResult | StreamItem], holds: list[str], releases: list[str]
    ) -> None:
        """A worker's batch of reports, in its FIFO order: holds, then results and stream items, then releases."""
        with self.lock:
            self.directory.hold(proc_key, holds)
            for result in results:
                try:
                    if isinstance(result, StreamItem):
                        if result.end:
                            self.scheduler.stream_ended(proc_key, result.stream)
                        self.streams.item(proc_key, result)
                    else:
                        self.scheduler.result(proc_key, result)
                except Exception:
                    runtime.log.exception("fray: bad report %s", result)
            self.directory.release(proc_key, releases)
            self.scheduler.pump()
