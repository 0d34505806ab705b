"""Actors on Ray for one context: creating them (with fray's own get-or-create for names), finding them by name,
and killing them so that the kill is seen at once.

Two Ray behaviours are worked around here:
- Ray registers a name asynchronously and its name check / `get_if_exists` is a racy lookup (creating the same
  name twice back to back succeeded). So fray does get-or-create itself: look up, create, then poll the name
  until it resolves; resolving to another actor means we lost a race (get_if_exists: the winner; else
  ActorAlreadyExistsError).
- Ray garbage-collects a non-detached named actor as soon as its creator drops its handles (an actor made by
  get-or-create inside a task died when that task returned). So the context keeps a handle per named
  non-detached actor it made, released by kill or shutdown.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import ray
import ray.exceptions as rex

from fray.backend import (
    RECORDER,
    ActorHandle,
    ActorInfo,
    ActorRequest,
    JobContext,
    Kind,
    Lifetime,
    Member,
    check_function,
    find_unserializable_argument,
    public_methods,
)
from fray.errors import ActorAlreadyExistsError, ActorNotFoundError
from fray_ray._args import is_serialization_error, unwrap_args, unwrap_kwargs
from fray_ray._driver_events import DeathWatch
from fray_ray._gpus import RENDEZVOUS_ENV, GroupView
from fray_ray._remote import MEMBER_KWARG, Registry
from fray_ray._translate import actor_options

__all__ = ["RayActors"]

_BACKEND = "ray"
_NAME_TIMEOUT = 10.0  # a named actor whose __init__ fails fast may never be seen by name
_KILL_TIMEOUT = 10.0  # how long a kill waits to see the actor dead and its name free
_methods_cache: dict[type, frozenset[str]] = {}


class RayActors:
    """The actors of one context (`ctx`, which their handles call through) in one Ray namespace. `registry`
    and `checked` are the process's registration cache and its record of functions checked for pickling."""

    def __init__(
        self, ctx: JobContext, namespace: str, registry: Registry, checked: dict[int, Any], driver: bool = False
    ) -> None:
        self._ctx = ctx
        # the deaths of the actors made here that Ray reports (a driver's context only: fray_ray._driver_events)
        self.deaths = DeathWatch(ray.get_runtime_context().get_job_id(), driver)
        self.namespace = namespace
        self._registry = registry
        self._checked = checked
        self._named: dict[str, Any] = {}  # name -> Ray handle of the named non-detached actors created here

    def create(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
        ray_options: Mapping[str, Any] | None = None,
    ) -> ActorHandle:
        """member: who the actor is in its group (fray.current_actor()) and an SPMD member's environment, both
        set in the actor's process before klass.__init__ runs. ray_options: extra Ray options (a group's
        placement, a Ray name for an unnamed group's member)."""
        actor_cls = self._registry.lookup(klass)
        if actor_cls is None:
            check_function(klass, self._checked)
            actor_cls = self._registry.actor_class(klass)
        methods = _methods_cache.get(klass)
        if methods is None:
            methods = _methods_cache[klass] = public_methods(klass)
        options = request.options
        name = options.name
        if name is not None and options.get_if_exists:
            existing = self._lookup(name)
            if existing is not None:
                return ActorHandle(existing, _BACKEND, klass.__name__, methods, name, self._ctx)
        options_ = actor_options(request)
        if ray_options:
            options_.update(ray_options)
        ray_kwargs = unwrap_kwargs(kwargs)
        if member is not None:
            ray_kwargs = {**ray_kwargs, MEMBER_KWARG: (member.info, dict(member.env))}
        elif name is not None:
            ray_kwargs = {**ray_kwargs, MEMBER_KWARG: (ActorInfo(name=name), {})}
        try:
            ray_args = unwrap_args(args)
            if member is not None and RENDEZVOUS_ENV in member.env:  # (its view is set before the rest unpickle)
                ray_args = (GroupView(dict(member.env)), *ray_args)
            handle = actor_cls.options(**options_).remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if is_serialization_error(exc):
                raise find_unserializable_argument(klass.__qualname__, args, kwargs, exc) from None
            raise
        except ValueError as exc:
            if not ("already taken" in str(exc) or isinstance(exc, rex.ActorAlreadyExistsError)):
                raise
            handle = None
        if name is not None:
            # Ray registers a name asynchronously and checks it with a racy lookup first. Wait until the name
            # resolves: to our actor (we won), or to another one (we lost a race, and Ray drops ours).
            winner = self._await_name(name, handle)
            if winner is not None and (handle is None or winner._actor_id != handle._actor_id):
                if not options.get_if_exists:
                    raise ActorAlreadyExistsError(
                        f"an actor named {name!r} exists already in namespace {self.namespace!r}; "
                        "pass get_if_exists=True to reuse it"
                    )
                handle = winner
            elif handle is None:
                raise ActorAlreadyExistsError(f"an actor named {name!r} exists already (and just died)")
            # Ray garbage-collects a non-detached actor once its creator drops its handles, even when named.
            # A named actor must stay reachable by name: keep a handle for the life of this process.
            if options.lifetime is not Lifetime.DETACHED:
                self._named[name] = handle
        if RECORDER.enabled:
            RECORDER.record(Kind.ACTOR_CREATE, handle._actor_id.hex(), klass.__name__, {"name": name} if name else None)
            self.deaths.created(handle._actor_id.hex(), klass.__name__)
        return ActorHandle(handle, _BACKEND, klass.__name__, methods, name, self._ctx)

    def _lookup(self, name: str) -> Any:
        try:
            return ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None

    def _await_name(self, name: str, mine: Any) -> Any:
        deadline = time.monotonic() + _NAME_TIMEOUT
        pause = 0.001
        while True:
            found = self._lookup(name)
            if found is not None or time.monotonic() > deadline:
                return found
            if mine is None and time.monotonic() > deadline - _NAME_TIMEOUT + 1.0:
                return None  # the actor that held the name died meanwhile
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def get(self, name: str) -> ActorHandle:
        """The live actor called name in this namespace (ActorNotFoundError if none)."""
        try:
            handle = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            raise ActorNotFoundError(f"no live actor named {name!r} in namespace {self.namespace!r}") from None
        descriptor = handle._ray_actor_creation_function_descriptor
        methods = frozenset(m for m in handle._ray_method_signatures if not m.startswith("_"))
        return ActorHandle(handle, _BACKEND, descriptor.class_name.rpartition(".")[2], methods, name, self._ctx)

    def kill(self, handles: Iterable[ActorHandle]) -> None:
        """ray.kill each (no restart), then wait (briefly) until this driver sees each one dead and its name is
        free, so that a call made after kill fails and the name can be reused."""
        handles = list(handles)
        named: list[tuple[str, Any]] = []
        for handle in handles:
            record = self.deaths.killed(handle.payload._actor_id.hex())  # (not also by the watch; not twice)
            ray.kill(handle.payload, no_restart=True)
            if record and RECORDER.enabled:
                reason = {"reason": "it was killed (ctx.kill)"}
                RECORDER.record(Kind.ACTOR_DIED, handle.payload._actor_id.hex(), handle.class_name, reason)
            if handle.name is None:
                continue
            kept = self._named.get(handle.name)
            if kept is not None and kept._actor_id == handle.payload._actor_id:
                del self._named[handle.name]
            named.append((handle.name, handle.payload._actor_id))
        deadline = time.monotonic() + _KILL_TIMEOUT
        _wait_until_dead([handle.payload for handle in handles], deadline)
        for name, actor_id in named:
            while time.monotonic() < deadline:
                try:
                    found = ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    break
                if found._actor_id != actor_id:
                    break
                time.sleep(0.02)

    def forget(self) -> None:
        """Drop the handles kept for named actors (at shutdown: Ray may then collect those actors)."""
        self._named.clear()


def _wait_until_dead(actors: list[Any], deadline: float) -> None:
    """ray.kill is asynchronous: a call made right after it can still reach the live worker and succeed (1 in 40
    fresh actors in raw Ray on this machine; a group member, every time in tests/ray). Probe each actor with
    Ray's built-in no-op method until the probe fails; from then on this driver's submitter knows the actor is
    dead and fails every later call with ActorDiedError. Past the deadline, give up quietly: the kill itself was
    requested."""
    while actors and time.monotonic() < deadline:
        probes = {actor.__ray_ready__.remote(): actor for actor in actors}
        done, pending = ray.wait(list(probes), num_returns=len(probes), timeout=max(0.0, deadline - time.monotonic()))
        if pending:
            return
        actors = [probes[probe] for probe in done if _answers(probe)]  # the kill has not reached these yet
        if actors:
            time.sleep(0.005)


def _answers(probe: Any) -> bool:
    try:
        ray.get(probe)
    except rex.RayActorError:
        return False
    return True
