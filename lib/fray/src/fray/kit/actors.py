"""The kit's actors: each instance lives on threads of its own (fray.kit.actor_threads) that run its calls in order;
what makes the instance and runs a method is its context's engine (`ActorHooks`: in this process by default, a
process of its own where a backend says so)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from fray.context import JobContext
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    attach_remote_traceback,
)
from fray.kit.actor_threads import ActorThreads
from fray.kit.ledger import Ledger
from fray.kit.objects import OWNER, Entry, Failure, Remote, immutable_call, new_id, register_lookup
from fray.runtime import current
from fray.runtime import worker_output as output
from fray.runtime.cuda_values import KEPT
from fray.runtime.current import ActorInfo
from fray.runtime.outcome import Outcome
from fray.runtime.refs import ActorHandle, ObjectRef, public_methods
from fray.runtime.remote_errors import RemoteError, format_exception
from fray.runtime.requests import ActorRequest
from fray.runtime.serialization import check_function, dumps_call
from fray.runtime.streams import ItemQueue, ObjectRefStream
from fray.telemetry.events import RECORDER, Kind, ended
from fray.types import Lifetime

if TYPE_CHECKING:
    from fray.runtime.groups import Member

_actors: dict[int, Actor] = {}  # live actors by id (pickled handles are looked up here)
_detached: dict[tuple[str, str, str], Actor] = {}  # (backend, namespace, name) -> actor; outlives its creator
_detached_lock = threading.Lock()
call_owner: weakref.WeakKeyDictionary[Entry, Actor] = weakref.WeakKeyDictionary()  # call entry -> its actor


class Actor:
    """One actor: its instance lives on a private executor (max_concurrency threads) that runs calls in order."""

    def __init__(
        self, table: ActorTable, klass: type, request: ActorRequest, namespace: str, member: Member | None = None
    ) -> None:
        options = request.options
        self.id = new_id()
        self.member = member
        self.info = member.info if member is not None else ActorInfo(name=options.name)
        self.loop: asyncio.AbstractEventLoop | None = None  # runs its async methods, started at the first one
        self.table = table  # the actor table of the context that created it
        self.klass = klass
        self.options = options
        self.namespace = namespace
        self.instance: Any = None
        # Set once __init__ has returned or failed (or the actor died first): with max_concurrency > 1 its other
        # threads would otherwise run calls on an instance not made yet.
        self.started = threading.Event()
        # What a process of its own was handed by name (fray.kit.remote): kept for its life, since that process
        # may keep any of it and reports no releases.
        self.held: list[Any] = []
        self.death: BaseException | None = None
        self.pending: set[Entry] = set()  # calls submitted, not started (cancel can still drop them)
        self.running: set[Entry] = set()
        self.lock = threading.Lock()
        self.executor = ActorThreads(options.max_concurrency, f"fray-actor-{klass.__name__}")
        self.request = request
        self.holding = False  # True while it holds its resources
        self.gpus: tuple[int, ...] = ()  # the devices it holds (fray.runtime.gpus), from its start until it is killed
        # what each of its call.start events says (one dict shared by all of them)
        self.call_data = {"actor": self.id, "concurrency": options.max_concurrency}
        _actors[self.id] = self

    def __reduce__(self) -> tuple[Any, ...]:
        return Remote("actor", OWNER[0], self.id).__reduce__()  # (itself again in this process)

    def __repr__(self) -> str:
        return f"{self.klass.__name__}#{self.id}"

    @property
    def label(self) -> str:
        """How errors name it: its name, or its rank in a group."""
        if self.info.name:
            return f"{self.klass.__name__} {self.info.name!r}"
        if self.info.size > 1:
            return f"{self.klass.__name__} (rank {self.info.rank} of {self.info.size})"
        return self.klass.__name__

    def run_coroutine(self, coro: Any) -> Any:
        """Run an async method's coroutine on this actor's event loop; the calling executor thread waits, so at
        most max_concurrency of them run at once, interleaved on the one loop."""
        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self.loop.run_forever, name=f"fray-actor-loop-{self.klass.__name__}", daemon=True
                ).start()
            loop = self.loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def close(self) -> None:
        """After death: stop its event loop and its member process, if it has them."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        close_process = getattr(self.instance, "_fray_close", None)
        if close_process is not None:
            close_process()
        self.held = []


