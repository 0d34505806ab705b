"""A call as the core checked it, handed to a backend's hook as one immutable value: the options as given, what the
work holds while it runs (computed once, by fray.runtime.resources, from the options and their runtime_env), and
the name its events and errors use. A backend reads what it needs from the request and computes none of it again.

`resources` is a tuple of (name, amount) pairs sorted by name: immutable, hashable (what a scheduler keys its
queues by), and as cheap to compare as the request it came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fray.runtime.resources import actor_resources, task_resources
from fray.types import ActorOptions, TaskOptions

__all__ = ["ActorRequest", "CallRequest", "GroupRequest", "Resources", "TaskRequest", "actor_request", "task_request"]

Resources = tuple[tuple[str, float], ...]
OptionsT = TypeVar("OptionsT", TaskOptions, ActorOptions)


@dataclass(frozen=True, slots=True)
class CallRequest(Generic[OptionsT]):
    """A task (`TaskRequest`: it holds `resources` while it runs) or an actor, or each member of a group
    (`ActorRequest`: it holds them for its whole life), with its `options`; events name it `name`."""

    options: OptionsT
    resources: Resources
    name: str

    def resource_dict(self) -> dict[str, float]:
        return dict(self.resources)


TaskRequest = CallRequest[TaskOptions]
ActorRequest = CallRequest[ActorOptions]


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """`count` members made together, each as `member` asks; placed as asked (best effort unless `strict`), and,
    for `distributed`, each in a process of its own with the torch.distributed environment set."""

    member: ActorRequest
    count: int
    placement: str
    strict: bool
    distributed: bool


def _callable_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if type(name) is str else str(fn)


# The request last made: a loop that submits one function with one options object (a map's items, a batch of
# tasks) gets the same immutable request every time instead of computing it again. It holds the options and the
# function's name, never the function (a bound method would keep its object alive).
_last_task: TaskRequest | None = None


def task_request(fn: Callable[..., Any], options: TaskOptions) -> TaskRequest:
    global _last_task
    name = options.name or _callable_name(fn)
    last = _last_task
    if last is not None and last.options is options and last.name == name:
        return last
    request = _last_task = CallRequest(options, tuple(sorted(task_resources(options).items())), name)
    return request


def actor_request(klass: type, options: ActorOptions) -> ActorRequest:
    return CallRequest(options, tuple(sorted(actor_resources(options).items())), options.name or klass.__name__)
