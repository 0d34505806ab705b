"""The live controllers of this process, by key: how the coordinator actor (and the ref tracker's callbacks)
find the controller they serve without importing the controller module (which imports them)."""

from __future__ import annotations

import atexit
from typing import Any

from fray.errors import FrayError

_controllers: dict[str, Any] = {}
_exit_hook = False


def register(key: str, controller: Any) -> None:
    """Called by a Controller made after Monarch's client context: the exit hook registered here runs before
    Monarch's own (atexit runs last-registered first), which stops every process of the context."""
    global _exit_hook
    _controllers[key] = controller
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_abandon_all)


def _abandon_all() -> None:
    """The interpreter is exiting without shutdown(): from now on the processes' deaths are Monarch's doing. A
    controller that went on reacting would spawn replacements into a runtime that is stopping (a Rust panic)."""
    for controller in list(_controllers.values()):
        controller.abandon()


def unregister(key: str) -> None:
    _controllers.pop(key, None)


def lookup(key: str) -> Any | None:
    return _controllers.get(key)


def controller(key: str) -> Any:
    ctl = _controllers.get(key)
    if ctl is None:
        raise FrayError(f"the fray-monarch context {key} is shut down")
    return ctl
