"""The live controllers of this process, by key: how the coordinator actor (and the ref tracker's callbacks)
find the controller they serve without importing the controller module (which imports them)."""

from __future__ import annotations

from typing import Any

from fray.errors import FrayError

_controllers: dict[str, Any] = {}


def register(key: str, controller: Any) -> None:
    _controllers[key] = controller


def unregister(key: str) -> None:
    _controllers.pop(key, None)


def lookup(key: str) -> Any | None:
    return _controllers.get(key)


def controller(key: str) -> Any:
    ctl = _controllers.get(key)
    if ctl is None:
        raise FrayError(f"the fray-monarch context {key} is shut down")
    return ctl
