"""The current job context: the one of this task, actor or thread, else the process default (set by fray.init).

A leaf module (it imports only fray.errors and fray.host.settings, themselves leaves), so contexts, refs, the
registry and the backends can all depend on it without import circles: what it needs of the registry (making the default
context, a backend's context in a worker) the registry installs here when it is imported (`install`). It holds
fray.context.JobContext objects, typed as `CurrentContext`, the little of one that needs no other module: a
module needing more of the context found here says what in a Protocol of its own (fray.runtime.refs.RefContext), and
`fray.get_job_context` (fray.context's) returns it as the JobContext it is.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from fray.errors import FrayError
from fray.host import settings

__all__ = [
    "ActorInfo",
    "CurrentContext",
    "clear_job_context",
    "current_actor",
    "current_gpus",
    "get_job_context",
    "install",
    "using",
]


class CurrentContext(Protocol):
    """What this module and the registry need of a job context (a fray.context.JobContext)."""

    owns_resources: bool

    @property
    def backend(self) -> str: ...

    def shutdown(self) -> None: ...


C = TypeVar("C", bound=CurrentContext)

_current: contextvars.ContextVar[CurrentContext | None] = contextvars.ContextVar("fray_job_context", default=None)
_default: CurrentContext | None = None
_default_lock = threading.Lock()


_make_default: Callable[[], CurrentContext] | None = None
_context_here: Callable[[str], CurrentContext | None] | None = None


def install(make_default: Callable[[], CurrentContext], context_here: Callable[[str], CurrentContext | None]) -> None:
    """Called by fray.registry at import: how to make the default context (fray.init from FRAY_BACKEND) and
    how to find a backend's context in this process (Backend.context_here)."""
    global _make_default, _context_here
    _make_default, _context_here = make_default, context_here


def get_job_context() -> CurrentContext:
    """The job context of this task, actor, or thread; else the process default (set by fray.init).

    With neither, the default is created from FRAY_BACKEND (in_memory when unset), as Ray auto-initializes.
    """
    ctx = _current.get()
    if ctx is not None:
        return ctx
    if _default is not None:
        return _default
    if _make_default is None:
        raise FrayError("no fray context here, and fray.registry is not imported to make one: import fray")
    with _default_lock:
        return _default if _default is not None else _make_default()


def set_current(ctx: CurrentContext) -> contextvars.Token[CurrentContext | None]:
    """Make ctx current for this thread/task (and the process default if there is none yet)."""
    global _default
    if _default is None:
        _default = ctx
    return _current.set(ctx)


def clear_job_context() -> None:
    """Forget the current context (and the process default)."""
    global _default
    _current.set(None)
    _default = None


class using(Generic[C]):
    """`with fray.using(ctx): ...` makes ctx the current context of this thread (or asyncio task) inside the
    block, and restores the previous one after. Backends run user code in tasks and actors this way."""

    __slots__ = ("ctx", "token")

    def __init__(self, ctx: C) -> None:
        self.ctx = ctx

    def __enter__(self) -> C:
        self.token = _current.set(self.ctx)
        return self.ctx

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _current.reset(self.token)


def context_for(backend: str) -> CurrentContext:
    """Where a pickled JobContext of `backend` lands: the context current here if it is of that backend, else
    the one this process has with that backend (a worker's), else get_job_context()."""
    ctx = _current.get() or _default
    if ctx is not None and ctx.backend == backend:
        return ctx
    here = _context_here(backend) if _context_here is not None else None
    return here if here is not None else get_job_context()


_lent: contextvars.ContextVar[CurrentContext | None] = contextvars.ContextVar("fray_lent_context", default=None)


def push(ctx: CurrentContext, lent: bool = False) -> tuple[contextvars.Token[Any], ...]:
    """Make ctx current here until pop(token): `using` for code whose try/finally cannot be a with-block.
    lent=True: user code runs here under a context it does not own (in_memory's tasks and actors run under
    their driver's): its shutdown() from here is a no-op."""
    if lent:
        return _current.set(ctx), _lent.set(ctx)
    return (_current.set(ctx),)


