"""A kit for backends whose engine only runs calls: subclass `KitJobContext` and override "start this call there"
(`_run_task`) and, where needed, "load this value" (`_load`). in_memory is its first user;
examples/process_pool_backend.py runs tasks on a `concurrent.futures.ProcessPoolExecutor` with it.

This is the kit's face: its users import from here (and from `fray.backend`, `fray.errors`), not from its modules.
- `KitJobContext` (the JobContext to subclass) and `EngineHooks` (what it asks of an engine);
- `TaskRun` (one attempt of a task, as the engine is given it), `Actor` (an actor the kit runs), `Serialized` (a
  value as the kit stores it);
- `LocalClusterContext` (jobs as local subprocesses, for a backend's `cluster_context`);
- `remote`: nested work from the engine's worker processes back to the driver (`RemoteService`, `start_worker`)."""

from fray.kit import remote
from fray.kit.actors import Actor
from fray.kit.calls import TaskRun
from fray.kit.cluster import LocalClusterContext
from fray.kit.context import KitJobContext
from fray.kit.engine import EngineHooks
from fray.kit.objects import Serialized

__all__ = ["Actor", "EngineHooks", "KitJobContext", "LocalClusterContext", "Serialized", "TaskRun", "remote"]
