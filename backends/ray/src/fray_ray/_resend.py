"""Calls made while an actor or an SPMD group restarts wait for the restart and then run, bounded by the
get that reads them; only the calls in flight at the death fail.

Plain actors (Ray's own restarts, `max_task_retries` 0 so that a call in flight is never silently run twice): Ray
fails a call made just after the actor's process died, before the driver has learnt of the death, with
ActorUnavailableError once it learns of the death, although the call never ran (raw Ray does the same; a call
made once Ray knows of the restart is held until the restart and runs). Ray's message
does not tell such a call from one in flight at the death ("Socket closed", "Connection reset by peer" or "The
actor is restarting" for either). So fray looks when the call is made: a call to a restartable plain actor whose
process on this machine has begun to exit (PF_EXITING) or is gone, or which Ray's GCS says is restarting, is
marked (`made_after_death`), and a get that sees its ActorUnavailableError sends it again: Ray then holds it until
the actor is back. An actor on another node is not looked at (its calls get Ray's behaviour).

SPMD groups (fray's own restarts, `_gangs`): a call made while the group restarts gets a ref to a `Refusal` that
says it waits (`Refusal.waits`); a get that reads one waits for the group's next life and sends the call to the
new member then; so does one made after a local member's process began to exit (PF_EXITING), which Ray and the
watcher see only once it has ended. A call made after a member's death but before fray learnt of it (the watcher
looks every 0.2 s) went to the old members and fails with the group's restart; it is sent again the same way
when it was made after the death's time in Ray's GCS (`GangWatch.sent_after_death`; on several hosts that
compares the GCS's clock with the driver's).

Either way the call's fray ObjectRef keeps its first Ray ref (its hash and every copy of it stay valid); the ref
sent later is `current(ref)`, which get reads. A copy of the ref passed to a task, `wait` and `future()` still
see the first outcome.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import ray
import ray.exceptions as rex

from fray.backend import ObjectRef, exiting
from fray_ray._refusals import Refusal

__all__ = ["MAX_SENDS", "Resender"]
MAX_SENDS = 16  # sends of one call at most (each waits for a restart: an actor that keeps dying stops it)

# A call that may be sent again: (the Ray handle called, method, Ray args, Ray kwargs, when it was made: time.time(),
# whether its plain actor's process had died or begun to exit then)
_Call = tuple[Any, str, tuple[Any, ...], dict[str, Any], float, bool]


class Resender:
    """The calls of one context that may be sent again: to restartable plain actors (`actors`, Ray actor ids) and
    to SPMD groups while they restart (`route`: the Ray handle to call now, None while the group restarts;
    `await_back(handle, deadline)`: waits for the group's next life)."""

    def __init__(
        self,
        route: Callable[[Any], Any],
        await_back: Callable[[Any, float | None, int], None],
        sent_after_death: Callable[[Any, float], bool],
    ) -> None:
        self.actors: set[bytes] = set()
        self._route = route
        self._await_back = await_back
        self._sent_after_death = sent_after_death
        self._calls: weakref.WeakKeyDictionary[ObjectRef, _Call] = weakref.WeakKeyDictionary()
        self._sent: weakref.WeakKeyDictionary[ObjectRef, tuple[Any, int]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._pids: dict[bytes, int] = {}  # restartable actor's Ray id -> its process's pid here (0: elsewhere)

    def note(
        self,
        ref: ObjectRef,
        actor: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        after_death: bool = False,
    ) -> None:
        """`ref` is of the call `actor.method(*args, **kwargs)` (Ray handle and Ray arguments), which may be sent
        again (`after_death`: made_after_death said so before it was made). (Its arguments stay referenced as long
        as the ref lives.)"""
        with self._lock:
            self._calls[ref] = (actor, method, args, kwargs, time.time(), after_death)

    def made_after_death(self, actor: Any) -> bool:
        """Restartable plain actor `actor` (a Ray handle) has lost its process: on this machine it has begun to
        exit or is gone, or Ray's GCS says it restarts. A call made now was in flight at no death."""
        key = actor._actor_id.binary()
        pid = self._pids.get(key)
        if pid == 0 or (pid is not None and not exiting(pid)):
            return False  # (elsewhere, or its process runs: the usual case costs a read of /proc)
        state, pid = _actor_process(actor._actor_id.hex())
        if state == "ALIVE":
            self._pids[key] = pid
            return pid != 0 and exiting(pid)
        return state in ("RESTARTING", "DEAD")

    @property
    def active(self) -> bool:
        return bool(self._calls)

    def current(self, refs: Sequence[ObjectRef]) -> list[Any]:
        """The Ray refs a get of `refs` reads: the last one sent for each."""
        if not self._sent:
            return [r.payload for r in refs]
        with self._lock:
            return [self._sent[r][0] if r in self._sent else r.payload for r in refs]

    def resend_failed(self, refs: Sequence[ObjectRef], exc: BaseException) -> bool:
        """A get of `refs` raised `exc`: send again each call of `refs` that Ray failed without delivering it to
        its (restarting) plain actor. True if any was sent again."""
        if not isinstance(exc, rex.ActorUnavailableError) or not self._calls:
            return False
        again = False
        for ref in refs:
            call = self._calls.get(ref)
            if call is None:
                continue
            try:
                ray.get(self.current([ref])[0], timeout=0)
                continue  # (done, or not yet)
            except rex.ActorUnavailableError:
                if not call[5]:  # (in flight at the death, as far as fray can tell: it fails)
                    continue
            except Exception:
                continue
            again = self._send(ref, call[0], call) or again  # (to the same Ray actor: Ray restarts it)
        return again

    def resend_made_after_death(self, refs: Sequence[ObjectRef], deadline: float | None) -> bool:
        """A get of `refs` failed with an SPMD group's restart: each call of `refs` made after the death (not in
        flight at it) is sent to the group's new member once it is back. True if any was."""
        again = False
        for ref, payload in zip(refs, self.current(refs), strict=True):
            call = self._calls.get(ref)
            if call is None or not self._sent_after_death(payload, call[4]):
                continue
            self._await_back(call[0], deadline, -1)
            again = self._send(ref, self._route(call[0]), call) or again
        return again

    def resend_waiting(self, refs: Sequence[ObjectRef], values: Sequence[Any], deadline: float | None) -> bool:
        """A get of `refs` read `values`: each call that waited for its SPMD group's restart (a Refusal that
        waits) is sent to the group's new member once it is back (GetTimeoutError at `deadline`). True if any."""
        again = False
        for ref, value in zip(refs, values, strict=True):
            if type(value) is not Refusal or not value.waits:
                continue
            call = self._calls.get(ref)
            if call is None:
                continue
            self._await_back(call[0], deadline, value.after)
            again = self._send(ref, self._route(call[0]), call) or again
        return again

    def _send(self, ref: ObjectRef, actor: Any, call: _Call) -> bool:
        with self._lock:
            sends = self._sent[ref][1] if ref in self._sent else 0
            if sends >= MAX_SENDS:
                return False
        _, method, args, kwargs, _, _ = call
        sent = getattr(actor, method).remote(*args, **kwargs)
        with self._lock:
            self._sent[ref] = (sent, sends + 1)
        return True


def _actor_process(actor_id: str) -> tuple[str, int]:
    """(Ray's state of the actor, the pid of its process if it runs on this node, else 0), from the GCS."""
    from ray._private import state  # (Ray's GCS actor table, as _gangs reads it)

    info = state.actors(actor_id=actor_id)
    try:
        here = str((info.get("Address") or {}).get("NodeID", "")) == ray.get_runtime_context().get_node_id()
    except Exception:
        here = False
    return str(info.get("State", "")), int(info.get("Pid") or 0) if here else 0


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
