"""What runs inside each Monarch worker process: the task runner, the ref tracker, and a JobContext whose calls go
to the controller's coordinator actor (so nested tasks and actors reach the same mesh)."""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import fray.current as fray_current
import fray.output as fray_output
from fray.capabilities import Capability
from fray.context import JobContext
from fray.errors import FrayError, GetTimeoutError, TaskCancelledError
from fray.groups import ActorGroup, Member
from fray.refs import ActorHandle, ObjectRef, public_methods
from fray.remote_errors import capture_exception
from fray.resources import add, fits, subtract
from fray.serialization import Blob, dumps, find_unserializable_argument, loads
from fray.streams import ObjectRefStream
from fray.transfers import PathStats
from fray.types import ActorOptions, TaskOptions
from fray_monarch import _runtime, lifeline, network
from fray_monarch.arena import reclaim_dead_segments, remove_segments, segment_prefix
from fray_monarch.objects import DepMarker, RefPayload, Tracker, set_tracker
from fray_monarch.protocol import Inline, Reply, StreamItem, TaskItem, TaskResult, Value, WireValue, WorkerSetup
from fray_monarch.store import ObjectStore

BACKEND = "monarch"
CAPABILITIES = frozenset(
    {
        Capability.CANCEL_RUNNING,
        Capability.TASK_ENV_VARS,
        Capability.PROCESS_ISOLATION,
        Capability.MULTI_HOST,
        Capability.ZERO_COPY_OBJECTS,
        Capability.SPMD_GROUPS,
        Capability.STREAMING,
        Capability.ASYNC_ACTORS,
    }
)
RELEASE_DELAY = 0.05  # releases wait this long before being sent, so they never overtake the hold they undo
REPLY_MARGIN = 30.0  # a coordinator reply may take this long past the caller's own timeout before we give up

_current_task = threading.local()


def split_refs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    """Replace top-level ObjectRef arguments by DepMarkers; return the payloads they stood for."""
    deps: list[Any] = []

    def swap(value: Any) -> Any:
        if isinstance(value, ObjectRef):
            deps.append(value.payload)
            return DepMarker(len(deps) - 1)
        return value

    new_args = tuple(swap(a) for a in args)
    new_kwargs = {k: swap(v) for k, v in kwargs.items()}
    return new_args, new_kwargs, deps


