"""Argument checks shared by JobContext and ClusterContext (the public methods check, then call the hooks)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fray.errors import InfeasibleResourcesError
from fray.runtime.refs import ObjectRef
from fray.runtime.resources import fits, format_resources
from fray.types import ActorOptions, TaskOptions

__all__ = ["DEFAULTS", "FEASIBLE_SECONDS", "check_call", "check_options", "check_timeout"]

T = TypeVar("T")


def check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    return float(timeout)


def check_call(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__} (did you mean args=(x,)?)")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return tuple(args), dict(kwargs)


DEFAULTS: dict[type, Any] = {TaskOptions: TaskOptions(), ActorOptions: ActorOptions()}  # frozen: safe to share
FEASIBLE_SECONDS = 5.0  # how long a "this request fits some node" answer is reused (nodes can come and go)


def check_options(options: Any, cls: type[T]) -> T:
    if options is None:
        return DEFAULTS[cls]  # type: ignore[no-any-return]
    if not isinstance(options, cls):
        raise TypeError(f"options must be a fray.{cls.__name__}, got {type(options).__name__}")
    return options


def not_a_ref(value: Any, index: int | None = None) -> ValueError:
    """get/wait given something that is not a ref: what it is, and which item of the list (index)."""
    text = repr(value)
    shown = f"{type(value).__name__} ({text if len(text) <= 60 else text[:57] + '...'})"
    if index is None:
        return ValueError(f"expected an ObjectRef, got {shown}")
    return ValueError(
        f"item {index} of the list is {shown}, not an ObjectRef: get and wait take refs (from create_task, an "
        "actor call or put); pass plain values as they are"
    )


def check_group_args(klass: Any, count: Any, placement: Any, placements: tuple[str, ...]) -> None:
    """create_actor_group's class, member count and placement."""
    if not isinstance(klass, type):
        raise TypeError(f"create_actor_group needs a class, got {type(klass).__name__}")
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {count!r}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if placement not in placements:
        raise ValueError(f"placement must be one of {', '.join(map(repr, placements))}, got {placement!r}")


def check_wait_args(refs: Any, num_returns: Any, backend: str) -> None:
    """wait's list (a list or tuple of this backend's refs, each once) and num_returns."""
    if not isinstance(refs, (list, tuple)):
        raise ValueError(f"wait needs a list of ObjectRefs, got {type(refs).__name__}")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int):
        raise TypeError(f"num_returns must be an int, got {num_returns!r}")
    if num_returns < 1:
        raise ValueError(f"num_returns must be >= 1, got {num_returns}")
    seen: set[Any] = set()
    for index, ref in enumerate(refs):
        check_ref(ref, backend, index)
        if ref in seen:
            raise ValueError(f"wait got the same ref twice: {ref!r}")
        seen.add(ref)


def check_ref(ref: Any, backend: str, index: int | None = None) -> None:
    """A ref of this backend's, or a ValueError / TypeError that says what it is instead."""
    if not isinstance(ref, ObjectRef):
        raise not_a_ref(ref, index)
    if ref.backend != backend:
        raise ValueError(f"{ref!r} belongs to the {ref.backend!r} backend, not to this {backend!r} context")


def refuse_infeasible(
    cache: dict[Any, float],
    node_resources: Callable[[], list[dict[str, float]]],
    key: tuple[tuple[str, float], ...],
    what: str | Callable[[], str],
    backend: str,
) -> None:
    """JobContext.check_feasible: InfeasibleResourcesError unless some node fits the request `key` ((name, amount)
    pairs; an answer that it fits is kept in `cache` under that key for FEASIBLE_SECONDS: the same request built
    the same way hits, another order just misses). `what` names the request, or makes its name when it is refused."""
    now = time.monotonic()
    if cache.get(key, 0.0) > now:
        return
    request = dict(key)
    nodes = node_resources()
    for node in nodes:
        if fits(node, request):
            if len(cache) > 256:
                cache.clear()
            cache[key] = now + FEASIBLE_SECONDS
            return
    largest = max(nodes, key=lambda n: n.get("CPU", 0.0)) if nodes else {}
    what = what if isinstance(what, str) else what()
    raise InfeasibleResourcesError(
        f"{what} requests {format_resources(request)} but no node of this {backend} context has that much "
        f"(largest node: {format_resources(largest)}). Lower the request or add nodes with those resources."
    )
