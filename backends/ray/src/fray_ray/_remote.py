"""What runs inside Ray workers, and the registration of fray's functions and classes with Ray (the translation of
options and exceptions: fray_ray._translate; the workers' events: fray_ray._worker_events).

Tasks and actors are wrapped so that the first thing they do in a worker process is install a RayJobContext
attached to the worker's Ray connection; nested create_task / get / create_actor then go to the same cluster.
The wrappers reference only module-level functions of this (importable) module, so cloudpickle sends those by
reference and the per-process state below is the real module state, not a pickled copy.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import types
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import ray

from fray.backend import ActorInfo, current, serve_store, set_job_context, settings
from fray.backend import portable as make_portable
from fray_ray._gpus import RENDEZVOUS_ENV, ViewSeen, see_group_gpus
from fray_ray._heartbeats import start_heartbeat
from fray_ray._values import pack
from fray_ray._worker_events import actor_started, attach_worker, call_ended, call_started, task_ended, task_started

# --------------------------------------------------------------------------------------- inside a worker
_worker_ctx: Any = None
_worker_lock = threading.Lock()
# Makes this worker's context (a RayJobContext attached to the worker's Ray connection); installed by
# fray_ray.job at import, which imports this module (importing job from here would be a circle).
_make_worker_context: Callable[[], Any] | None = None


def install_worker_context(make: Callable[[], Any]) -> None:
    global _make_worker_context
    _make_worker_context = make


def worker_context() -> Any:
    """This worker's fray context, if it has one yet."""
    return _worker_ctx


def enter_worker() -> None:
    """Make a RayJobContext attached to this worker's Ray connection the current fray context (once)."""
    global _worker_ctx
    with _worker_lock:
        if _worker_ctx is None:
            # Always installed by now: unpickling anything of fray_ray imports the package, which imports job.
            assert _make_worker_context is not None, "fray_ray.job was not imported"
            _worker_ctx = _make_worker_context()
            # Work given no GPU sees none from this worker's next task on, where the job's runtime_env did not say
            # so already (fray_ray._connect; a Ray the user connected to themselves)
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "1")
            current.set_process_gpus(_assigned_gpus)
            attach_worker(ray._private.worker.global_worker.core_worker)  # type: ignore[attr-defined]
    set_job_context(_worker_ctx)


def _assigned_gpus() -> list[int]:
    """fray.current_gpus() in a Ray worker: the GPUs Ray assigned to the task or actor running here."""
    import ray

    return [int(i) for i in ray.get_gpu_ids()]


def stream_items(items: Any, end: Callable[[BaseException | None], None] | None = None) -> Iterator[Any]:
    """Each item of a generator (or any iterable), packed like a task result; an exception raised by the
    generator is raised portable (Ray reports it as the stream's next item, then ends the stream). `end` is
    called once the stream ends, with its error (its end event)."""
    error: BaseException | None = None
    try:
        for item in items:
            yield pack(item)
    except Exception as exc:
        error = exc
        portable = make_portable(exc)
        if portable is exc:
            raise
        raise portable from None
    except BaseException as exc:  # closed early (GeneratorExit) or cancelled
        error = exc
        raise
    finally:
        if end is not None:
            end(error)


async def stream_items_async(
    items: Any, end: Callable[[BaseException | None], None] | None = None
) -> AsyncIterator[Any]:
    error: BaseException | None = None
    try:
        async for item in items:
            yield pack(item)
    except Exception as exc:
        error = exc
        portable = make_portable(exc)
        if portable is exc:
            raise
        raise portable from None
    except BaseException as exc:
        error = exc
        raise
    finally:
        if end is not None:
            end(error)


