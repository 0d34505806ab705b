"""A kit backend whose actors live in worker processes of their own (fray.kit.remote's actor requests): the
process-pool example's tasks, and each plain actor (sync, max_concurrency 1) in a one-process pool of its own.
It proves that an actor in another process keeps the refs it is handed, with nothing but the kit's remote."""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fray.backend import async_methods, host_gpus, host_resources
from fray.kit import Actor, Serialized, remote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from process_pool_backend import ProcessPoolBackend, ProcessPoolJobContext

NAME = "process_actors"


class _InProcess:
    """Stands in for an instance living in a process of its own (the kit calls `_fray_close` after its death)."""

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self.pool = pool

    def _fray_close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class ProcessActorsJobContext(ProcessPoolJobContext):
    backend = NAME

    def _elsewhere(self, actor: Actor) -> bool:
        return actor.options.max_concurrency == 1 and not async_methods(actor.klass)

    def _new_instance(self, actor: Actor, call: Any) -> Any:
        if not self._elsewhere(actor):
            return super()._new_instance(actor, call)
        args, kwargs = self._resolve_call(call, f"the arguments of {actor.klass.__name__}()")
        pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("forkserver"),
            initializer=remote.start_worker,
            initargs=(self._service.setup,),
        )
        request = self._service.actor_request(actor, None, args, kwargs)
        try:
            self._service.result(pool.submit(remote.run_call, *request).result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        return _InProcess(pool)

    def _run_method(self, actor: Actor, method: str, call: Any, life: int) -> Any:
        if not isinstance(actor.instance, _InProcess):
            return super()._run_method(actor, method, call, life)
        args, kwargs = self._resolve_call(call, f"the arguments of {actor.klass.__name__}.{method}")
        request = self._service.actor_request(actor, method, args, kwargs)
        reply: Serialized = self._service.result(actor.instance.pool.submit(remote.run_call, *request).result())
        return reply


class ProcessActorsBackend(ProcessPoolBackend):
    name = NAME
    test_spec = f"{NAME}?cpus=4"

    def job_context(self, **opts: Any) -> ProcessActorsJobContext:
        gpus = host_gpus(opts.get("gpus"))
        host = host_resources()
        totals = {"CPU": opts.get("cpus", host["CPU"]), "GPU": float(len(gpus)), "memory": host["memory"]}
        return ProcessActorsJobContext(totals, gpus=gpus)