def pop(token: tuple[contextvars.Token[Any], ...]) -> None:
    for one in reversed(token):
        one.var.reset(one)


def lent(ctx: CurrentContext) -> bool:
    """ctx is lent to the code running here (see push)."""
    return _lent.get() is ctx


def current() -> CurrentContext | None:
    """The context set for this thread or task (None outside any), without falling back to the default."""
    return _current.get()


def default() -> CurrentContext | None:
    return _default


def set_default(ctx: CurrentContext | None) -> None:
    """Make ctx the process default (None: no default)."""
    global _default
    _default = ctx


def make_current(ctx: CurrentContext | None) -> None:
    """Set the current context of this thread outright (fray.init; a worker process's own context)."""
    _current.set(ctx)


def forget(ctx: CurrentContext) -> None:
    """ctx is shut down: it is no longer the default, nor current here."""
    global _default
    if _default is ctx:
        _default = None
    if _current.get() is ctx:
        _current.set(None)


# ----------------------------------------------------------------------------- the actor running here


@dataclass(frozen=True)
class ActorInfo:
    """Who `fray.current_actor()` is: an actor's name, its rank in the group it was created in and that group's
    size and name. A plain actor is rank 0 of 1. `restarts`: how many times this actor (for a member of an SPMD
    group: its whole group) has been restarted, 0 at creation, so __init__ can resume from a checkpoint."""

    name: str | None = None
    rank: int = 0
    size: int = 1
    group: str | None = None
    restarts: int = 0


_actor: contextvars.ContextVar[ActorInfo | None] = contextvars.ContextVar("fray_actor", default=None)
_process_actor: ActorInfo | None = None  # where an actor owns its whole process (ray, monarch, SPMD members)


def current_actor() -> ActorInfo:
    """The actor this code runs in: `rank`, `size` (of its group; 0 and 1 for a plain actor) and `name`."""
    info = _actor.get() or _process_actor
    if info is None:
        raise FrayError(
            "fray.current_actor() was called outside any actor; call it from an actor's __init__ or methods"
        )
    return info


def set_process_actor(info: ActorInfo | None) -> None:
    """The actor that owns this whole process (every thread and event loop in it sees it)."""
    global _process_actor
    _process_actor = info


def push_actor(info: ActorInfo | None) -> contextvars.Token[ActorInfo | None]:
    """Make info the current actor of this thread (or asyncio task) until pop_actor(token)."""
    return _actor.set(info)


def pop_actor(token: contextvars.Token[ActorInfo | None]) -> None:
    _actor.reset(token)


# ----------------------------------------------------------------------------- the GPUs held here

_gpus: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("fray_gpus", default=None)
_process_gpus: Callable[[], list[int]] | None = None  # a backend's own answer for this process (Ray's get_gpu_ids)


def current_gpus() -> list[int]:
    """The ids of the GPUs that the task, actor or group member running here holds (`ray.get_gpu_ids()`): the
    host's own numbers for them, e.g. [2, 3]. In a process fray started for that work they are its
    CUDA_VISIBLE_DEVICES (torch numbers them cuda:0, cuda:1 there); in an in_memory thread the first one is the
    thread's current CUDA device. [] for work that holds no GPU, and outside any work."""
    held = _gpus.get()
    if held is not None:
        return list(held)
    if _process_gpus is not None:
        return _process_gpus()
    return list(held_from_env())


def held_from_env(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The devices a process fray started for work holding GPUs holds: FRAY_GPUS, else ()."""
    return settings.GPUS.read(environ)


def push_gpus(held: tuple[int, ...]) -> contextvars.Token[tuple[int, ...] | None]:
    """Work holding the devices `held` runs on this thread (or asyncio task) until pop_gpus(token)."""
    return _gpus.set(held)


def pop_gpus(token: contextvars.Token[tuple[int, ...] | None]) -> None:
    _gpus.reset(token)


def set_process_gpus(answer: Callable[[], list[int]] | None) -> None:
    """How a backend tells, in its worker processes, the GPUs of the work running there (None: FRAY_GPUS)."""
    global _process_gpus
    _process_gpus = answer