def fill_deps(
    args: tuple[Any, ...], kwargs: dict[str, Any], values: list[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def fill(value: Any) -> Any:
        return values[value.index] if isinstance(value, DepMarker) else value

    return tuple(fill(a) for a in args), {k: fill(v) for k, v in kwargs.items()}


def pack_call(what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Blob, list[Any]]:
    """The call's arguments serialized (views of the caller's buffers, written out at once), and the payloads of
    its top-level ref arguments."""
    args, kwargs, deps = split_refs(args, kwargs)
    try:
        blob = dumps((args, kwargs), f"the arguments of {what}", copy=False)
    except FrayError as exc:
        raise find_unserializable_argument(what, args, kwargs, exc) from exc
    return blob, deps


def contained_ids(blob: Blob) -> tuple[str, ...]:
    if not blob.contained:
        return ()
    return tuple(p.id for p in blob.contained if isinstance(p, RefPayload))


def _route_output(log_file: str | None) -> None:
    """Once per worker process. Its output goes to the driver's console (the fds it inherited), line-buffered so
    lines arrive as printed; with log_to_driver=false, fds 1 and 2 go to the context's log file instead (on a
    host where the driver's directory does not exist, nowhere)."""
    if log_file is not None:
        try:
            fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            pass


class WorkerRuntime:
    """One per worker process: runs tasks by local free resources, reports results and ref holds in batches."""

    def __init__(self, setup: WorkerSetup) -> None:
        for entry in reversed(setup.sys_path):  # the controller's import path, so user modules import here too
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.ctl_key, self.proc_key, self.coord = setup.ctl_key, setup.proc_key, setup.coord
        if setup.lifeline is not None:  # a process on another host: it ends when its driver ends
            prefix = segment_prefix(setup.ctl_key, setup.host_id)

            def driver_gone(address: str) -> None:
                remove_segments(prefix)  # the whole context is gone: every store file of it on this host too
                lifeline.end_process(address)

            lifeline.hold(*setup.lifeline, on_lost=driver_gone)
        _route_output(setup.log_file)
        self.bind = bind = setup.bind_host or network.route_address([setup.driver_host]) or "127.0.0.1"
        # ` ip=<host>` in output labels only where the context has several hosts (attached ones; local means one)
        self.label_host = bind if setup.host_id != "local" else None
        self.free = dict(setup.capacity)
        self.capacity = dict(setup.capacity)
        self.oids = itertools.count()
        reclaim_dead_segments()
        self.store = ObjectStore(
            setup.ctl_key,
            setup.host_id,
            setup.proc_key,
            setup.store_budget,
            bind,
            lambda oid: RefPayload(oid, arrived=True),
            setup.inline_limit,
            setup.transport,
            several_hosts=setup.host_id != "local",  # workers of attached hosts; local ones mean one host
        )
        self.queue: deque[tuple[Any, ...]] = deque()
        self.running: dict[str, dict[str, float]] = {}
        self.threads: dict[str, int] = {}  # task id -> thread ident, while the user function runs
        self.fn_data: dict[str, bytes] = {}
        self.fns: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.ready: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.idle = 0  # task threads waiting for work (they are never killed, even by a stray async exception)
        self.outbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.streams: set[str] = set()  # streams producing here
        self.stop_streams: set[str] = set()  # ... whose consumer has gone: stop at the next item
        self.stopped = False
        self.ctx = WorkerJobContext(self, setup.nodes)
        set_tracker(Tracker(self._first, self._zero))
        fray_current.set_default(self.ctx)
        threading.Thread(target=self._sender, name="fray-sender", daemon=True).start()

    # ------------------------------------------------------------ refs
    def _first(self, oid: str, arrived: bool) -> None:
        if arrived:
            self.outbox.put(("hold", oid))

    def _zero(self, oid: str) -> None:
        self.outbox.put(("release", (time.monotonic() + RELEASE_DELAY, oid)))

    def _sender(self) -> None:
        releases: deque[tuple[float, str]] = deque()
        while True:
            try:
                if self._send_once(releases):
                    return
            except BaseException:
                pass

    def _send_once(self, releases: deque[tuple[float, str]]) -> bool:
        timeout = max(0.0, releases[0][0] - time.monotonic()) if releases else None
        try:
            items = [self.outbox.get(timeout=timeout)]
        except queue.Empty:
            items = []
        while True:
            try:
                items.append(self.outbox.get_nowait())
            except queue.Empty:
                break
        results, holds = [], []
        for kind, value in items:
            if kind == "result":
                results.append(value)
            elif kind == "hold":
                holds.append(value)
            elif kind == "release":
                releases.append(value)
            elif kind == "stop":
                return True
        now = time.monotonic()
        due = []
        while releases and releases[0][0] <= now:
            due.append(releases.popleft()[1])
        if self.stopped:  # the process is being stopped: sending now would panic inside Monarch (closed mailbox)
            return True
        if results or holds or due:
            self.coord.done.broadcast(self.proc_key, results, holds, due)
        return False

    def stop(self) -> None:
        self.stopped = True
        self.outbox.put(("stop", None))

    # ------------------------------------------------------------ values
    def new_oid(self) -> str:
        return f"{self.ctl_key}-{self.proc_key}.{next(self.oids)}"

    def encode(self, blob: Blob, oid: str) -> WireValue:
        """A value made here under `oid` (a task or method result): stored here when large."""
        return WireValue(self.store.encode(blob, oid), contained_ids(blob))

    def register(self, blob: Blob) -> tuple[RefPayload, WireValue]:
        """A value made here that needs its own object (a put, or large call arguments): stored here when
        large, and entered in the controller's directory under an id chosen here."""
        oid = self.new_oid()
        payload = RefPayload(oid)
        wire = self.encode(blob, oid)
        reply = self.coord.put.call_one(self.proc_key, oid, wire).get(timeout=REPLY_MARGIN)
        _checked(reply)
        return payload, wire

    def encode_call(self, blob: Blob) -> tuple[WireValue, RefPayload | None]:
        """A call's arguments: inline when small, else a registered object the call keeps alive."""
        if blob.nbytes < self.store.inline_limit:
            return WireValue(Inline.of(blob), contained_ids(blob)), None
        payload, wire = self.register(blob)
        return WireValue(wire.value, (*wire.contained, payload.id)), payload

    def load(self, value: Value, what: str = "a value") -> Any:
        return self.store.load(value, what)

    def transfer_stats(self) -> dict[str, PathStats]:
        return self.store.stats.snapshot()

    # ------------------------------------------------------------ streams
    def produce(self, sid: str, make: Callable[[], Any], what: str) -> None:
        """Run a generator (make() returns it), reporting each item as it is produced, in order, through the same
        FIFO as results and ref holds. An exception becomes one last item holding it; then the end. Stops at the
        next item once the consumer has gone (stop_stream)."""
        index = 0
        gen: Any = None
        with self.lock:
            self.streams.add(sid)
        try:
            gen = make()
            if not hasattr(gen, "__next__"):
                if not hasattr(gen, "__iter__"):
                    raise TypeError(f"{what} is streamed but returned {type(gen).__name__}, not a generator")
                gen = iter(gen)
            while sid not in self.stop_streams:
                try:
                    value = next(gen)
                except StopIteration:
                    break
                oid = self.new_oid()
                wire = self.encode(dumps(value, f"item {index} of {what}", copy=False), oid)
                self.outbox.put(("result", StreamItem(sid, index, oid, wire)))
                index += 1
        except BaseException as exc:
            self.outbox.put(("result", StreamItem(sid, index, self.new_oid(), error=capture_exception(exc))))
            index += 1
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                try:
                    close()  # runs the generator's finally blocks when it was stopped early
                except BaseException:
                    pass
            with self.lock:
                self.streams.discard(sid)
                self.stop_streams.discard(sid)
            self.outbox.put(("result", StreamItem(sid, index, end=True)))

    def stop_stream(self, sid: str) -> None:
        with self.lock:
            if sid in self.streams:
                self.stop_streams.add(sid)

    # ------------------------------------------------------------ tasks
    def enqueue(self, batch: list[TaskItem]) -> None:
        with self.lock:
            for item in batch:
                if item.fn_data is not None:
                    self.fn_data[item.fn_key] = item.fn_data
                self.queue.append(item)
            self._start_ready()

    def unqueue(self, count: int) -> list[str]:
        """Give back up to `count` tasks queued here and not started, the last sent first (the controller runs
        them on a process with room)."""
        with self.lock:
            return [self.queue.pop().id for _ in range(min(count, len(self.queue)))]

    def set_capacity(self, capacity: dict[str, float]) -> None:
        with self.lock:
            for key in set(capacity) | set(self.capacity):
                self.free[key] = self.free.get(key, 0.0) + capacity.get(key, 0.0) - self.capacity.get(key, 0.0)
            self.capacity = dict(capacity)
            self._start_ready()

    def cancel(self, tid: str) -> str:
        """Drop the task if queued here; interrupt it if it runs (TaskCancelledError raised in its thread)."""
        with self.lock:
            for item in self.queue:
                if item.id == tid:
                    self.queue.remove(item)
                    self.outbox.put(("result", TaskResult(tid, "cancelled")))
                    return "dropped"
            thread = self.threads.get(tid)
            if thread is None:
                return "unknown"
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(TaskCancelledError))
            return "interrupted"

    def _fits(self, res: Mapping[str, float]) -> bool:
        return fits(self.free, res)

    def _start_ready(self) -> None:
        for _ in range(len(self.queue)):
            item = self.queue[0]
            res = item.resources
            if not self._fits(res) and self.running:
                return  # in order: wait for room (a task larger than the whole process still runs alone)
            self.queue.popleft()
            subtract(self.free, res)
            self.running[item.id] = res
            if self.idle > 0:
                self.idle -= 1
            else:
                threading.Thread(target=self._task_thread, name="fray-task", daemon=True).start()
            self.ready.put(item)

    def _task_thread(self) -> None:
        while True:
            try:
                item = self.ready.get()
                self._execute(item)
                with self.lock:
                    self.idle += 1
            except BaseException:  # e.g. a cancel's TaskCancelledError arriving after its task ended
                pass

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "free": dict(self.free),
                "running": list(self.running),
                "queued": len(self.queue),
                "idle": self.idle,
                "threads": threading.active_count(),
            }

    def _done(self, tid: str) -> None:
        with self.lock:
            res = self.running.pop(tid, None)
            if res is not None:
                add(self.free, res)
            self._start_ready()

    def block(self) -> str | None:
        """The current task waits in get/wait: lend its resources to queued tasks."""
        tid = getattr(_current_task, "id", None)
        if tid is None:
            return None
        with self.lock:
            add(self.free, self.running.get(tid, {}))
            self._start_ready()
        return tid

    def unblock(self, tid: str | None) -> None:
        if tid is None:
            return
        with self.lock:
            subtract(self.free, self.running.get(tid, {}))  # may go below zero for a moment (oversubscribed)

    def load_fn(self, key: str) -> Any:
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = loads(Blob(self.fn_data[key]))
        return fn

    def _execute(self, item: TaskItem) -> None:
        tid = item.id
        _current_task.id = tid
        token = fray_current.push(self.ctx)
        label_token = None
        try:
            fn = self.load_fn(item.fn_key)
            name = getattr(fn, "__qualname__", "task")
            label = item.name or getattr(fn, "__name__", None) or name
            label_token = fray_output.push_label(fray_output.label_for(label, host=self.label_host))
            args, kwargs = self.load(item.args.value, f"the arguments of task {name}")
            if item.deps:
                values = [self.load(d, f"ref argument {i} of task {name}") for i, d in enumerate(item.deps)]
                args, kwargs = fill_deps(args, kwargs, values)
            with self.lock:
                self.threads[tid] = threading.get_ident()
            try:
                if item.stream:
                    self.produce(tid, lambda: fn(*args, **kwargs), f"streaming task {name}")
                else:
                    value = fn(*args, **kwargs)
            finally:
                with self.lock:
                    del self.threads[tid]
            if item.stream:
                result = None  # its items and its end were reported as they came
            else:
                blob = dumps(value, f"the return value of {name}", copy=False)
                result = TaskResult(tid, "ok", self.encode(blob, tid))
        except BaseException as exc:
            result = TaskResult(tid, "err", error=capture_exception(exc))
        finally:
            if label_token is not None:
                fray_output.pop_label(label_token)
            fray_current.pop(token)
            _current_task.id = None
        if result is not None:
            self.outbox.put(("result", result))
        self._done(tid)