def run_stream_task(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
    if _worker_ctx is None:
        enter_worker()
    started = task_started()
    try:
        items = fn(*args, **kwargs)
    except Exception as exc:
        task_ended(started, exc)
        portable = make_portable(exc)
        if portable is exc:
            raise
        raise portable from None
    return stream_items(items, None if started is None else functools.partial(task_ended, started))


def start_actor(member: tuple[ActorInfo, Mapping[str, str]] | None, class_name: str = "") -> None:
    """First thing in an actor's process: fray's worker context, who this actor is (`fray.current_actor()`) and,
    for an SPMD member, its torch.distributed environment (before the user's __init__ reads it)."""
    enter_worker()
    actor_started(class_name)
    if member is None:
        current.set_process_actor(ActorInfo())
        return
    info, env = member
    os.environ.update(env)
    current.set_process_actor(info)
    serve_store(env)  # rank 0 of an SPMD group: its rendezvous, bound to MASTER_ADDR only (fray.runtime.rendezvous)
    if RENDEZVOUS_ENV in env:  # an SPMD member holding GPUs sees its group's devices (done already: GroupView)
        see_group_gpus(dict(env))
    beat = settings.SPMD_HEARTBEAT.read(env)
    if beat is not None:  # an SPMD member says it is alive (fray_ray._gangs watches for silence)
        start_heartbeat(beat)


MEMBER_KWARG = "__fray_member__"  # the hidden creation argument carrying (ActorInfo, env) into the actor


def user_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """An actor's constructor arguments without the GroupView an SPMD member's come after (fray_ray._gpus)."""
    return args[1:] if args and type(args[0]) is ViewSeen else args


def _stream_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fray_stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from run_stream_task(fn, args, kwargs)

    try:
        functools.update_wrapper(fray_stream, fn)
    except (AttributeError, TypeError):
        fray_stream.__wrapped__ = fn  # type: ignore[attr-defined]
    return fray_stream


def _task_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    # One frame of fray's between Ray's and the user's, its line short: Ray prints a retried task's traceback cut
    # to its last ~500 characters, and fray's frames (two, one with a long line) had it cut mid-word.
    def fray_task(*args: Any, **kwargs: Any) -> Any:
        if _worker_ctx is None:
            enter_worker()
        started = task_started()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            task_ended(started, exc)
            portable = make_portable(exc)
            if portable is exc:
                raise
            raise portable from None
        except BaseException as exc:  # cancelled (KeyboardInterrupt), exiting
            task_ended(started, exc)
            raise
        task_ended(started)
        return pack(value)  # torch tensors in the result travel out of band (see _values)

    # Keeps fn's name (Ray's dashboard and task names) and signature (Ray checks arguments at submission).
    try:
        functools.update_wrapper(fray_task, fn)
    except (AttributeError, TypeError):
        fray_task.__wrapped__ = fn  # type: ignore[attr-defined]
    return fray_task


def _enter_loop_task() -> None:
    """Make the worker's fray context current in this asyncio task (Ray runs each async call in a task of its
    own, with a copy of the event loop thread's context, so nothing leaks from one call into another)."""
    if _worker_ctx is not None:
        current.push(_worker_ctx)


async def call_async(method: Callable[..., Any], where: str, instance: Any, args: Any, kwargs: Any) -> Any:
    _enter_loop_task()
    key = call_started(where)
    try:
        value = await method(instance, *args, **kwargs)
    except BaseException as exc:
        call_ended(key, where, exc)
        raise
    call_ended(key, where)
    return pack(value)


async def iterate_async(
    method: Callable[..., Any], where: str, instance: Any, args: Any, kwargs: Any
) -> AsyncIterator[Any]:
    _enter_loop_task()
    key = call_started(where)
    end = None if key is None else functools.partial(call_ended, key, where)
    async for item in stream_items_async(method(instance, *args, **kwargs), end):
        yield item


def iterate_sync(method: Callable[..., Any], where: str, instance: Any, args: Any, kwargs: Any) -> Iterator[Any]:
    key = call_started(where)
    end = None if key is None else functools.partial(call_ended, key, where)
    return stream_items(method(instance, *args, **kwargs), end)


def _packing_method(method: Callable[..., Any], where: str) -> Callable[..., Any]:
    """method, returning its result packed (torch tensors out of band); sync stays sync, async stays async,
    generators stay generators (each item packed). An async method runs on the actor's event loop (Ray makes an
    actor with an `async def` method an asyncio actor, at most max_concurrency coroutines at once) with the
    worker's fray context current in it.

    The wrappers are pickled by value with the actor class; they call only module-level functions of this
    module (pickled by reference), never read its state (such as _worker_ctx) themselves: cloudpickle would
    copy that state into the class."""
    packing: Callable[..., Any]
    if inspect.isasyncgenfunction(method):

        async def packing_async_gen(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            async for item in iterate_async(method, where, self, args, kwargs):
                yield item

        packing = packing_async_gen
    elif inspect.isgeneratorfunction(method):

        def packing_gen(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            yield from iterate_sync(method, where, self, args, kwargs)

        packing = packing_gen
    elif inspect.iscoroutinefunction(method):

        async def packing_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await call_async(method, where, self, args, kwargs)

        packing = packing_async
    else:

        def packing_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            # inline (no frame of fray's more between Ray's and the method's in a remote traceback)
            key = call_started(where)
            try:
                value = method(self, *args, **kwargs)
            except BaseException as exc:
                call_ended(key, where, exc)
                raise
            call_ended(key, where)
            return pack(value)

        packing = packing_sync
    # Ray reads a method's signature, generator-ness and @ray.method settings through inspect.unwrap, so it
    # sees the user's method; update_wrapper also copies those settings (__ray_*__ attributes) and the names.
    functools.update_wrapper(packing, method)
    return packing


def _packed_methods(klass: type) -> dict[str, Any]:
    """Wrappers for klass's public plain methods whose results can be packed (generators: each item): not
    static or class methods, not @ray.method(num_returns=n) (Ray splits the result) nor methods with a tensor
    transport (Ray's own tensor path)."""
    out: dict[str, Any] = {}
    for name in dir(klass):
        if name.startswith("_"):
            continue
        method = inspect.getattr_static(klass, name, None)
        if not inspect.isfunction(method):
            continue
        if getattr(method, "__ray_num_returns__", 1) not in (1, None, "streaming"):
            continue
        if getattr(method, "__ray_tensor_transport__", None) is not None:
            continue
        out[name] = _packing_method(method, f"{klass.__name__}.{name}")
    return out


def _actor_class(klass: type) -> type:
    """A subclass of klass whose __init__ first installs the worker's fray context, and whose public methods
    pack their results (torch tensors out of band). Each wrapper keeps its method's kind (sync, async, generator)
    and Ray-visible settings, so Ray treats the actor exactly as it would klass itself. The hidden creation
    argument MEMBER_KWARG says who the actor is (`fray.current_actor()`) and an SPMD member's environment."""
    base_init = klass.__init__  # type: ignore[misc]
    class_name = klass.__name__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # start_actor is referenced by name, so cloudpickle sends it by reference (not _worker_ctx by value)
        start_actor(kwargs.pop(MEMBER_KWARG, None), class_name)
        base_init(self, *user_args(args), **kwargs)

    # __module__ is ours (so pickling by reference fails and cloudpickle sends the class by value), while the
    # names stay the user's, as Ray shows them and as fray reports them.
    namespace = {
        **_packed_methods(klass),
        "__init__": __init__,
        "__module__": __name__,
        "__qualname__": klass.__qualname__,
        "__doc__": klass.__doc__,
    }
    return type(klass.__name__, (klass,), namespace)


# --------------------------------------------------------------------------------------- registration cache
def registered_callable(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The function Ray registers for a task of fn, and that task's arguments. A bound method (or a callable
    object) is registered as its class's function, its object travelling as the first argument: registered as
    itself, its Registry entry (weakly keyed by it, but the registration holds it) would keep the method, and its
    object, alive as long as the process."""
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return fn.__func__, (fn.__self__, *args)
    call = inspect.getattr_static(type(fn), "__call__", None)
    if not isinstance(fn, (types.FunctionType, type)) and isinstance(call, types.FunctionType):
        return call, (fn, *args)
    return fn, args


class Registry:
    """ray.remote(...) once per function or class, not per call. Weakly keyed where possible, else keyed by id
    with an identity check. A registration holds its function, so an entry lives as long as the process: bound
    methods and callable objects come here as their class's function (registered_callable)."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def lookup(self, obj: Any) -> Any:
        try:
            return self._weak.get(obj)
        except TypeError:
            entry = self._by_id.get(id(obj))
            return entry[1] if entry is not None and entry[0] is obj else None

    def remote_function(self, fn: Callable[..., Any], max_calls: int | None = None) -> Any:
        found = self.lookup(fn)
        if found is None:
            found = self._store(fn, ray.remote(_task_function(fn)))
        if max_calls is None:
            return found
        # Ray accepts max_calls only in ray.remote(), not in .options(): one registration per value.
        variants = found.__dict__.setdefault("_fray_max_calls", {})
        if max_calls not in variants:
            variants[max_calls] = ray.remote(max_calls=max_calls)(_task_function(fn))
        return variants[max_calls]

    def stream_function(self, fn: Callable[..., Any], max_calls: int | None = None) -> Any:
        """ray.remote of fn as a generator task (use a Registry of its own: fn's plain registration differs)."""
        found = self.lookup(fn)
        if found is None:
            found = self._store(fn, ray.remote(num_returns="streaming")(_stream_function(fn)))
        if max_calls is None:
            return found
        variants = found.__dict__.setdefault("_fray_max_calls", {})
        if max_calls not in variants:
            variants[max_calls] = ray.remote(num_returns="streaming", max_calls=max_calls)(_stream_function(fn))
        return variants[max_calls]

    def actor_class(self, klass: type) -> Any:
        found = self.lookup(klass)
        if found is None:
            found = self._store(klass, ray.remote(_actor_class(klass)))
        return found

    def _store(self, key: Any, value: Any) -> Any:
        with self._lock:
            try:
                return self._weak.setdefault(key, value)
            except TypeError:
                self._by_id[id(key)] = (key, value)
                return value
