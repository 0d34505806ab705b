"""Events (fray.telemetry.events) of what runs in a Ray worker: the process's start, the starts and ends of its tasks
and actor calls (keyed by Ray's task id), an actor's restart (fray_ray._remote's wrappers call these);
fray_ray._events moves them to the driver."""

from __future__ import annotations

import os
import threading
from typing import Any

import ray

from fray.backend import CANCELLED, RECORDER, Kind, ended
from fray_ray import _events
from fray_ray._driver_events import worker_key, worker_name

__all__ = ["actor_started", "attach_worker", "call_ended", "call_started", "task_ended", "task_started"]

# This worker's Ray core worker (the running task's id and name, for its events), set by attach_worker
_core_worker: Any = None
_actor_data: dict[str, Any] | None = None  # what this actor's call.start events say: its key and concurrency
_actor_name = ""
_lanes: set[int] = set()  # the threads this actor's calls ran on (each named once, as a lane of the timeline)


def attach_worker(core_worker: Any) -> None:
    """This process is a Ray worker of fray's: its events go to its driver (fray_ray._events), the first being
    worker.start, keyed "node ip/pid" as the driver keys the process's worker.died (fray_ray._driver_events)."""
    global _core_worker
    _core_worker = core_worker
    if RECORDER.enabled:  # (before the flusher starts: its first flush sends it)
        node, pid = ray._private.worker.global_worker.node_ip_address, os.getpid()
        key = worker_key(node, pid)
        RECORDER.record(Kind.WORKER_START, key, worker_name(key), {"pid": pid, "node": node})
    _events.start_worker(ray.get_runtime_context().get_job_id())


# Events (fray.telemetry.events) of the tasks and actor calls run here, keyed by Ray's task id: the submitter records
# its submit event under `ref.task_id().hex()`, the same id (for tasks, actor calls and generators alike). A retried
# task runs its wrapper again under the same id: each attempt is a span, its end `error` (whether Ray will retry
# it is not known here). Each returns None while recording is off (FRAY_EVENTS=0), and costs a few Python calls when on.
def _end_data(error: BaseException | None) -> dict[str, str] | None:
    if error is None:
        return None
    if not isinstance(error, Exception):  # KeyboardInterrupt (ray.cancel), GeneratorExit (a stream closed)
        return {"status": CANCELLED}
    return ended(error)


def task_started() -> tuple[str, str] | None:
    if not RECORDER.enabled:
        return None
    worker = _core_worker
    key, name = worker.get_current_task_id().hex(), worker.get_current_task_name()
    RECORDER.record(Kind.TASK_START, key, name)
    _events.wake()
    return key, name


def task_ended(started: tuple[str, str] | None, error: BaseException | None = None) -> None:
    if started is not None:
        RECORDER.record(Kind.TASK_END, started[0], started[1], None if error is None else _end_data(error))
        _events.wake()


def call_started(where: str) -> str | None:
    """In an actor: a call of `where` ("Class.method") starts on this thread (its lane, named once)."""
    if not RECORDER.enabled:
        return None
    key: str = _core_worker.get_current_task_id().hex()
    thread = threading.get_ident()
    if thread not in _lanes:
        _lanes.add(thread)
        n = len(_lanes)
        RECORDER.name_thread(f"actor {_actor_name}" if n == 1 else f"actor {_actor_name} ({n})")
    RECORDER.record(Kind.CALL_START, key, where, _actor_data)
    _events.wake()
    return key


def call_ended(key: str | None, where: str, error: BaseException | None = None) -> None:
    if key is not None:
        RECORDER.record(Kind.CALL_END, key, where, None if error is None else _end_data(error))
        _events.wake()


def actor_started(class_name: str) -> None:
    """This process is an actor's: its calls' event data, its label, and actor.restart when Ray restarted it (the
    GCS counts its restarts; one query at each start)."""
    global _actor_data, _actor_name
    worker = _core_worker
    actor_id = worker.get_actor_id().hex()
    _actor_name = class_name
    _actor_data = {"actor": actor_id, "concurrency": worker.current_actor_max_concurrency()}
    if not RECORDER.enabled:
        return
    RECORDER.label = f"ray actor {class_name}"
    try:
        from ray._private.state import actors

        restarts = int((actors(actor_id=actor_id) or {}).get("NumRestarts", 0))
    except Exception:  # the GCS did not answer: say nothing rather than fail the actor's start
        restarts = 0
    if restarts:
        reason = f"its process died; Ray restarted it (restart {restarts})"
        RECORDER.record(Kind.ACTOR_RESTART, actor_id, class_name, {"reason": reason, "restarts": restarts})
        _events.wake()