def live_actor(actor_id: int) -> Actor | None:
    """This process's actor with this id, if it lives."""
    return _actors.get(actor_id)


def _lookup_actor(actor_id: int) -> Actor:
    actor = _actors.get(actor_id)
    if actor is None:
        raise ActorDiedError(f"actor #{actor_id} is dead")
    return actor


register_lookup("actor", _lookup_actor)


class ActorHost(Protocol):
    """The settings an actor table reads of its context (fray.kit.context.KitJobContext)."""

    @property
    def backend(self) -> str: ...

    namespace: str
    serialize: bool
    log_to_driver: bool


class ActorHooks(NamedTuple):
    """What the context does for its actors, handed to its table: store a value, capture a failure, and (its
    engine's, fray.kit.engine) make an instance and run a method."""

    encode: Callable[[Any, str], Any]
    remote_error: Callable[[BaseException], BaseException | RemoteError]
    new_instance: Callable[[Actor, Any], Any]
    run_method: Callable[[Actor, str, Any, int], Any]


class ActorTable:
    """The actors of one kit context (its collaborator: values are encoded, arguments resolved and failures
    captured by the context's hooks; resources held in its ledger, and the table changed under the ledger's lock,
    so that an actor and the resources it holds change together)."""

    def __init__(self, ctx: ActorHost, ledger: Ledger, checked_fns: dict[int, Any], hooks: ActorHooks) -> None:
        assert isinstance(ctx, JobContext)
        self.ctx = ctx
        self.job: JobContext = ctx  # (current while its calls run)
        self.ledger = ledger
        self.lock = ledger.lock
        self.checked_fns = checked_fns  # (the context's memo of the functions it has checked, shared with its tasks)
        self.encode, self.remote_error, self.new_instance, self.run_method = hooks
        self.names: dict[str, Actor] = {}
        self.own: dict[int, Actor] = {}  # the actors this context created (killed at its shutdown)

    def create(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle:
        ctx, options = self.ctx, request.options
        if ctx.serialize:
            check_function(klass, self.checked_fns)
            call: Any = dumps_call(f"{klass.__name__}()", args, kwargs, device_mode=KEPT)
        else:
            call = (args, kwargs)
        detached = options.lifetime is Lifetime.DETACHED
        with _detached_lock, self.lock:
            if options.name is not None:
                existing = self.find_named(options.name)
                if existing is not None:
                    if options.get_if_exists:
                        return self._handle(existing)
                    raise ActorAlreadyExistsError(
                        f"an actor named {options.name!r} exists already; pass ActorOptions(get_if_exists=True) "
                        "to reuse it, or pick another name"
                    )
            actor = Actor(self, klass, request, ctx.namespace, member)
            if options.name is not None:
                if detached:
                    _detached[(ctx.backend, ctx.namespace, options.name)] = actor
                else:
                    self.names[options.name] = actor
            if not detached:
                self.own[actor.id] = actor
        RECORDER.record(Kind.ACTOR_CREATE, actor.id, klass.__name__, {"name": options.name} if options.name else None)
        # The actor's resources are held from its start until it is killed; its __init__ runs first in its queue,
        # waiting there for those resources, so calls sent meanwhile queue up behind it in order.
        granted = threading.Event()
        if actor.request.resources:

            def dispatched(gpus: tuple[int, ...]) -> None:
                actor.gpus = gpus

            self.ledger.submit(actor.request.resources, lambda: granted.set(), dispatched)
        else:
            granted.set()
        actor.executor.submit(self._start_actor, actor, call, granted)
        return self._handle(actor)

    def find_named(self, name: str) -> Actor | None:
        actor = self.names.get(name) or _detached.get((self.ctx.backend, self.ctx.namespace, name))
        return actor if actor is not None and actor.death is None else None

    def _handle(self, actor: Actor) -> ActorHandle:
        # A detached actor outlives this context: its handle follows the context current where it is used.
        owner: Any = None if actor.options.lifetime is Lifetime.DETACHED else self.ctx
        return ActorHandle(
            actor, self.ctx.backend, actor.klass.__name__, public_methods(actor.klass), actor.options.name, ctx=owner
        )

    def _start_actor(self, actor: Actor, call: Any, granted: threading.Event) -> None:
        try:
            self._make_instance(actor, call, granted)
        finally:
            actor.started.set()

    def _make_instance(self, actor: Actor, call: Any, granted: threading.Event) -> None:
        while not granted.wait(0.5):
            if actor.death is not None:
                return
        with actor.lock:
            actor.holding = bool(actor.request.resources)
            if actor.death is not None:  # killed while waiting for resources
                self._release_actor(actor)
                return
        RECORDER.name_thread(f"actor {actor.label} #{actor.id}")
        token = current.push(self.job, lent=True)
        me = current.push_actor(actor.info)
        said = output.push_label(output.label_for(actor.klass.__name__)) if self.ctx.log_to_driver else None
        try:
            actor.instance = self.new_instance(actor, call)
        except BaseException as exc:
            error = exc.error.rebuild() if isinstance(exc, Failure) and isinstance(exc.error, RemoteError) else exc
            actor.death = ActorDiedError(
                f"actor {actor.label} died: its __init__ raised {type(error).__name__}: {error}"
            )
            reason = f"its __init__ raised {type(error).__name__}"
            RECORDER.record(Kind.ACTOR_DIED, actor.id, actor.klass.__name__, {"reason": reason})
            attach_remote_traceback(actor.death, format_exception(exc))
        finally:
            if said is not None:
                output.pop_label(said)
            current.pop_actor(me)
            current.pop(token)

    def _release_actor(self, actor: Actor) -> None:
        if actor.holding:
            actor.holding = False
            gpus, actor.gpus = actor.gpus, ()
            actor.table.ledger.give_back(actor.request.resources, gpus)

    def call(
        self,
        handle: ActorHandle,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stream: ItemQueue | None = None,
    ) -> ObjectRef:
        actor: Actor = handle.payload
        where = f"{actor.klass.__name__}.{method}"
        serialize = self.ctx.serialize and not immutable_call(args, kwargs)
        call = dumps_call(where, args, kwargs, device_mode=KEPT) if serialize else (args, kwargs)
        entry = Entry()
        gang = actor.member.gang if actor.member is not None else None
        life = gang.life() if gang is not None else 0  # (an SPMD group's life this call belongs to: _gang.Gang)
        with actor.lock:
            if actor.death is not None:
                entry.settle(error=_died(actor))
                return ObjectRef(entry, self.ctx.backend)
            actor.pending.add(entry)
            call_owner[entry] = actor
            RECORDER.record(Kind.CALL_SUBMIT, entry.id, where)
            try:
                actor.executor.submit(self._run_method, actor, method, call, entry, stream, life)
            except RuntimeError:  # executor shut down: the actor was killed just now
                actor.pending.discard(entry)
                entry.settle(error=_died(actor))
        return ObjectRef(entry, self.ctx.backend)

    def call_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        queue = ItemQueue()
        ref = self.call(handle, method, args, kwargs, stream=queue)
        end_stream_with_failure(ref.payload, queue, self.ctx.backend)
        return ObjectRefStream(queue, self.ctx.backend)

    def stream_items(self, items: Any, queue: ItemQueue, where: str) -> None:
        """Store each item the generator yields as its own object and hand its ref to the consumer, until the
        generator ends, fails (the failure is the last item) or the consumer closes the stream."""
        try:
            if not inspect.isgenerator(items) and not hasattr(items, "__next__"):
                raise TypeError(f"{where} was called as a stream but returned {type(items).__name__}, not a generator")
            for index, item in enumerate(items):
                entry = Entry()
                entry.settle(self.encode(item, f"item {index} of {where}"))
                queue.append(ObjectRef(entry, self.ctx.backend))
                if queue.stopped.is_set():
                    break
                time.sleep(0)  # let a waiting consumer take the GIL now, not after the 5 ms switch interval
            if inspect.isgenerator(items):
                items.close()
        except BaseException as exc:
            failed = Entry()
            failed.settle(error=self.remote_error(exc))
            queue.append(ObjectRef(failed, self.ctx.backend))
        finally:
            queue.end()

    def _run_method(
        self, actor: Actor, method: str, call: Any, entry: Entry, stream: ItemQueue | None = None, life: int = 0
    ) -> None:
        actor.started.wait()
        with actor.lock:
            if entry not in actor.pending:  # cancelled or the actor was killed
                return
            actor.pending.discard(entry)
            actor.running.add(entry)
        where = f"{actor.klass.__name__}.{method}"
        RECORDER.record(Kind.CALL_START, entry.id, where, actor.call_data)
        if actor.death is not None:
            error: Any = _died(actor)
        else:
            token = current.push(self.job, lent=True)
            me = current.push_actor(actor.info)
            said = output.push_label(output.label_for(actor.klass.__name__)) if self.ctx.log_to_driver else None
            try:
                result = self.run_method(actor, method, call, life)
                if inspect.iscoroutine(result):
                    result = actor.run_coroutine(result)
                if stream is not None:
                    self.stream_items(result, stream, f"{actor.klass.__name__}.{method}")
                    result = None
                value = self.encode(result, f"the return value of {method}")
                error = None
            except Failure as failure:
                error = failure.error
            except BaseException as exc:
                error = self.remote_error(exc)
            finally:
                if said is not None:
                    output.pop_label(said)
                current.pop_actor(me)
                current.pop(token)
        with actor.lock:
            actor.running.discard(entry)
        RECORDER.record(Kind.CALL_END, entry.id, where, None if error is None else ended(error))
        entry.settle(None if error else value, error)

    def get(self, name: str) -> ActorHandle:
        with _detached_lock, self.lock:
            actor = self.find_named(name)
        if actor is None:
            raise ActorNotFoundError(f"no live actor named {name!r} in namespace {self.ctx.namespace!r}")
        return self._handle(actor)

    def kill(self, actor: Actor, why: str) -> None:
        with actor.lock:
            if actor.death is not None and actor.id not in _actors:
                return
            if actor.death is None:
                actor.death = ActorDiedError(f"actor {actor.label} is dead: {why}")
                RECORDER.record(Kind.ACTOR_DIED, actor.id, actor.klass.__name__, {"reason": why})
            pending = [*actor.pending, *actor.running]
            actor.pending, actor.running = set(), set()
        for entry in pending:
            entry.settle(error=_died(actor))
        actor.executor.shutdown()
        actor.close()
        _actors.pop(actor.id, None)
        with _detached_lock, self.lock:
            name = actor.options.name
            if name is not None and self.names.get(name) is actor:
                del self.names[name]
            if name is not None and _detached.get((self.ctx.backend, actor.namespace, name)) is actor:
                del _detached[(self.ctx.backend, actor.namespace, name)]
            self.own.pop(actor.id, None)
        with actor.lock:
            self._release_actor(actor)


def end_stream_with_failure(entry: Entry, queue: ItemQueue, backend: str) -> None:
    """If the call or task behind a stream fails before its generator runs (killed actor, cancelled task, shut
    down context), that failure is the stream's last item, so its consumer never waits forever."""

    def settled(outcome: Outcome) -> None:
        if outcome.failed():
            queue.append(ObjectRef(entry, backend))
            queue.end()

    entry.outcome.add_callback(settled)


def _died(actor: Actor) -> ActorDiedError:
    assert actor.death is not None
    error = ActorDiedError(str(actor.death))
    if hasattr(actor.death, "remote_traceback"):
        attach_remote_traceback(error, actor.death.remote_traceback)
    return error
