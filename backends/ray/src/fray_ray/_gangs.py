"""SPMD groups on Ray fail as one (issue 19; see fray.gang).

Ray tells the driver nothing when an idle actor dies, so the members of each live SPMD group are watched: one
thread per context asks Ray's GCS for their states every `POLL` seconds (~0.2 ms per member asked) while any such
group lives. When a member is DEAD (or RESTARTING) and fray did not kill the whole group itself, the group is
dead: the other members are killed with ray.kill (a survivor blocked in a collective cannot leave it otherwise),
and every get of a member's call raises the group's ActorDiedError naming the rank that died.

A get that fails because of that death (Ray's ActorDiedError of the killed survivors, or the collective's own
error about a lost peer, which may come first) does not wait for the next poll: it polls at once and waits up to
`fray.gang.LOST_PEER_GRACE` for the death, then raises the group's error.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions as rex

from fray.errors import ActorDiedError
from fray.gang import LOST_PEER_GRACE, died_error, lost_peer

__all__ = ["POLL", "GangWatch", "RayGang"]

POLL = 0.2  # seconds between two looks at the members' states
_GONE = {"DEAD", "RESTARTING"}
_DEATH_MESSAGE = re.compile(r'error_message: "([^"]*)"')


@dataclass
class RayGang:
    """One SPMD group: its Ray actor handles and ids by rank, and its fate."""

    label: str
    actors: list[Any]
    ids: list[str]
    error: ActorDiedError | None = None
    over: threading.Event = field(default_factory=threading.Event)  # dead, or killed by fray (not watched)


class GangWatch:
    """The SPMD groups of one context and the thread watching them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_actor: dict[str, RayGang] = {}  # Ray actor id (hex) -> its group (live or dead)
        self._live: list[RayGang] = []
        self._dead_handles: dict[int, RayGang] = {}  # id() of a dead group's Ray actor handles -> the group
        self._poke = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, label: str, actors: Sequence[Any]) -> None:
        gang = RayGang(label, list(actors), [a._actor_id.hex() for a in actors])
        with self._lock:
            for actor_id in gang.ids:
                self._by_actor[actor_id] = gang
            self._live.append(gang)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="fray-ray-gangs", daemon=True)
                self._thread.start()

    def killed(self, actors: Sequence[Any]) -> None:
        """fray kills these actors: a whole group killed is no death to report (a part of one is: see _watch)."""
        ids = {a._actor_id.hex() for a in actors}
        with self._lock:
            for gang in list(self._live):
                if set(gang.ids) <= ids:
                    self._live.remove(gang)
                    gang.over.set()

    def close(self) -> None:
        self._closed = True
        self._poke.set()

    # ------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        while not self._closed:
            with self._lock:
                live = list(self._live)
            if not live:
                return
            for gang in live:
                try:
                    self._look(gang)
                except Exception:  # Ray going away (shutdown): the next round, or the end
                    if self._closed or not ray.is_initialized():
                        return
            self._poke.wait(POLL)
            self._poke.clear()

    def _look(self, gang: RayGang) -> None:
        from ray._private import state  # (Ray's GCS actor table; no dashboard needed)

        for rank, actor_id in enumerate(gang.ids):
            info = state.actors(actor_id=actor_id)
            if info.get("State") in _GONE:
                found = _DEATH_MESSAGE.search(str(info.get("DeathCause", "")))
                why = found.group(1) if found else f"its Ray actor is {info.get('State')}"
                self._fail(gang, rank, why)
                return

    def _fail(self, gang: RayGang, rank: int, why: str) -> None:
        with self._lock:
            if gang not in self._live:
                return
            self._live.remove(gang)
            gang.error = died_error(gang.label, rank, why)
            self._dead_handles.update((id(actor), gang) for actor in gang.actors)
        for other, actor in enumerate(gang.actors):
            if other != rank:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # dead already
                    pass
        gang.over.set()

    # ------------------------------------------------------------ calls and failed gets
    def refused(self, actor: Any) -> Any:
        """A Ray ref whose get raises the group's error, for a call to a member of a dead group (else None): the
        call must not run on a survivor the kill has not reached yet."""
        if not self._dead_handles:
            return None
        gang = self._dead_handles.get(id(actor))
        if gang is None or gang.error is None:
            return None
        global _raiser
        if _raiser is None:
            _raiser = ray.remote(num_cpus=0, max_retries=0)(_raise)
        return _raiser.remote(ActorDiedError(str(gang.error)))

    def failure(self, exc: BaseException, payloads: Sequence[Any]) -> ActorDiedError | None:
        """The group's error to raise instead of `exc`, a failed get of these Ray refs, if a member's group died
        (waiting up to LOST_PEER_GRACE for a death `exc` says has happened); else None."""
        if not self._by_actor:
            return None
        gangs = []
        for payload in payloads:
            try:
                gang = self._by_actor.get(payload.task_id().actor_id().hex())
            except Exception:  # not an actor call's ref
                gang = None
            if gang is not None and gang not in gangs:
                gangs.append(gang)
        if not gangs:
            return None
        cause = exc.cause if isinstance(exc, rex.RayTaskError) else exc
        if isinstance(exc, rex.RayActorError) or (cause is not None and lost_peer(cause)):
            self._poke.set()
            deadline = time.monotonic() + LOST_PEER_GRACE
            for gang in gangs:
                gang.over.wait(max(0.0, deadline - time.monotonic()))
        for gang in gangs:
            if gang.error is not None:
                return ActorDiedError(str(gang.error))
        return None


_raiser: Any = None  # the Ray task behind `refused` (registered at first use)


def _raise(error: BaseException) -> None:
    raise error
