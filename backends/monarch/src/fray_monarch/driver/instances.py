"""The live controllers of this process, by key: how the coordinator actor (and the ref tracker's callbacks)
find the controller they serve without importing the controller module (which imports them)."""

from __future__ import annotations

import atexit
from typing import Any

from fray.errors import FrayError
from fray_monarch.core import runtime

_controllers: dict[str, Any] = {}
_exit_hook = False


def register(key: str, controller: Any) -> None:
    """Called by a Controller made after Monarch's client context: the exit hook registered here runs before
    Monarch's own (atexit runs last-registered first), which stops every process of the context."""
    global _exit_hook
    _controllers[key] = controller
    if not _exit_hook:
        _exit_hook = True
        atexit.register(run_exit_hook)


def run_exit_hook() -> None:
    """The interpreter is exiting without shutdown(): from now on the processes' deaths are Monarch's doing. A
    controller that went on reacting would spawn replacements into a runtime that is stopping (a Rust panic), and
    its coordinator's thread must end before the interpreter finalizes (Controller.abandon), as must the thread of
    the actor Monarch keeps in every client process (runtime.stop_client_controller)."""
    for controller in list(_controllers.values()):
        controller.abandon()
    runtime.stop_client_controller()


def unregister(key: str) -> None:
    _controllers.pop(key, None)


def lookup(key: str) -> Any | None:
    return _controllers.get(key)


def controller(key: str) -> Any:
    ctl = _controllers.get(key)
    if ctl is None:
        raise FrayError(f"the fray-monarch context {key} is shut down")
    return ctl
