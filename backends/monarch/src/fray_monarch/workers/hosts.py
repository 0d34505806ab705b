"""The Monarch actors of a worker process: WorkerHost (one per process: runs its tasks, answers the controller's
messages about the process: frees, capacity, stream stops, death watches) and FrayActorHost (one per fray actor:
its instance, its calls, in order, on threads, or on an event loop of its own for async actors, and the streams
of its generator methods).

One module on purpose: a new process's WorkerHost and actor host are unpickled on two threads at once, and two
threads importing different modules that share imports can deadlock (Python 3.11 then hands one of them a
half-initialized module, which killed the process). Both class references go through this module's import lock:
one thread imports everything, the other waits.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import queue
import threading
from typing import Any, cast

from fray.backend import (
    ENV_HELD,
    RECORDER,
    ActorInfo,
    Blob,
    Kind,
    ObjectRef,
    async_methods,
    capture_exception,
    dumps,
    free_port,
    held_from_env,
    loads,
    plain_pickle,
    serve_store,
    use_held_device,
    worker_env_defaults,
)
from fray.backend import current as fray_current
from fray.backend import worker_output as fray_output
from fray.errors import ActorDiedError
from fray_monarch.core import environ, runtime
from fray_monarch.core.calls import fill_deps
from fray_monarch.core.monarch_api import Actor, endpoint
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import (
    BACKEND,
    ActorCall,
    ActorReply,
    Inline,
    PlainReply,
    ProcInfo,
    ReplyStatus,
    WireValue,
    WorkerSetup,
    expand,
)
from fray_monarch.workers.actor_ports import CompactingPort, TaggedPort, end_data
from fray_monarch.workers.process import ensure_worker, mesh_index

__all__ = ["FrayActorHost", "WorkerHost"]


# A process fray starts that dies of a fatal signal prints the Python stack of each thread on its way out.
faulthandler.enable()


class WorkerHost(Actor):
    """Runs tasks in its process (one per worker process); a never-answered `watch` call reports its death."""

    def __init__(self, setup: WorkerSetup | list[WorkerSetup], env: dict[str, str], cpus: float | None = None) -> None:
        # env: a process for tasks with these variables (ensure_env); cpus: those of the one actor it is for
        environ.publish({**worker_env_defaults(cpus), **env})
        runtime.start_client_context()  # before anything prints Monarch's banner (see runtime.BANNER)
        self.worker = ensure_worker(setup, mesh_index())
        self.rt = self.worker.rt
        self.tasks = self.worker.tasks
        self.watchers: list[Any] = []

    def __cleanup__(self, exc: Any) -> None:
        self.rt.stop()  # no more reports: this process is being stopped

    @endpoint
    def run(self, batch: list[Any]) -> None:
        self.tasks.enqueue(batch)

    @endpoint
    def free(self, allocs: list[int]) -> None:
        self.rt.store.free(allocs)

    @endpoint
    def transfer_stats(self) -> Any:
        return self.rt.transfer_stats()

    @endpoint
    def events(self) -> dict[str, Any]:
        """This process's events not handed over yet (the others went with its reports), as plain data."""
        return RECORDER.take().to_json()

    @endpoint
    def cancel(self, tid: str) -> str:
        return self.tasks.cancel(tid)

    @endpoint
    def set_capacity(self, capacity: dict[str, float]) -> None:
        self.tasks.set_capacity(capacity)

    @endpoint
    def exit_process(self) -> None:
        """This process belongs to one member of a group's mesh, which was killed (a slice of a proc mesh cannot
        be stopped): end it."""
        self.rt.stop()
        os._exit(0)

    @endpoint
    def spmd_master(self, loopback: bool = False) -> tuple[str, int]:
        """This host's address (127.0.0.1 if `loopback`: every member is here) and a TCP port free on it now
        (MASTER_ADDR and MASTER_PORT of an SPMD group whose rank 0 is here)."""
        address = "127.0.0.1" if loopback else self.rt.bind
        return address, free_port(address)

    @endpoint
    def unqueue(self, count: int) -> list[str]:
        return self.tasks.unqueue(count)

    @endpoint
    def stop_stream(self, sid: str) -> None:
        """The consumer of a stream produced in this process has gone (handled here, not by the producing actor,
        which is busy running the generator)."""
        self.rt.stop_stream(sid)

    @endpoint(explicit_response_port=True)
    def watch(self, port: Any) -> None:
        self.watchers.append(port)  # never answered: the caller's future fails when this process dies

    @endpoint
    def state(self) -> dict[str, Any]:
        return self.tasks.state()

    @endpoint
    def ping(self) -> ProcInfo:
        return ProcInfo(os.getpid(), runtime.machine_id())


