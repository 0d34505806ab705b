"""Nested work from the worker processes of a kit backend: a task running in another process calls
`fray.get_job_context()` and gets a `WorkerContext`, whose hooks are answered by the driver's own.

- The driver runs a `RemoteService`: a `multiprocessing.connection.Listener` on a Unix socket in a private (0700)
  directory, with an `authkey` that only the driver's own worker processes are given (through the engine's pipe to
  them). The listener runs multiprocessing's HMAC challenge before it reads anything, so nothing is unpickled from
  a peer that has not proven it holds the key (docs/security.md).
- A worker connects once per thread; each request names the task it runs for (`running_task`), so a request that
  blocks (a get, a wait) lends that task's resources as a get on the driver would.
- Refs and actor handles reach a worker as `fray.kit.objects.Remote` payloads and go back to the driver by name;
  the driver keeps what it handed to a task (`Task.held`) until the task's result is stored, which then keeps it.
- An actor may live in a worker process of its own: the engine runs `actor_request(...)`'s call there with
  `run_call`, and the process's requests name the actor; what it was handed or answered by name is kept with the
  actor (`Actor.held`) for its life.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Client, Connection, Listener
from typing import TYPE_CHECKING, Any

from fray.context import JobContext
from fray.errors import FrayError, SerializationError
from fray.host import watchdog
from fray.kit.objects import Serialized
from fray.runtime import current
from fray.runtime.capabilities import Capability
from fray.runtime.gpus import HostGpus, using_gpus
from fray.runtime.remote_errors import RemoteError, capture_exception
from fray.runtime.serialization import Blob, dumps, loads_data

if TYPE_CHECKING:
    from fray.kit.actors import Actor
    from fray.kit.calls import TaskRun
    from fray.kit.context import KitJobContext

# A call on its way to a worker (`RemoteService.request`, then `run_call` there): task id, its GPUs, the host's GPUs,
# the pickled (fn, args, kwargs) and its buffers. Its reply: ok, the pickled value (or RemoteError) and buffers.
Request = tuple[int, tuple[int, ...], HostGpus, bytes, list[bytes]]
Reply = tuple[bool, bytes, list[bytes]]

__all__ = ["RemoteService", "WorkerSetup", "run_call", "running_task", "start_worker", "worker_context"]

_JOIN_S = 5.0  # the accept thread's join at close, and the serving threads' together: bounded, whatever they do


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker process needs to reach its driver (the authkey is a secret: give it only to your workers)."""

    address: str
    authkey: bytes
    backend: str
    capabilities: frozenset[Capability]


def _owned(blob: Blob) -> list[bytes]:
    """A blob's buffers as bytes of their own (what crosses a connection or a pool's pipe)."""
    return [bytes(memoryview(b)) for b in blob.buffers]


def _send(conn: Connection, blob: Blob) -> None:
    conn.send((blob.data, _owned(blob)))


def _receive(conn: Connection, what: str) -> Any:
    data, buffers = conn.recv()
    return loads_data(data, buffers, what)


