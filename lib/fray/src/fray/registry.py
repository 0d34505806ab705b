"""Backend registry and selection: `fray.init(spec)`, `fray.cluster(spec)`, `fray.shutdown()`.

A spec is "name" or "name?key=value&key=value". Without one, FRAY_BACKEND is read; without that, "in_memory".
Backends register under the entry-point group "fray.backends"; the first-party names are known here too, so a
missing one says how to install it.
"""

from __future__ import annotations

import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import parse_qsl

from fray import current
from fray.context import ClusterContext, JobContext
from fray.errors import BackendNotAvailableError
from fray.types import normalize_resources

__all__ = ["Backend", "available_backends", "cluster", "get_backend", "init", "parse_spec", "shutdown"]

ENV_VAR = "FRAY_BACKEND"
DEFAULT_BACKEND = "in_memory"
ENTRY_POINT_GROUP = "fray.backends"

# name -> (object path, how to install it). Entry points override these paths.
FIRST_PARTY: dict[str, tuple[str, str]] = {
    "in_memory": ("fray.in_memory:InMemoryBackend", "it ships with fray-core"),
    "ray": ("fray_ray:RayBackend", "pip install fray-ray  (from a checkout: pip install -e backends/ray)"),
    "monarch": (
        "fray_monarch:MonarchBackend",
        "pip install fray-monarch  (from a checkout: pip install torch==2.13.0 -e backends/monarch)",
    ),
}


class Backend(ABC):
    """What an entry point in the "fray.backends" group resolves to (a class or an instance)."""

    name: str = "?"
    capabilities: frozenset[Any] = frozenset()  # every Capability its contexts have (for listings and docs)

    @abstractmethod
    def job_context(self, **options: str) -> JobContext:
        """A new JobContext; options come from the spec's query string and init's keyword arguments."""

    @abstractmethod
    def cluster_context(self, **options: str) -> ClusterContext:
        """A new ClusterContext."""

    def context_here(self) -> JobContext | None:
        """The JobContext of this process's connection to this backend, if it has one that is not current yet
        (e.g. inside a worker, before the task runs): where a pickled context lands. None: none here."""
        return None

    def diagnose(self) -> dict[str, str]:
        """Lines ("name: value") this backend adds to `fray doctor`'s report; the default adds none."""
        return {}


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


def available_backends() -> dict[str, str]:
    """Every backend name known here -> where it comes from (entry point value or first-party path)."""
    names = {name: path for name, (path, _) in FIRST_PARTY.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names[ep.name] = ep.value
    return names


_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def get_backend(name: str) -> Backend:
    with _lock:
        if name in _backends:
            return _backends[name]
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        try:
            if found:
                obj = found[0].load()
            elif name in FIRST_PARTY:
                module, _, attr = FIRST_PARTY[name][0].partition(":")
                obj = getattr(import_module(module), attr)
            else:
                known = ", ".join(sorted(available_backends()))
                raise BackendNotAvailableError(f"unknown fray backend {name!r}; known backends: {known}")
        except ImportError as exc:
            if isinstance(exc, BackendNotAvailableError):
                raise
            hint = FIRST_PARTY[name][1] if name in FIRST_PARTY else f"install the package that provides {name!r}"
            raise BackendNotAvailableError(
                f"the fray backend {name!r} is not installed ({exc}); install it with: {hint}"
            ) from exc
        backend = obj() if isinstance(obj, type) else obj
        if not isinstance(backend, Backend):
            raise BackendNotAvailableError(f"entry point {name!r} did not give a fray.registry.Backend: {obj!r}")
        _backends[name] = backend
        return backend


def _resolve(spec: str | None, options: Mapping[str, Any]) -> tuple[Backend, dict[str, str]]:
    if spec is None:
        spec = os.environ.get(ENV_VAR) or DEFAULT_BACKEND
    name, spec_options = parse_spec(spec)
    # Keyword options are the spec's query values, as strings; objects that have no string form (a Monarch job
    # object: fray.init("monarch", job=job)) pass through as they are, for the backend to check.
    merged = {**spec_options, **{k: _option_value(v) for k, v in options.items()}}
    return get_backend(name), merged


def _option_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float, list, tuple, dict)):
        return str(value)
    return value


def init(spec: str | None = None, **options: Any) -> JobContext:
    """Create a JobContext for `spec` (or FRAY_BACKEND, or in_memory) and make it current."""
    backend, merged = _resolve(spec, options)
    ctx = backend.job_context(**merged)
    current.set_default(ctx)
    current.make_current(ctx)
    return ctx


def cluster(spec: str | None = None, **options: Any) -> ClusterContext:
    """Create a ClusterContext for `spec` (or FRAY_BACKEND, or in_memory)."""
    backend, merged = _resolve(spec, options)
    return backend.cluster_context(**merged)


def shutdown() -> None:
    """Shut down the current default JobContext (if any) and forget it."""
    ctx = current.current() or current.default()
    current.make_current(None)
    current.set_default(None)
    if ctx is not None:
        ctx.shutdown()


def parse_options(
    backend: str, options: Mapping[str, str], schema: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """Convert string options by `schema` (name -> converter); unknown names and bad values are ValueErrors."""
    out: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise ValueError(f"unknown option {key!r} for the {backend!r} backend; known options: {known}")
        try:
            out[key] = schema[key](raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"option {key}={raw!r} for the {backend!r} backend is not valid: {exc}") from exc
    return out


def non_negative(raw: str) -> float:
    """A spec option that is a number >= 0 (cpus, gpus, memory)."""
    value = float(raw)
    if not value >= 0:  # also refuses nan
        raise ValueError(f"must be a number >= 0, got {raw!r}")
    return value


def positive_int(raw: str) -> int:
    """A spec option that is a whole number >= 1 (process counts)."""
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be a whole number >= 1, got {raw!r}")
    return value


def parse_resources(raw: str) -> dict[str, float]:
    """A spec's custom resources: JSON (`{"disk": 4, "tag": 1}`) or `disk:4,tag` (a bare name means 1)."""
    raw = raw.strip()
    if raw.startswith("{"):
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object like {"disk": 4}')
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        pairs = []
        for part in filter(None, (p.strip() for p in raw.split(","))):
            name, _, qty = part.partition(":")
            pairs.append((name.strip(), qty.strip() or 1.0))
    return normalize_resources({name: float(qty) for name, qty in pairs}, "resources")


def to_bool(raw: str) -> bool:
    lowered = str(raw).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")