class FrayActorHost(Actor):
    """Hosts one fray actor instance. With max_concurrency 1, methods run in order on this Monarch actor's own
    driver thread (Monarch 0.7 gives each synchronous actor one, so blocking here stalls no other actor); with
    more, on up to max_concurrency threads of this actor. Replies go through the response port.

    An actor whose class has `async def` methods runs every call on one event loop of its own (a thread), at most
    max_concurrency at once (an asyncio.Semaphore), in the order they arrive; its plain methods run in a thread
    from there (asyncio.to_thread), so they count against the same limit and never block the loop."""

    def __init__(
        self, setup: WorkerSetup | list[WorkerSetup], max_concurrency: int, owns_process: bool = False
    ) -> None:
        self.index = mesh_index()  # which member of a group's mesh this is (0 for a lone actor)
        worker = ensure_worker(setup, self.index)
        self.rt = worker.rt
        self.ctx = worker.ctx  # the process's job context: current in every call
        self.owns_process = owns_process  # then fray.current_actor() is this actor in every thread of the process
        self.info = ActorInfo()
        self.gpus: tuple[int, ...] = ()  # the GPUs it holds (its process sees them): fray.current_gpus() in calls
        self.obj: Any = None
        self.init_error: str | None = None
        self.max_threads = max(1, max_concurrency)
        self.calls: queue.SimpleQueue[tuple[Any, Any, tuple[Any, ...]]] = queue.SimpleQueue()
        self.threads_lock = threading.Lock()
        self.n_threads = 0
        self.idle = 0  # threads free and not yet claimed by a submitted call
        self.init_done = threading.Event()  # __init__ has run (or raised): calls wait for it
        self.replies: Any = None
        self.async_methods: frozenset[str] = frozenset()
        self.loop: asyncio.AbstractEventLoop | None = None  # an async actor's event loop
        self.slots: asyncio.Semaphore | None = None
        self.label: str | None = None  # `(ClassName pid=N)`: the prefix of this actor's output lines
        self.call_data: dict[str, Any] = {}  # what its call.start events say (fray.telemetry.events)

    def _args(self, call: WireValue, deps: list[str], what: str) -> tuple[Any, Any]:
        args, kwargs = self.rt.load(call.value, what)
        if deps:
            values = self.ctx.get([ObjectRef(RefPayload(d, arrived=True), BACKEND) for d in deps])
            args, kwargs = fill_deps(args, kwargs, values)
        return args, kwargs

    def _enter(self) -> tuple[Any, Any, Any, Any]:
        """Make this actor's job context (and, where it shares its process, its ActorInfo), its GPUs and its label
        (that of the lines printed here) current here."""
        token = fray_current.push(self.ctx)
        label = None if self.label is None else fray_output.push_label(self.label)
        gpus = fray_current.push_gpus(self.gpus) if self.gpus else None
        return token, (None if self.owns_process else fray_current.push_actor(self.info)), label, gpus

    @staticmethod
    def _leave(tokens: tuple[Any, Any, Any, Any]) -> None:
        if tokens[3] is not None:
            fray_current.pop_gpus(tokens[3])
        if tokens[2] is not None:
            fray_output.pop_label(tokens[2])
        if tokens[1] is not None:
            fray_current.pop_actor(tokens[1])
        fray_current.pop(tokens[0])

    def _init(
        self, cls_data: bytes, call: WireValue, deps: list[str], members: list[tuple[ActorInfo, dict[str, str]]]
    ) -> ActorReply:
        self.info, env = members[self.index] if self.index < len(members) else members[0]
        env = dict(env)
        self.gpus = held_from_env(env)
        if not self.owns_process:
            env.pop(ENV_HELD, None)  # (not set in a process it shares with other work)
        if env:
            environ.publish(env)  # an SPMD member: torch.distributed's variables and its GPUs, before __init__
        if self.owns_process:
            fray_current.set_process_actor(self.info)
            use_held_device()  # (an SPMD member holding GPUs starts on its own, as LOCAL_RANK would pick it)
        tokens = self._enter()
        label_token = None
        try:
            if self.owns_process:
                serve_store(env)  # rank 0 of an SPMD group: its rendezvous, bound to MASTER_ADDR only
            klass = loads(Blob(cls_data))
            self.label = fray_output.label_for(klass.__name__, host=self.rt.label_host)
            self.call_data = {"concurrency": self.max_threads}  # (its actor is named where the call was sent)
            RECORDER.name_thread(f"actor {klass.__name__}" + (f" {self.info.name!r}" if self.info.name else ""))
            label_token = fray_output.push_label(self.label)
            args, kwargs = self._args(call, deps, f"the arguments of {klass.__name__}()")
            self.obj = klass(*args, **kwargs)
            self.async_methods = async_methods(klass)
            if self.async_methods:
                self._start_loop()
            self.rt.apply_holds_now(call.contained)  # (as after a method)
            return ActorReply(ReplyStatus.OK)
        except BaseException as exc:
            err = capture_exception(exc)
            self.init_error = f"{err.type_name}: {err.message}"
            return ActorReply(ReplyStatus.ERR, error=err)
        finally:
            if label_token is not None:
                fray_output.pop_label(label_token)
            self._leave(tokens)
            self.init_done.set()

    # ------------------------------------------------------------ async actors
    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        self.slots = asyncio.Semaphore(self.max_threads)
        threading.Thread(target=loop.run_forever, name="fray-actor-loop", daemon=True).start()
        self.loop = loop

    def __cleanup__(self, exc: Any) -> None:
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _submit_async(self, port: Any, oid: str, method: str, call: WireValue, deps: list[str]) -> None:
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(self._run_async(port, oid, method, call, deps), self.loop)

    async def _run_async(self, port: Any, oid: str, method: str, call: WireValue, deps: list[str]) -> None:
        assert self.slots is not None
        async with self.slots:
            tokens = self._enter()  # this asyncio task's own context
            name = f"{type(self.obj).__name__}.{method}"
            RECORDER.record(Kind.CALL_START, oid, name, self.call_data)
            reply: Any = None
            try:
                what = f"the arguments of {type(self.obj).__name__}.{method}"
                if deps:  # waiting for ref arguments must not block the loop
                    args, kwargs = await asyncio.to_thread(self._args, call, deps, what)
                else:
                    args, kwargs = self._args(call, deps, what)
                fn = getattr(self.obj, method)
                if method in self.async_methods:
                    value = await fn(*args, **kwargs)
                else:
                    value = await asyncio.to_thread(fn, *args, **kwargs)
                reply = self._ok(value, method, oid)
            except BaseException as exc:
                reply = ActorReply(ReplyStatus.ERR, error=capture_exception(exc))
            finally:
                self._leave(tokens)
                RECORDER.record(Kind.CALL_END, oid, name, end_data(reply))
                self.rt.events_recorded()
            if call.contained:  # (as in _invoke, off the loop)
                await asyncio.to_thread(self.rt.apply_holds_now, call.contained)
        port.send(reply)

    def _iterate_async(self, agen: Any) -> Any:
        """An async generator method's items, pulled one by one on the actor's loop (for a stream)."""
        loop = self.loop
        assert loop is not None

        async def step() -> Any:
            tokens = self._enter()
            try:
                return await agen.__anext__()
            finally:
                self._leave(tokens)

        try:
            while True:
                try:
                    yield asyncio.run_coroutine_threadsafe(step(), loop).result()
                except StopAsyncIteration:
                    return
        finally:
            try:
                asyncio.run_coroutine_threadsafe(agen.aclose(), loop).result(timeout=30)
            except BaseException:
                pass

    def _invoke(self, oid: str, method: str, call: WireValue | bytes, deps: list[str]) -> ActorReply | PlainReply:
        """One call of the instance's method; `call`: its arguments, or their plain pickle (a PlainCall's)."""
        if self.obj is None:
            return ActorReply(ReplyStatus.DEAD, reason=f"the actor's __init__ raised {self.init_error}")
        tokens = self._enter()
        name = f"{type(self.obj).__name__}.{method}"
        RECORDER.record(Kind.CALL_START, oid, name, self.call_data)
        reply: ActorReply | PlainReply | None = None
        try:
            if type(call) is bytes:
                args, kwargs = self.rt.store.load_inline(call, f"the arguments of {name}")
            else:
                args, kwargs = self._args(cast(WireValue, call), deps, f"the arguments of {name}")
            reply = self._ok(getattr(self.obj, method)(*args, **kwargs), method, oid)
        except BaseException as exc:
            reply = ActorReply(ReplyStatus.ERR, error=capture_exception(exc))
        finally:
            self._leave(tokens)
            RECORDER.record(Kind.CALL_END, oid, name, end_data(reply))
            self.rt.events_recorded()
        if type(call) is not bytes:
            self.rt.apply_holds_now(cast(WireValue, call).contained)  # (refs in the arguments: the instance may keep)
        return reply

    def _ok(self, value: Any, method: str, oid: str) -> ActorReply | PlainReply:
        """The reply of a method that returned `value`: plain when it is a small plain pickle (what dumps,
        encode_reply and CompactingPort would make of it, without the dataclasses), else stored or inline."""
        data = plain_pickle(value)
        if data is not None and len(data) < self.rt.store.inline_limit:
            return (data,)
        blob = dumps(value, f"the return value of {method}", copy=False, device_mode=self.rt.store.device_mode)
        return ActorReply(ReplyStatus.OK, self.rt.encode_reply(blob, oid))

    def _stream(self, sid: str, method: str, call: WireValue, deps: list[str]) -> ActorReply:
        """Run a generator method, reporting its items as they come (WorkerRuntime.produce); the reply only says
        it is over (a process that dies instead fails the call, and the controller ends the stream)."""
        what = f"{type(self.obj).__name__}.{method}"

        def make() -> Any:
            if self.max_threads > 1:  # (with one thread, __init__ ran on this very thread already)
                self.init_done.wait()
            if self.obj is None:
                raise ActorDiedError(f"the actor is dead: its __init__ raised {self.init_error}")
            args, kwargs = self._args(call, deps, f"the arguments of {what}")
            items = getattr(self.obj, method)(*args, **kwargs)
            return self._iterate_async(items) if hasattr(items, "__anext__") else items

        tokens = self._enter()
        try:
            self.rt.produce(sid, make, what)
        finally:
            self._leave(tokens)
        return ActorReply(ReplyStatus.OK)

    @staticmethod
    def _reply(port: Any, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            reply = fn(*args)
        except BaseException as exc:
            reply = ActorReply(ReplyStatus.ERR, error=capture_exception(exc))
        port.send(reply)

    def _submit(self, port: Any, fn: Any, *args: Any) -> None:
        if self.max_threads == 1:  # this actor's own Monarch driver thread: in order, blocks no other actor
            self._reply(port, fn, args)
            return
        # A plain queue feeding the actor's own threads: a ThreadPoolExecutor's hand-off adds to every call.
        with self.threads_lock:
            if self.idle > 0:
                self.idle -= 1
            elif self.n_threads < self.max_threads:
                self.n_threads += 1
                threading.Thread(target=self._serve, name="fray-actor", daemon=True).start()
        self.calls.put((port, fn, args))

    def _serve(self) -> None:
        while True:  # never exits: the thread lives as long as the actor's process
            try:
                port, fn, args = self.calls.get()
                self._reply(port, fn, args)
            except BaseException:
                runtime.log.debug("fray actor: reply not sent", exc_info=True)
            with self.threads_lock:
                self.idle += 1

    @endpoint(explicit_response_port=True)
    def init(
        self,
        port: Any,
        cls_data: bytes,
        call: WireValue,
        deps: list[str],
        members: list[tuple[ActorInfo, Any]],
        replies: Any = None,
    ) -> None:
        self.replies = replies  # a group member: where it answers group broadcasts
        self._submit(port, self._init, cls_data, call, deps, members)

    @endpoint(explicit_response_port=True)
    def call(self, port: Any, message: Any) -> None:
        """message: a PlainCall, or an ActorCall compacted; the reply goes back plain or compacted too."""
        if type(message) is tuple:
            oid, method, data = message
            if self.max_threads == 1 and self.loop is None:  # (on this thread: the fewest steps, reply sent here)
                reply = self._invoke(oid, method, data, [])
                (port if type(reply) is tuple else CompactingPort(port)).send(reply)
                return
            call, deps = WireValue(Inline(data)), []
        else:
            m: ActorCall = expand(message)
            oid, method, call, deps = m.oid, m.method, m.call, m.deps
        if self.max_threads > 1:
            self.init_done.wait()  # (with one thread, __init__ ran on this very thread already)
        if self.loop is not None:
            self._submit_async(CompactingPort(port), oid, method, call, deps)
        else:
            self._submit(CompactingPort(port), self._invoke, oid, method, call, deps)

    @endpoint(explicit_response_port=True)
    def call_stream(self, port: Any, sid: str, method: str, call: WireValue, deps: list[str]) -> None:
        self._submit(port, self._stream, sid, method, call, deps)

    @endpoint
    def call_group(self, base: str, method: str, data: bytes | None, call: Any, deps: list[str]) -> None:
        """One broadcast to (a slice of) a group's mesh: each member answers its own call, under its own object
        id ("{base}.{rank}"), on the controller's reply port (given at init), as soon as it is done. Plain
        arguments come as their pickle (`data`), others as `call` (protocol.plain_data)."""
        oid = f"{base}.{self.info.rank}"
        port = TaggedPort(self.replies, oid)
        call = WireValue(Inline(data)) if data is not None else expand(call)
        if self.max_threads > 1:
            self.init_done.wait()
        if self.loop is not None:
            self._submit_async(port, oid, method, call, deps)
        else:
            self._submit(port, self._invoke, oid, method, call, deps)
