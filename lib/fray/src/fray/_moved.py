"""Import paths that moved when fray-core was arranged in rooms (fray.host, fray.telemetry, fray.runtime,
fray.jobs). For one release an old path still imports: it gives the very module of the new path (one module
object, so its classes and state are the same ones), with a DeprecationWarning naming the new path; the modules
of a moved package move with it. `python -m` with an old path runs the new module.

`fray.jobs` itself was the local job runner and is now the jobs room: its old names are forwarded by
`fray.jobs.__getattr__`, with the same warning."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["MOVED", "install", "moved_names", "warn_moved"]

MOVED: dict[str, str] = {
    "fray._validation": "fray.runtime.arguments",
    "fray.capabilities": "fray.runtime.capabilities",
    "fray.capability_table": "fray.testing.capability_table",
    "fray.completion": "fray.runtime.completion",
    "fray.cuda_values": "fray.runtime.cuda_values",
    "fray.current": "fray.runtime.current",
    "fray.detached": "fray.jobs.detached",
    "fray.device_shares": "fray.runtime.device_shares",
    "fray.doctor": "fray.cli.doctor",
    "fray.event_store": "fray.telemetry.event_store",
    "fray.events": "fray.telemetry.events",
    "fray.gang": "fray.runtime.gang",
    "fray.gpus": "fray.runtime.gpus",
    "fray.groups": "fray.runtime.groups",
    "fray.hooks": "fray.runtime.hooks",
    "fray.interrupts": "fray.host.interrupts",
    "fray.job_call": "fray.jobs.call",
    "fray.job_dirs": "fray.jobs.dirs",
    "fray.job_events": "fray.jobs.events",
    "fray.job_group_ranks": "fray.jobs.group_ranks",
    "fray.job_handle": "fray.jobs.handle",
    "fray.job_outcomes": "fray.jobs.outcomes",
    "fray.job_policy": "fray.jobs.policy",
    "fray.job_rank_procs": "fray.jobs.rank_procs",
    "fray.job_records": "fray.jobs.records",
    "fray.job_requests": "fray.jobs.requests",
    "fray.job_retry": "fray.jobs.retry",
    "fray.job_signals": "fray.jobs.signals",
    "fray.job_supervisor": "fray.jobs.supervisor",
    "fray.net": "fray.host.net",
    "fray.options": "fray.runtime.options",
    "fray.outcome": "fray.runtime.outcome",
    "fray.output": "fray.runtime.worker_output",
    "fray.plain_text": "fray.jobs.plain_text",
    "fray.pool": "fray.runtime.pool",
    "fray.procfs": "fray.host.procfs",
    "fray.progress": "fray.telemetry.progress",
    "fray.receive": "fray.runtime.receive",
    "fray.refs": "fray.runtime.refs",
    "fray.remote_errors": "fray.runtime.remote_errors",
    "fray.rendezvous": "fray.runtime.rendezvous",
    "fray.resources": "fray.runtime.resources",
    "fray.run_job_call": "fray.jobs.run_call",
    "fray.serialization": "fray.runtime.serialization",
    "fray.state": "fray.host.state_dir",
    "fray.states": "fray.runtime.lifecycle",
    "fray.streams": "fray.runtime.streams",
    "fray.timeline": "fray.telemetry.timeline",
    "fray.transfers": "fray.telemetry.transfers",
    "fray.watchdog": "fray.host.watchdog",
    "fray.worker_env": "fray.runtime.worker_env",
}


def warn_moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}: import it from there (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )


def moved_names(module: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module's `__getattr__` for names that moved out of it: `homes` maps each to the module that holds it now,
    imported when the name is first asked for (so the old module does not load it), with a DeprecationWarning."""

    def forward(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_moved(f"{module}.{name}", f"{home}.{name}")
        return getattr(importlib.import_module(home), name)

    return forward


def _new_name(fullname: str) -> str | None:
    """The new name of an old module path, or of a module inside a moved package."""
    parts = fullname.split(".")
    for cut in range(len(parts), 1, -1):
        new = MOVED.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([new, *parts[cut:]])
    return None


# The loader and finder follow the import system's protocols without importlib.abc's classes: importing that
# module loads importlib.resources, a cost every process that imports fray would pay.
class _MovedLoader:
    def __init__(self, old: str, new: str) -> None:
        self._old = old
        self._new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warn_moved(self._old, self._new)
        module = importlib.import_module(self._new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the old path's spec on it: the module keeps its own

    def get_code(self, fullname: str) -> CodeType | None:
        """`python -m <old path>` (runpy): the new module's code."""
        spec = importlib.util.find_spec(self._new)
        loader = spec.loader if spec is not None else None
        get_code = getattr(loader, "get_code", None)
        return get_code(self._new) if get_code is not None else None


class _MovedFinder:
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("fray."):
            return None
        new = _new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _MovedLoader(fullname, new)))


def install() -> None:
    """Put the old paths' finder first, once per process: a module inside a moved package would otherwise be found
    again by the path finder through its package's `__path__`, as a second copy under its old name."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
