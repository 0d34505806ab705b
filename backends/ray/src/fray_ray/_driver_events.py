"""Events (fray.telemetry.events) that the submitting side records on Ray: the submit events of tasks and actor calls
(in the driver, or in a worker submitting nested work), and the deaths of actors and worker processes that the driver
learns of from Ray (`DeathWatch`).

Ray tells a driver of a death only when it waits on what died, so a driver context's `DeathWatch` records:
- actor.died (reason: the GCS's death cause, as Ray words it) for an actor the context created that Ray reports
  DEAD, once per actor: when a get of a call to it fails with Ray's ActorDiedError (one GCS query, for that
  actor), and at the pulls of the events (`poll`: one query, for this Ray job's DEAD actors, only while actors
  made here are thought alive, and at most 5% of the time: its cost grows with the job's dead actors). A restart
  is no death (Ray reports RESTARTING; the actor's new process records actor.restart, fray_ray._worker_events);
  `ctx.kill` records its own death (`killed` comes before the kill).
- worker.died (reason, pid, node) for a worker process Ray reports dead: an actor's, with its actor's death (the
  death cause names its pid and node), and a task's, when a get fails with Ray's WorkerCrashedError (which names
  no process: the GCS's worker table does, looked at then and at the pulls of the CRASH_LOOK seconds that follow;
  every crashed worker of the job it shows is recorded, once, whichever crash it explains, so finding another
  process's death never ends the look early). The key is "node ip/pid", as the process's own worker.start. Ray
  reports no exit code (its "connection error code" is not one): the data has none.
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

import ray
import ray.exceptions as rex

from fray.backend import RECORDER, Kind, ended
from fray_ray import _events

__all__ = ["DeathWatch", "generator_ref", "submitted", "task_name", "worker_key", "worker_name"]

POLL_SHARE_INVERSE = 20  # poll's query waits 20 times its own last duration before the next (<= 5% of the time)
CRASH_LOOK = 30.0  # seconds the worker table is looked at again after a WorkerCrashedError, at most
_ADVICE = (" Some common causes include", " There are some potential root causes")  # where Ray's own words end
_MAX_REASON = 400
_CLOSED_MEMORY = 10_000  # ends recorded by the driver that it remembers (not to record one twice)
_FIRST_FAILED_SCAN = 100  # refs of a failed get looked at for the one that failed
_CLOCK_MARGIN_MS = 5000  # a worker that ended this long before the watch began may still be its own (clocks)


# --------------------------------------------------------------------------------------- submits
def task_name(fn: Any) -> str:
    """A task's name in its events, as Ray names it where it runs (its function's __qualname__)."""
    return str(getattr(fn, "__qualname__", "task"))


def generator_ref(generator: Any) -> Any:
    """The Ray ref of a generator task or call (its task id is its events' key)."""
    return getattr(generator, "_generator_ref", None)


def submitted(kind: str, ray_ref: Any, name: str) -> None:
    """The submit event of the task or call behind `ray_ref`, keyed by its Ray task id (read only while
    recording); a worker submitting nested work wakes its flusher (in the driver that is a no-op)."""
    if RECORDER.enabled:
        RECORDER.record(kind, ray_ref.task_id().hex() if ray_ref is not None else "", name)
        _events.wake()


# --------------------------------------------------------------------------------------- deaths
def worker_key(node: str, pid: int) -> str:
    """The key of a Ray worker process's worker.start and worker.died events."""
    return f"{node}/{pid}"


def worker_name(key: str) -> str:
    return f"ray worker {key}"


def _words(text: str) -> str:
    """Ray's message without the advice it goes on with, on one line, not too long."""
    for advice in _ADVICE:
        text = text.split(advice, 1)[0]
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def death_reason(cause: Any) -> str:
    """What Ray's ActorDeathCause (the GCS's actor table) says ended an actor."""
    which = cause.WhichOneof("context") if cause is not None else None
    if which is None:
        return "Ray reports it dead"
    context = getattr(cause, which)
    if which == "creation_task_failure_context":
        lines = [line for line in context.formatted_exception_string.splitlines() if line.strip()]
        return "its __init__ failed: " + _words(lines[-1] if lines else "")
    return _words(context.error_message) or "Ray reports it dead"


def _proto(name: str) -> Any:
    """Ray's generated protobuf module `name` (untyped)."""
    return importlib.import_module(f"ray.core.generated.{name}")


def _process_death(cause: Any) -> tuple[str, int, str] | None:
    """(node ip, pid, why) of the actor's process, when its death cause is that process's (or its node's) death."""
    if cause is None or cause.WhichOneof("context") != "actor_died_error_context":
        return None
    died = cause.actor_died_error_context
    reasons = _proto("common_pb2").ActorDiedErrorContext
    if died.reason not in (reasons.WORKER_DIED, reasons.NODE_DIED) or not died.pid:
        return None
    text = died.error_message
    at = text.find("Worker exit type:")
    return died.node_ip_address, int(died.pid), _words(text[at:] if at >= 0 else text)


def _first_failed(payloads: list[Any]) -> Any:
    """The first ref of a get, in order, that is done and failed (ray.get of the done ones, one by one: only on a
    get that failed)."""
    done, _ = ray.wait(payloads[:_FIRST_FAILED_SCAN], num_returns=min(len(payloads), _FIRST_FAILED_SCAN), timeout=0)
    finished = set(done)
    for ref in payloads[:_FIRST_FAILED_SCAN]:
        if ref in finished:
            try:
                ray.get(ref, timeout=0)
            except Exception:
                return ref
    return None


class DeathWatch:
    """The deaths a driver context records (see the module's docstring); `on`: this is a driver's context (a
    worker's records none). Only actors made while recording is on are watched."""

    def __init__(self, job_id: str, on: bool) -> None:
        self._job = job_id  # the Ray job's id (hex)
        self._on = on
        self._lock = threading.Lock()
        self._alive: dict[str, str] = {}  # actor id (hex) -> class name: made here, no death recorded yet
        self._ended: set[str] = set()  # the actors whose death was recorded
        self._closed: dict[str, None] = {}  # calls and tasks whose end the driver recorded (oldest first)
        self._workers: set[str] = set()  # keys of the worker processes whose death was recorded
        self._since_ms = int(time.time() * 1000) - _CLOCK_MARGIN_MS
        self._look_until = 0.0
        self._next_poll = 0.0  # (time.monotonic()) when poll may ask for the DEAD actors again
        self._next_look = 0.0  # ... and read the worker table again

    def created(self, actor_id: str, class_name: str) -> None:
        if self._on and RECORDER.enabled:
            with self._lock:
                self._alive[actor_id] = class_name

    def killed(self, actor_id: str) -> bool:
        """fray kills the actor (called before the kill): whether to record its death there, False if it was
        recorded already (a dead member of a restarted SPMD group, killed with its group; a second kill)."""
        if not self._on:
            return True
        with self._lock:
            self._alive.pop(actor_id, None)
            if actor_id in self._ended:
                return False
            self._ended.add(actor_id)
            return True

    def stopped(self, actor_ids: list[str], reason: str) -> None:
        """fray stops these actors (the survivors of an SPMD group that lost a member): their deaths, with `reason`
        rather than Ray's (which would say ray.kill)."""
        for actor_id in actor_ids:
            with self._lock:
                name = self._alive.pop(actor_id, None)
                if name is None:
                    continue
                self._ended.add(actor_id)
            RECORDER.record(Kind.ACTOR_DIED, actor_id, name, {"reason": reason})

    def _ended_with_its_process(self, kind: str, exc: BaseException, payloads: list[Any]) -> None:
        """The call or task (`kind`: its end event's) that a get failed on died with its process: its own end
        event died with it, so the driver records it, once, for the first ref of the get that failed so (the page
        would show that work queued for ever)."""
        if not RECORDER.enabled:
            return
        ref = payloads[0] if len(payloads) == 1 else _first_failed(payloads)
        if ref is None:
            return
        key = ref.task_id().hex()
        with self._lock:
            if key in self._closed:
                return
            self._closed[key] = None
            if len(self._closed) > _CLOSED_MEMORY:
                self._closed.pop(next(iter(self._closed)))
        RECORDER.record(kind, key, "", ended(exc))  # (Ray names these errors as fray does)

    def failed(self, exc: BaseException, payloads: list[Any]) -> None:
        """A get of `payloads` failed with Ray's exception `exc`: the death of an actor made here, or of a task's
        worker process, and the end of the call or task that died with it."""
        if not self._on:
            return
        if isinstance(exc, rex.RayActorError):
            self._ended_with_its_process(Kind.CALL_END, exc, payloads)
        elif isinstance(exc, rex.WorkerCrashedError):
            self._ended_with_its_process(Kind.TASK_END, exc, payloads)
        if isinstance(exc, rex.RayActorError) and not isinstance(exc, rex.ActorUnavailableError):
            actor_id = getattr(exc, "actor_id", None)
            if actor_id and actor_id in self._alive:
                try:
                    from ray._private import state

                    info = state.actors(actor_id=actor_id)
                except Exception:  # the GCS did not answer: the next pull looks again
                    return
                if info.get("State") == "DEAD":  # (not RESTARTING: a restart left)
                    self._dead(actor_id, info)
        elif isinstance(exc, rex.WorkerCrashedError):
            with self._lock:
                self._look_until = time.monotonic() + CRASH_LOOK
            self._look_at_workers()

    def poll(self) -> None:
        """At a pull of the events: the deaths Ray reports that no failed get showed (one query for the actors,
        only while actors made here are thought alive; the worker table for CRASH_LOOK seconds after a task's
        crash). The actors' query costs more with every dead actor of the job: it is made again only once
        POLL_SHARE_INVERSE times its last duration has passed (<= 5% of the time in queries, however many)."""
        if not self._on:
            return
        if self._alive and time.monotonic() >= self._next_poll:
            began = time.monotonic()
            try:
                from ray import JobID
                from ray._private import state

                dead = state.state.actor_table(None, job_id=JobID.from_hex(self._job), actor_state_name="DEAD")
            except Exception:  # the GCS did not answer (or Ray is going away): the next pull looks again
                dead = {}
            self._next_poll = time.monotonic() + POLL_SHARE_INVERSE * (time.monotonic() - began)
            with self._lock:
                found = [actor_id for actor_id in dead if actor_id in self._alive]
            for actor_id in found:
                self._dead(actor_id, dead[actor_id])
        if self._next_look <= time.monotonic() < self._look_until:
            began = time.monotonic()
            self._look_at_workers()
            self._next_look = time.monotonic() + POLL_SHARE_INVERSE * (time.monotonic() - began)

    def _dead(self, actor_id: str, info: dict[str, Any]) -> None:
        with self._lock:
            name = self._alive.pop(actor_id, None)
            if name is None:  # recorded already (or killed by fray)
                return
            self._ended.add(actor_id)
        cause = info.get("DeathCause")
        data: dict[str, Any] = {"reason": death_reason(cause)}
        restarts = int(info.get("NumRestarts") or 0)
        if restarts:
            data["reason"] += f" (after {restarts} restart{'s' if restarts > 1 else ''})"
            data["restarts"] = restarts
        RECORDER.record(Kind.ACTOR_DIED, actor_id, name, data)
        process = _process_death(cause)
        if process is not None:
            self._worker_died(*process)

    def _worker_died(self, node: str, pid: int, why: str) -> None:
        key = worker_key(node, pid)
        with self._lock:
            if key in self._workers:
                return
            self._workers.add(key)
        RECORDER.record(Kind.WORKER_DIED, key, worker_name(key), {"reason": why, "pid": pid, "node": node})

    def _look_at_workers(self) -> None:
        """The worker processes of this job that the GCS's worker table says ended by a crash (not an intended
        exit) since the watch began: a worker.died each, once."""
        try:
            from ray._private import state

            table = state.state._connect_and_get_accessor().get_worker_table()
            common_pb2, gcs_pb2 = _proto("common_pb2"), _proto("gcs_pb2")
        except Exception:  # the GCS did not answer: the next pull looks again
            return
        crashes = (common_pb2.SYSTEM_ERROR, common_pb2.USER_ERROR, common_pb2.NODE_OUT_OF_MEMORY)
        for raw in table:
            worker = gcs_pb2.WorkerTableData.FromString(raw)
            if worker.is_alive or worker.worker_type != common_pb2.WORKER or worker.exit_type not in crashes:
                continue
            if worker.job_id.hex() != self._job or worker.end_time_ms < self._since_ms:
                continue
            exit_type = common_pb2.WorkerExitType.Name(worker.exit_type)
            why = _words(f"Worker exit type: {exit_type} Worker exit detail: {worker.exit_detail}")
            self._worker_died(worker.worker_address.ip_address, int(worker.pid), why)