class RemoteStream:
    """The StreamSource of a stream consumed in a worker: each next item is asked of the coordinator."""

    def __init__(self, rt: WorkerRuntime, sid: str) -> None:
        self.rt = rt
        self.sid = sid

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        tid = self.rt.block()
        try:
            reply = _reply(self.rt.coord.stream_next.call_one(self.rt.proc_key, self.sid, timeout), timeout)
        finally:
            self.rt.unblock(tid)
        if reply.timed_out:
            raise GetTimeoutError(f"no next item of the stream within {timeout} s")
        oid = _checked(reply)
        return None if oid is None else ObjectRef(RefPayload(oid), BACKEND)  # its hold was counted there

    def close(self) -> None:
        if not self.rt.stopped:
            self.rt.coord.stream_close.broadcast(self.sid)


def _reply(fut: Any, timeout: float | None) -> Any:
    try:
        return fut.get(timeout=None if timeout is None else timeout + REPLY_MARGIN)
    except TimeoutError as exc:
        raise GetTimeoutError("the fray coordinator did not answer in time") from exc


def _checked(reply: Reply) -> Any:
    return reply.unwrap()


class WorkerJobContext(JobContext):
    """The JobContext inside workers and actors: everything goes through the controller's coordinator."""

    backend = BACKEND
    capabilities = CAPABILITIES

    def __init__(self, runtime: WorkerRuntime, nodes: list[dict[str, float]]) -> None:
        super().__init__(owns_resources=False)  # it belongs to the driver's context
        self.rt = runtime
        self._nodes = nodes

    def node_resources(self) -> list[dict[str, float]]:
        return [dict(n) for n in self._nodes]

    def _ref(self, oid: str) -> ObjectRef:
        return ObjectRef(RefPayload(oid), BACKEND)

    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef:
        fn_blob = dumps(fn, f"task function {getattr(fn, '__qualname__', fn)}")
        blob, deps = pack_call(getattr(fn, "__qualname__", "task"), args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        oid = _checked(
            self.rt.coord.submit.call_one(self.rt.proc_key, fn_blob.data, call, [d.id for d in deps], options).get(
                timeout=REPLY_MARGIN
            )
        )
        return self._ref(oid)

    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
        member: Member | None = None,
    ) -> ActorHandle:
        cls_blob = dumps(klass, f"actor class {klass.__qualname__}")
        blob, deps = pack_call(klass.__qualname__, args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        info = _checked(
            self.rt.coord.create_actor.call_one(
                self.rt.proc_key, cls_blob.data, call, [d.id for d in deps], options, member
            ).get(timeout=REPLY_MARGIN)
        )
        return ActorHandle(info[0], BACKEND, info[1], info[2], info[3], ctx=self)

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        blob, deps = pack_call(f"{handle.class_name}.{method}", args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        oid = _checked(
            self.rt.coord.call_actor.call_one(self.rt.proc_key, handle.payload, method, call, [d.id for d in deps]).get(
                timeout=REPLY_MARGIN
            )
        )
        return self._ref(oid)

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRefStream:
        sid = self._create_task(fn, args, kwargs, options).payload.id
        return ObjectRefStream(RemoteStream(self.rt, sid), BACKEND)

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        blob, deps = pack_call(f"{handle.class_name}.{method}", args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        sid = _checked(
            self.rt.coord.call_actor_stream.call_one(
                self.rt.proc_key, handle.payload, method, call, [d.id for d in deps]
            ).get(timeout=REPLY_MARGIN)
        )
        return ObjectRefStream(RemoteStream(self.rt, sid), BACKEND)

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
        cls_blob = dumps(klass, f"actor class {klass.__qualname__}")
        blob, deps = pack_call(klass.__qualname__, args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        spec = (count, placement, distributed)
        gid, members = _checked(
            self.rt.coord.create_group.call_one(
                self.rt.proc_key, cls_blob.data, call, [d.id for d in deps], options, spec
            ).get(timeout=REPLY_MARGIN + 120)
        )
        methods = public_methods(klass)
        handles = [ActorHandle(aid, BACKEND, klass.__name__, methods, name, ctx=self) for aid, name in members]
        return ActorGroup(handles, options.name, gid, ctx=self)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        blob, deps = pack_call(f"{group.class_name}.{method}", args, kwargs)
        call, _keep = self.rt.encode_call(blob)
        aids = [h.payload for h in group.handles]
        oids = _checked(
            self.rt.coord.call_group.call_one(self.rt.proc_key, aids, method, call, [d.id for d in deps]).get(
                timeout=REPLY_MARGIN
            )
        )
        return [self._ref(oid) for oid in oids]

    def _kill_group(self, group: ActorGroup) -> None:
        _checked(self.rt.coord.kill_group.call_one([h.payload for h in group.handles]).get(timeout=REPLY_MARGIN))

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        tid = self.rt.block()
        try:
            reply = _reply(self.rt.coord.get.call_one(self.rt.proc_key, [r.payload.id for r in refs], timeout), timeout)
        finally:
            self.rt.unblock(tid)
        if reply.timed_out:
            raise GetTimeoutError(f"get did not finish within {timeout} s")
        values = _checked(reply)
        return [self.rt.load(v, f"the value of {r!r}") for v, r in zip(values, refs, strict=True)]

    def _future(self, ref: ObjectRef) -> Future[Any]:
        """Settled when the coordinator answers (a Monarch future's callback: no thread per ref)."""
        future: Future[Any] = Future()

        def settle(reply: Any, exc: BaseException | None) -> None:
            try:
                if exc is not None:
                    raise exc
                value = _checked(reply)[0]
                future.set_result(self.rt.load(value, f"the value of {ref!r}"))
            except BaseException as error:  # the future carries it to whoever awaits
                future.set_exception(error)

        _runtime.on_done(self.rt.coord.get.call_one(self.rt.proc_key, [ref.payload.id], None), settle)
        return future

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        tid = self.rt.block()
        try:
            reply = _reply(
                self.rt.coord.wait.call_one(self.rt.proc_key, [r.payload.id for r in refs], num_returns, timeout),
                timeout,
            )
        finally:
            self.rt.unblock(tid)
        return set(_checked(reply))

    def _put(self, obj: Any) -> ObjectRef:
        payload, _ = self.rt.register(dumps(obj, f"put value {type(obj).__name__}", copy=False))
        return ObjectRef(payload, BACKEND)

    def _get_actor(self, name: str) -> ActorHandle:
        info = _checked(self.rt.coord.get_actor.call_one(name).get(timeout=REPLY_MARGIN))
        return ActorHandle(info[0], BACKEND, info[1], info[2], info[3], ctx=self)

    def _kill(self, handle: ActorHandle) -> None:
        _checked(self.rt.coord.kill.call_one(handle.payload).get(timeout=REPLY_MARGIN))

    def _cancel(self, ref: ObjectRef) -> None:
        _checked(self.rt.coord.cancel.call_one(ref.payload.id).get(timeout=REPLY_MARGIN))

    def _transfer_stats(self) -> dict[str, PathStats]:
        """This process's own transfers (the driver's context sums those of every process)."""
        return self.rt.transfer_stats()

    def _shutdown(self) -> None:
        """A worker's context belongs to the controller: shutting it down from inside does nothing."""
