"""Loaded by each worker of a private Ray instance before its first task (Ray's `preload_python_modules`): the
worker registers Ray's serialization add-ons for pydantic, starlette and pyarrow when it first imports each of
those libraries, or at once where it already has, instead of importing all three as it makes its serialization
context: a large part of a worker's start, wasted where no task of it uses them.

Each add-on is the one Ray registers (`ray.util.serialization_addons.apply`), with the same serializers; only
the moment differs, and it is always before the library's first object can be pickled. Loaded anywhere but a Ray
worker, this module changes nothing. Nothing here raises: a worker where this cannot be set up registers the
add-ons as Ray does.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["ADDONS", "after_import", "install"]

log = logging.getLogger("fray_ray")


def _register_pydantic(context: Any) -> None:
    from ray._common.pydantic_compat import register_pydantic_serializers

    register_pydantic_serializers(context)  # type: ignore[no-untyped-call]


def _register_starlette(context: Any) -> None:
    from ray.util.serialization_addons import register_starlette_serializer

    register_starlette_serializer(context)  # type: ignore[no-untyped-call]


def _register_arrow(context: Any) -> None:
    from ray._private.arrow_serialization import _register_custom_datasets_serializers

    _register_custom_datasets_serializers(context)  # type: ignore[no-untyped-call]


# The library whose first import brings each add-on, as ray.util.serialization_addons.apply registers them.
ADDONS: tuple[tuple[str, Callable[[Any], None]], ...] = (
    ("pydantic", _register_pydantic),
    ("starlette", _register_starlette),
    ("pyarrow", _register_arrow),
)


class _RunAfterExec(importlib.abc.Loader):
    """A module's loader, and then `then` once the module has run; the module keeps its own loader."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs what waits on a top-level module once that module's first import has finished (in the importing
    thread, before any other thread can use the module: it holds the module's import lock until then)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, list[Callable[[], None]]] = {}

    def add(self, name: str, then: Callable[[], None]) -> None:
        with self._lock:
            self._waiting.setdefault(name, []).append(then)
        if name in sys.modules:  # imported while this was being added
            self._run(name)

    def waiting(self) -> list[str]:
        with self._lock:
            return sorted(self._waiting)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        with self._lock:
            if path is not None or fullname not in self._waiting:
                return None
        spec = self._find_with_the_others(fullname, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RunAfterExec(spec.loader, lambda: self._run(fullname))
        return spec

    def _find_with_the_others(self, fullname: str, target: ModuleType | None) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, None, target)
            if spec is not None:
                return spec  # type: ignore[no-any-return]
        return None

    def _run(self, name: str) -> None:
        with self._lock:
            waiting = self._waiting.pop(name, [])
        for then in waiting:
            try:
                then()
            except Exception:
                log.exception("registering Ray's serializers for %s failed", name)


after_import = AfterImport()


def _apply_when_imported(context: Any) -> None:
    for name, register in ADDONS:
        if name in sys.modules:
            register(context)
        else:
            after_import.add(name, functools.partial(register, context))


def install() -> bool:
    """In a Ray worker whose serialization context is not made yet: the add-ons wait for their libraries.
    Returns whether it did."""
    try:
        import ray
        import ray._private.worker as ray_worker
        import ray.util.serialization_addons as addons

        worker = ray_worker.global_worker
        if worker.mode != ray.WORKER_MODE or worker.serialization_context_map or addons.apply is _apply_when_imported:
            return False
        addons.apply = _apply_when_imported
        sys.meta_path.insert(0, after_import)
        return True
    except Exception:  # another Ray than the one this was written for: its add-ons as it registers them
        log.debug("Ray's serialization add-ons stay as Ray registers them", exc_info=True)
        return False


install()
