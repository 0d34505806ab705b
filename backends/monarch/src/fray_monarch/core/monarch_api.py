"""Monarch's actor API as fray uses it, with types: the one boundary between fray's typed code and Monarch.

Monarch 0.7 ships no type information (no py.typed), so to mypy its `Actor` is Any (a class cannot subclass Any
under --strict) and `endpoint` is an untyped decorator (it would make every endpoint untyped). Under
TYPE_CHECKING this module declares what fray relies on instead: `Actor` is a plain base class and `endpoint`
returns the method it decorates (Monarch wraps it in an endpoint object, which callers reach only through actor
meshes, themselves untyped). At run time these are Monarch's own objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

__all__ = ["Actor", "endpoint"]

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:

    class Actor:
        """monarch.actor.Actor: a class whose instances Monarch spawns on a process mesh."""

    @overload
    def endpoint(method: F, /) -> F: ...

    @overload
    def endpoint(*, explicit_response_port: bool = False) -> Callable[[F], F]: ...

    def endpoint(method: Any = None, /, *, explicit_response_port: bool = False) -> Any:
        """monarch.actor.endpoint: a method other processes call through an actor mesh."""

else:
    from monarch.actor import Actor, endpoint
