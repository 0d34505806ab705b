"""Backend registry and selection: `fray.init(spec)`, `fray.cluster(spec)`, `fray.shutdown()`.

A spec is "name" or "name?key=value&key=value". Without one, FRAY_BACKEND is read; without that, "in_memory".
Backends register under the entry-point group "fray.backends"; the first-party names are known here too, so a
missing one says how to install it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from fray.backend import Backend
from fray.errors import BackendNotAvailableError
from fray.host import interrupts, settings
from fray.runtime import current
from fray.runtime.options import did_you_mean, parse_options

if TYPE_CHECKING:
    from importlib.metadata import EntryPoints

    from fray.cluster_context import ClusterContext
    from fray.context import JobContext

__all__ = [
    "available_backends",
    "backend_options",
    "cluster",
    "cluster_context_from",
    "get_backend",
    "init",
    "job_context_from",
    "parse_spec",
    "register_backend",
    "shutdown",
]

ENV_VAR = settings.BACKEND.name
DEFAULT_BACKEND = settings.BACKEND.default
ENTRY_POINT_GROUP = "fray.backends"
# Backends registered in a process, as {name: [module:attr, its import root]}: inherited by the processes fray
# starts (jobs, workers), which import them by name there (register_backend).
REGISTERED_ENV = settings.REGISTERED_BACKENDS.name

# name -> (object path, how to install it). Entry points override these paths.
FIRST_PARTY: dict[str, tuple[str, str]] = {
    "in_memory": ("fray.in_memory:InMemoryBackend", "it ships with fray-core"),
    "ray": ("fray_ray:RayBackend", "pip install fray-ray  (from a checkout: pip install -e backends/ray)"),
    "monarch": (
        "fray_monarch:MonarchBackend",
        "pip install fray-monarch  (from a checkout: pip install torch==2.13.0 -e backends/monarch)",
    ),
}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """ "ray?address=h:6379&namespace=x" -> ("ray", {"address": "h:6379", "namespace": "x"})."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a backend spec must be a non-empty string like 'ray?namespace=x', got {spec!r}")
    name, _, query = spec.strip().partition("?")
    options: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(
            f"backend spec {spec!r} is not valid ({exc}): options look like 'name?key=value&key2=value2'"
        ) from None
    for key, value in pairs:
        if key in options:
            raise ValueError(f"backend spec {spec!r} sets {key!r} twice")
        options[key] = value
    return name.strip(), options


def available_backends(registered: bool = True) -> dict[str, str]:
    """Every backend name known here -> where it comes from (entry point value, first-party path, or, unless
    registered=False, a registration in this process)."""
    names = {name: path for name, (path, _) in FIRST_PARTY.items()}
    for ep in _declared_backends():
        names[ep.name] = ep.value
    if not registered:
        return names
    with _lock:
        for name, backend in _registered.items():
            names[name] = f"registered in this process: {type(backend).__module__}.{type(backend).__qualname__}"
    return names


_backends: dict[str, Backend] = {}
_registered: dict[str, Backend] = {}
_lock = threading.RLock()  # (get_backend lists the known names under it)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def register_backend(name: str, backend: type[Backend] | Backend, replace: bool = False) -> None:
    """Make `backend` (a `fray.backend.Backend` subclass or instance) the backend called `name` in this process,
    as an installed distribution's "fray.backends" entry point would: for tests and notebooks (fsspec's
    `register_implementation`). `fray.init(name)` then uses it here, and in the processes this one starts (a job's
    bare `fray.init()`), where its class is imported by name (REGISTERED_ENV) unless it was defined in __main__.
    A name that is taken (installed, first-party or registered) is refused unless `replace=True`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a backend name is letters, digits, '_', '.' and '-' (a spec's 'name?k=v'), got {name!r}")
    instance = backend() if isinstance(backend, type) and issubclass(backend, Backend) else backend
    if not isinstance(instance, Backend):
        raise TypeError(f"register_backend needs a fray.backend.Backend subclass or instance, got {backend!r}")
    with _lock:
        if not replace and name in available_backends():
            raise ValueError(f"a fray backend named {name!r} exists already; pass replace=True to replace it here")
        _registered[name] = instance
        _backends[name] = instance
        _export(name, type(instance))


def _export(name: str, klass: type) -> None:
    """Name the registered class in this process's environment, for the processes it starts."""
    module = sys.modules.get(klass.__module__)
    path = getattr(module, "__file__", None)
    if klass.__module__ == "__main__" or path is None:  # nothing another process could import
        return
    depth = klass.__module__.count(".") + (Path(path).name == "__init__.py")
    exported = settings.REGISTERED_BACKENDS.read() or {}
    exported[name] = [f"{klass.__module__}:{klass.__qualname__}", str(Path(path).resolve().parents[depth])]
    os.environ[REGISTERED_ENV] = json.dumps(exported)


