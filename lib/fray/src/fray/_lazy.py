"""Names of a face (`fray`, `fray.backend`) imported from their modules when first asked for.

A face re-exports what its audience uses from many modules. Importing them all up front made every process that
imports any module of fray load the whole package: the watchdog, a job's supervisor and its ranks, a Monarch mesh
process that only runs tasks. A face instead lists where each name lives, and its module `__getattr__` imports that
module on first use (then the name is a plain attribute of the face). The face imports the same names under
`TYPE_CHECKING`, for type checkers and editors; tests/unit/test_core_layout.py checks that the two lists agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(
    face: str, namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of the face `face` (its module's `namespace`), for names that live in other
    modules: `homes` maps a module to the names the face takes from it, separated by spaces. A name that is the
    module's own last component is the module itself (`"fray.host.procfs": "procfs Identity"`)."""
    home_of = {name: module for module, names in homes.items() for name in names.split()}

    def getattr_(name: str) -> Any:
        home = home_of.get(name)
        if home is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home.rpartition(".")[2] == name else getattr(module, name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *home_of})

    return getattr_, dir_
