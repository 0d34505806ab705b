"""Argument checks shared by JobContext and ClusterContext (the public methods check, then call the hooks)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

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
