"""What a kit backend's engine overrides (fray.kit.context.KitJobContext inherits it): where a task's call runs,
how a stored value is loaded, where an actor lives. Each default runs the work here, on the calling thread."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fray.runtime.gpus import HostGpus, using_gpus
from fray.runtime.serialization import Blob, loads
from fray.telemetry.transfers import TransferStats

if TYPE_CHECKING:
    from fray.kit.actors import Actor
    from fray.kit.calls import TaskRun

__all__ = ["EngineHooks"]


class EngineHooks:
    gpus: HostGpus
    _transfers: TransferStats

    def _resolve_call(self, call: Any, what: str = "the call's arguments") -> tuple[tuple[Any, ...], dict[str, Any]]:
        raise NotImplementedError  # (KitJobContext's)

    def _run_task(self, run: TaskRun, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Start this call there: run run.fn(*args, **kwargs) where the engine runs work, wait for it, and return
        its result (the value, or `Serialized` for one that arrived serialized) or raise its exception. run.gpus
        are the device indices it holds (fray.runtime.gpus), run.request what the core computed of its call. Runs
        on a ledger worker thread, with this context current. Default: on this thread, its GPUs as the current
        device."""
        if run.gpus:
            with using_gpus(run.gpus, self.gpus):
                return run.fn(*args, **kwargs)
        return run.fn(*args, **kwargs)

    def _load(self, stored: Blob, what: str) -> Any:
        """Load this value: a stored Blob as a value here (default: unpickled in this process, counted as an
        in-process transfer)."""
        start = time.perf_counter()
        value = loads(stored, what)
        self._transfers.record("in-process", stored.nbytes, time.perf_counter() - start)
        return value

    def _new_instance(self, actor: Actor, call: Any) -> Any:
        """Make an actor's instance from its stored call (default: here, its GPUs as the current device)."""
        args, kwargs = self._resolve_call(call, f"the arguments of {actor.klass.__name__}()")
        with using_gpus(actor.gpus, self.gpus):
            return actor.klass(*args, **kwargs)

    def _run_method(self, actor: Actor, method: str, call: Any, life: int) -> Any:
        """Run one method of an actor's instance with a stored call (`life`: the SPMD group life it belongs to,
        for a backend whose members restart together). Default: here, on the actor's thread."""
        args, kwargs = self._resolve_call(call, f"the arguments of {actor.klass.__name__}.{method}")
        with using_gpus(actor.gpus, self.gpus):
            return getattr(actor.instance, method)(*args, **kwargs)