class RemoteService:
    """The driver's side: answers its worker processes' requests with `ctx`'s hooks."""

    def __init__(self, ctx: KitJobContext) -> None:
        self._ctx = ctx
        self._dir = tempfile.mkdtemp(prefix="fray-kit-")  # 0700: no other user reaches the socket
        watchdog.watch_path(self._dir)  # removed however this process ends
        authkey = secrets.token_bytes(32)
        self._listener = Listener(os.path.join(self._dir, "driver"), "AF_UNIX", authkey=authkey)
        self.setup = WorkerSetup(self._listener.address, authkey, ctx.backend, ctx.capabilities)
        self._closed = False
        self._serving: dict[Connection, threading.Thread] = {}  # a thread per connected worker, until it hangs up
        self._serving_lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, name="fray-kit-service", daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()  # (the HMAC challenge runs here: a wrong key never gets in)
            except OSError:  # closed
                return
            except Exception:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), name="fray-kit-request", daemon=True)
            with self._serving_lock:
                if self._closed:
                    conn.close()
                    return
                self._serving[conn] = thread
            thread.start()

    def _serve(self, conn: Connection) -> None:
        try:
            self._answer(conn)
        finally:
            with self._serving_lock:  # (closed under the lock: close() hangs up only connections still open)
                self._serving.pop(conn, None)
                conn.close()

    def _answer(self, conn: Connection) -> None:
        """A worker's requests, each answered with the hook it names, until it hangs up."""
        while True:
            try:
                data, buffers = conn.recv()  # (bytes only: what they hold is loaded below)
            except (EOFError, OSError):
                return
            hook = "a request"
            try:  # (a request that does not load here fails that request, naming why, not the connection)
                work_id, hook, args = loads_data(data, buffers, "a worker's request")
                if hook not in HOOKS:
                    raise FrayError(f"a worker asked for {hook!r}, which is no hook a worker may call")
                with self._ctx.acting_for(work_id) as holder:
                    result = getattr(self._ctx, hook)(*args)
                reply: tuple[bool, Any] = (True, result)
            except BaseException as exc:
                holder, reply = None, (False, capture_exception(exc))
            try:
                blob = dumps(reply, f"the reply to {hook}")
            except SerializationError as exc:  # (the worker waits for a reply: it gets this error instead)
                holder, blob = None, dumps((False, capture_exception(exc)), f"the reply to {hook}")
            if holder is not None:  # what the worker now names: kept with its task, or its actor
                holder.held = [*(holder.held or ()), *blob.contained]
            try:
                _send(conn, blob)
            except OSError:
                return

    def request(self, run: TaskRun, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Request:
        """The arguments of `run_call` for this attempt of a task, to submit to a worker process."""
        blob = dumps((run.fn, args, kwargs), f"the call of task {run.name}")
        return run.id, run.gpus, self._ctx.gpus, blob.data, _owned(blob)

    def actor_request(self, actor: Actor, method: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Request:
        """The arguments of `run_call` that make an actor (method None: klass(*args, **kwargs)) or call its method,
        in a worker process the engine keeps for that actor alone. What the call names by ref is kept with the
        actor for its life: its process may keep any of it, and reports no releases."""
        fn = partial(_construct, actor.id, actor.klass) if method is None else partial(_call_method, actor.id, method)
        blob = dumps((fn, args, kwargs), f"the call of {actor.klass.__name__}.{method or '__init__'}")
        actor.held = [*actor.held, *blob.contained]
        return actor.id, actor.gpus, self._ctx.gpus, blob.data, _owned(blob)

    @staticmethod
    def result(reply: Reply) -> Serialized:
        """A worker's reply as the task's result (stored as it arrived), or its exception raised."""
        ok, data, buffers = reply
        if ok:
            return Serialized(Blob(data, buffers))
        error = loads_data(data, buffers, "a task's error")
        raise error.rebuild() if isinstance(error, RemoteError) else error

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:  # closing the socket does not wake a thread blocked in its accept(): a connection of our own does
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.connect(self.setup.address)
        except OSError:
            pass
        self._accepter.join(_JOIN_S)
        with self._serving_lock:  # workers still connected: their threads see the connection end, and return
            serving = list(self._serving.items())
            for conn, _ in serving:
                _hang_up(conn)
        deadline = time.monotonic() + _JOIN_S  # (one bound for them all)
        for _, thread in serving:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        watchdog.forget_path(self._dir)


def _hang_up(conn: Connection) -> None:
    """End a connection another thread may be blocked reading: a shutdown wakes that read (a close would not)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    with sock:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------- the worker's side
_task = [0]  # the task this worker process runs now (the kit's entry id of its result)


@contextmanager
def running_task(task_id: int) -> Iterator[None]:
    """Run a block as the task `task_id` (set by the engine around the user's code in a worker process)."""
    outer, _task[0] = _task[0], task_id
    try:
        yield
    finally:
        _task[0] = outer


class _Client:
    def __init__(self, setup: WorkerSetup) -> None:
        self._setup = setup
        self._local = threading.local()

    def call(self, hook: str, *args: Any) -> Any:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = Client(self._setup.address, "AF_UNIX", authkey=self._setup.authkey)
        _send(conn, dumps((_task[0], hook, args), f"the arguments of {hook.lstrip('_')}"))
        ok, value = _receive(conn, f"the reply to {hook}")
        if ok:
            return value
        raise value.rebuild() if isinstance(value, RemoteError) else value


def _forward(hook: str) -> Callable[..., Any]:
    def forward(self: WorkerContext, *args: Any) -> Any:
        return self._client.call(hook, *args)

    forward.__name__ = hook
    _forwarded.add(hook)
    return forward


_forwarded: set[str] = set()  # the hooks WorkerContext forwards: the only ones the driver answers (HOOKS)


class WorkerContext(JobContext):
    """The JobContext of a worker process: every hook is its driver's (created by `worker_context`)."""

    def __init__(self, setup: WorkerSetup) -> None:
        super().__init__()
        self._client = _Client(setup)

    node_resources = _forward("node_resources")
    _create_task = _forward("_create_task")
    _create_actor = _forward("_create_actor")
    _call_actor = _forward("_call_actor")
    _get = _forward("_get")
    _wait = _forward("_wait")
    _put = _forward("_put")
    _get_actor = _forward("_get_actor")
    _kill = _forward("_kill")
    _cancel = _forward("_cancel")

    def _shutdown(self) -> None:  # (never called: a worker's context is lent to the task it runs)
        pass


# The hooks a worker may call, each answered by the driver's hook of the same name.
HOOKS = frozenset(_forwarded)


def worker_context(setup: WorkerSetup) -> WorkerContext:
    """The context for user code in a worker process, under its driver's backend name and capabilities."""
    kind = type(
        f"{setup.backend}WorkerContext",
        (WorkerContext,),
        {"backend": setup.backend, "capabilities": setup.capabilities},
    )
    return kind(setup)  # type: ignore[no-any-return]


_context: list[WorkerContext | None] = [None]


def start_worker(setup: WorkerSetup) -> None:
    """A worker process's initializer (`ProcessPoolExecutor(initializer=start_worker, initargs=(setup,))`): its
    context, and a lifeline to its driver, whose end (the driver exited, was killed, or shut down) ends this process:
    what fray starts dies with its owner, whoever started the process (a pool's forkserver outlives its driver
    while any of its children lives)."""
    _context[0] = worker_context(setup)
    try:
        lifeline = Client(setup.address, "AF_UNIX", authkey=setup.authkey)
    except (FileNotFoundError, ConnectionRefusedError):
        # The driver shut down (its socket is gone) while a pool was still starting this process: end with it,
        # quietly (an initializer's exception would print a traceback for every such process)
        os._exit(0)
    threading.Thread(target=_end_with_driver, args=(lifeline,), name="fray-kit-lifeline", daemon=True).start()


def _end_with_driver(lifeline: Connection) -> None:
    try:
        lifeline.recv_bytes()  # (the driver never writes on it: this returns at its end)
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


_instances: dict[int, Any] = {}  # the actors living in this worker process, by the driver's actor id


def _construct(actor_id: int, klass: type, *args: Any, **kwargs: Any) -> None:
    _instances[actor_id] = klass(*args, **kwargs)


def _call_method(actor_id: int, method: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(_instances[actor_id], method)(*args, **kwargs)


def run_call(task_id: int, gpus: tuple[int, ...], host: HostGpus, data: bytes, buffers: list[bytes]) -> Reply:
    """Run one task's call in this worker process (the function a process engine submits), with the worker's
    context current and lent, as the task `task_id`, holding `gpus`; its result or exception, pickled."""
    ctx = _context[0]
    if ctx is None:
        raise FrayError("fray.kit.remote.run_call ran in a process that start_worker did not set up")
    token = current.push(ctx, lent=True)
    try:
        fn, args, kwargs = loads_data(data, buffers, "a task's call")
        with running_task(task_id), using_gpus(gpus, host):
            value, ok = fn(*args, **kwargs), True
        blob = dumps(value, "the return value")
    except BaseException as exc:
        ok, blob = False, dumps(capture_exception(exc), "an error")
    finally:
        current.pop(token)
    return ok, blob.data, _owned(blob)