def _import_exported(name: str) -> Any:
    """The class a parent process registered as `name` (REGISTERED_ENV), or None."""
    try:
        where = (settings.REGISTERED_BACKENDS.read() or {}).get(name)
    except ValueError:  # (a SettingError: not fray's to import from)
        return None
    if not where:
        return None
    target, root = where
    if root not in sys.path:
        sys.path.append(root)
    module, _, attr = target.partition(":")
    obj: Any = import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _declared_backends() -> EntryPoints:
    """The installed distributions' "fray.backends" entry points. importlib.metadata is imported here, when
    backends are looked for, not with fray."""
    from importlib.metadata import entry_points

    return entry_points(group=ENTRY_POINT_GROUP)


def get_backend(name: str) -> Backend:
    with _lock:
        if name in _backends:
            return _backends[name]
        found = [ep for ep in _declared_backends() if ep.name == name]
        try:
            if found:
                obj = found[0].load()
            elif name in FIRST_PARTY:
                module, _, attr = FIRST_PARTY[name][0].partition(":")
                obj = getattr(import_module(module), attr)
            elif (exported := _import_exported(name)) is not None:
                obj = exported
            else:
                names = available_backends()
                known = ", ".join(sorted(names))
                hint = did_you_mean(name, names)
                raise BackendNotAvailableError(f"unknown fray backend {name!r}{hint}; known backends: {known}")
        except ImportError as exc:
            if isinstance(exc, BackendNotAvailableError):
                raise
            hint = FIRST_PARTY[name][1] if name in FIRST_PARTY else f"install the package that provides {name!r}"
            raise BackendNotAvailableError(
                f"the fray backend {name!r} is not installed ({exc}); install it with: {hint}"
            ) from exc
        backend = obj() if isinstance(obj, type) else obj
        if not isinstance(backend, Backend):
            raise BackendNotAvailableError(f"entry point {name!r} did not give a fray.backend.Backend: {obj!r}")
        _backends[name] = backend
        return backend


def _resolve(spec: str | None, options: Mapping[str, Any]) -> tuple[Backend, dict[str, str]]:
    if spec is None:
        spec = settings.BACKEND.read()
    name, spec_options = parse_spec(spec)
    # Keyword options are the spec's query values, as strings; objects that have no string form (a Monarch job
    # object: fray.init("monarch", job=job)) pass through as they are, for the backend to check.
    merged = {**spec_options, **{k: _option_value(v) for k, v in options.items()}}
    return get_backend(name), merged


def _option_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float, list, tuple, dict)):
        return str(value)
    return value


def backend_options(backend: Backend, options: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's options (strings, or objects a backend documents) converted by the backend's declared `options`
    schema, which is what its `job_context`, `cluster_context`, `prepare_command` and `start_cluster` receive: an
    unknown name or a bad value is a ValueError naming the option."""
    return parse_options(backend.name, options, backend.options)


def job_context_from(backend: Backend, options: Mapping[str, Any]) -> JobContext:
    """`backend`'s JobContext for a spec's options (strings, as `parse_spec` gives them), converted first."""
    return backend.job_context(**backend_options(backend, options))


def cluster_context_from(backend: Backend, options: Mapping[str, Any]) -> ClusterContext:
    """`backend`'s ClusterContext for a spec's options, converted first; the core's own `job_dirs` option (any
    backend's) is taken out before and kept on the context for its jobs."""
    from fray.jobs.dirs import cluster_with_job_dirs  # (the jobs room loads with the first ClusterContext)

    return cluster_with_job_dirs(
        lambda **rest: backend.cluster_context(**backend_options(backend, rest)), dict(options)
    )


def init(spec: str | None = None, **options: Any) -> JobContext:
    """Create a JobContext for `spec` (or FRAY_BACKEND, or in_memory) and make it current."""
    backend, merged = _resolve(spec, options)
    interrupts.install_hook()  # first: starting an engine can take seconds, and a Ctrl-C then is one line too
    try:
        ctx = job_context_from(backend, merged)
    except KeyboardInterrupt as exc:
        raise interrupts.interrupted(exc, f"fray.init to start {backend.name}") from None
    except Exception:
        if current.default() is None:  # no context came of it: nothing of fray's stays installed
            interrupts.uninstall_hook()
        raise
    current.set_default(ctx)
    current.make_current(ctx)
    if settings.DASHBOARD.read() is not None:  # (fray.dashboard: the live page, started and announced)
        from fray.dashboard import announce_from_env

        announce_from_env(ctx)
    return ctx


def cluster(spec: str | None = None, **options: Any) -> ClusterContext:
    """Create a ClusterContext for `spec` (or FRAY_BACKEND, or in_memory)."""
    backend, merged = _resolve(spec, options)
    return cluster_context_from(backend, merged)


def shutdown() -> None:
    """Shut down the current default JobContext (if any) and forget it."""
    ctx = current.current() or current.default()
    if ctx is not None and (not ctx.owns_resources or current.lent(ctx)):
        return  # called inside a task or actor: the context belongs to its driver
    current.make_current(None)
    current.set_default(None)
    interrupts.uninstall_hook()
    if ctx is not None:
        ctx.shutdown()


current.install(init, lambda name: get_backend(name).context_here())
