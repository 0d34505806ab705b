"""SPMD groups on Ray fail and restart as one (see fray.runtime.gang).

Ray tells the driver nothing when an idle actor dies, so the members of each live SPMD group are watched: one
thread per context asks Ray's GCS for their states every `POLL` seconds (a cost per member asked) while any such
group lives. When a member is DEAD (or RESTARTING) and fray did not kill the whole group itself, every member is
killed with ray.kill (a survivor blocked in a collective cannot leave it otherwise) and every get of a call sent
to the group in that life raises the group's error: ActorDiedError naming the rank that died, or, with a restart
left (`ActorOptions.max_restarts`; the Ray actors themselves have none), ActorUnavailableError while new members
are made in the same placement group bundles on fresh processes (`RayGang.respawn`: a new MASTER_PORT,
`fray.current_actor().restarts`, __init__ again on every rank). Calls through the group's handles go to the new
members (`route`); a call made while it restarts waits for it (fray_ray._resend), one made once it is dead raises
its error.

A get that fails because of a death (Ray's ActorDiedError of the killed survivors, or the collective's own error
about a lost peer, which may come first) does not wait for the next poll: it polls at once and waits up to
`fray.runtime.gang.LOST_PEER_GRACE` for the death, then raises the group's error.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.exceptions as rex

from fray.backend import (
    LOST_PEER_GRACE,
    RECORDER,
    Kind,
    died_error,
    exiting,
    hung,
    hung_reason,
    lost_peer,
    restarting_error,
)
from fray.errors import ActorDiedError, ActorUnavailableError, FrayError, GetTimeoutError
from fray_ray._heartbeats import last_beat
from fray_ray._refusals import Refusal

__all__ = ["POLL", "GangWatch", "RayGang"]

POLL = 0.2  # seconds between two looks at the members' states
_GONE = {"DEAD", "RESTARTING"}
_DEATH_MESSAGE = re.compile(r'error_message: "([^"]*)"')


@dataclass
class RayGang:
    """One SPMD group: its current Ray actor handles and ids by rank, and its fate. `generation` counts its lives
    (+1 at each failure); `failures[g]` is why life g ended; `error` is set while it restarts, or once dead."""

    label: str
    actors: list[Any]
    ids: list[str]
    max_restarts: int = 0
    respawn: Callable[[RayGang], list[Any]] | None = None  # new members on fresh processes (RayGroups)
    restarts: int = 0
    generation: int = 0
    failures: dict[int, FrayError] = field(default_factory=dict)
    error: FrayError | None = None
    dead: bool = False
    history: list[Any] = field(default_factory=list)  # every handle it had (their id() stay valid for route)
    hang_timeout: float = math.inf  # seconds a member's heartbeat may stay unchanged (fray.runtime.gang.hang_timeout)
    beats: dict[str, tuple[Any, float]] = field(default_factory=dict)  # actor id -> (last beat, when it changed)
    up_since: dict[str, float] = field(default_factory=dict)  # actor id -> when first seen ALIVE (__init__ returned)
    ended_at: dict[int, float] = field(default_factory=dict)  # life -> when its member died (time.time(), by Ray)
    # rank -> pid of its process if on this machine, 0 elsewhere; replaced, never changed in place (read unlocked)
    local_pids: dict[int, int] = field(default_factory=dict)
    next_pid_look: float = 0.0  # (time.monotonic()) when route may ask the GCS for the pids not known yet


class GangWatch:
    """The SPMD groups of one context and the thread watching them."""

    def __init__(self, stopping: Callable[[list[str], str], None] | None = None) -> None:
        self._stopping = stopping  # told of the survivors of a failed life stopped here (actor ids, why)
        self._lock = threading.Condition()
        self._by_actor: dict[str, tuple[RayGang, int]] = {}  # Ray actor id (hex) -> its group and life
        self._ranks: dict[int, tuple[RayGang, int]] = {}  # id() of a member's Ray handle -> its group and rank
        self._live: list[RayGang] = []
        self._poke = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.refusing = False  # a Refusal was handed out: gets look for them (raise_refusals)

    def add(
        self,
        label: str,
        actors: Sequence[Any],
        max_restarts: int = 0,
        respawn: Callable[[RayGang], list[Any]] | None = None,
        hang_timeout: float = math.inf,
    ) -> None:
        gang = RayGang(label, [], [], max_restarts, respawn, hang_timeout=hang_timeout)
        with self._lock:
            self._adopt(gang, list(actors))
            self._live.append(gang)
            self._start_watching()

    def _adopt(self, gang: RayGang, actors: list[Any]) -> None:
        """Under the lock: these are the group's members now."""
        gang.actors, gang.ids = actors, [a._actor_id.hex() for a in actors]
        gang.history += actors
        now = time.monotonic()
        gang.beats = {actor_id: (None, now) for actor_id in gang.ids}  # (silence counts from now)
        gang.up_since = {}
        gang.local_pids = {}
        for rank, (actor, actor_id) in enumerate(zip(actors, gang.ids, strict=True)):
            self._by_actor[actor_id] = (gang, gang.generation)
            self._ranks[id(actor)] = (gang, rank)

    def _start_watching(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._watch, name="fray-ray-gangs", daemon=True)
            self._thread.start()

    def killed(self, actors: Sequence[Any]) -> list[tuple[int, Any]]:
        """fray kills these actors: a whole group killed is no death to report (a part of one is: see _watch).
        Returns the (rank, Ray handle) of the group's members now, if a restart replaced them, to kill as well."""
        ids = {a._actor_id.hex() for a in actors}
        more: list[tuple[int, Any]] = []
        later: list[tuple[RayGang, int, int]] = []
        with self._lock:
            gangs = {id(g): g for g, _ in (self._by_actor[i] for i in ids if i in self._by_actor)}.values()
            for gang in gangs:
                ranks = {self._ranks[id(a)][1] for a in gang.history if a._actor_id.hex() in ids}
                if gang.dead:
                    continue
                if len(ranks) < len(gang.actors):  # a part of it: the group cannot go on without it, nor restart
                    later.append((gang, gang.generation, min(ranks)))
                    continue
                if gang in self._live:
                    self._live.remove(gang)
                gang.dead = True
                gang.error = gang.failures[gang.generation] = ActorDiedError(f"{gang.label} was killed")
                gang.generation += 1
                more += [(r, a) for r, a in enumerate(gang.actors) if a._actor_id.hex() not in ids]
                self._lock.notify_all()
        for gang, generation, rank in later:
            self._fail(gang, generation, rank, "it was killed", restart=False)
        return more

    def close(self) -> None:
        self._closed = True
        self._poke.set()

    # ------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        while not self._closed:
            with self._lock:
                live = [g for g in self._live if g.error is None]  # (one restarting is looked at once back)
                if not self._live:
                    return
            for gang in live:
                try:
                    self._look(gang, gang.generation)
                except Exception:  # Ray going away (shutdown): the next round, or the end
                    if self._closed or not ray.is_initialized():
                        return
            self._poke.wait(POLL)
            self._poke.clear()

    def _look(self, gang: RayGang, generation: int) -> None:
        from ray._private import state  # (Ray's GCS actor table; no dashboard needed)

        for rank, actor_id in enumerate(list(gang.ids)):
            info = state.actors(actor_id=actor_id)
            alive = info.get("State") == "ALIVE"  # (its __init__ has returned)
            if alive and actor_id not in gang.up_since:
                gang.up_since[actor_id] = time.monotonic()
            if alive and rank not in gang.local_pids:
                # a new dict, not an insert: `route` iterates the one it read on the caller's thread, unlocked
                gang.local_pids = {**gang.local_pids, rank: _local_pid(info)}
            if info.get("State") in _GONE:
                found = _DEATH_MESSAGE.search(str(info.get("DeathCause", "")))
                # (Ray's message goes on with advice about OOM kills: its first sentence says what happened)
                why = found.group(1).split(". ")[0].rstrip(".") if found else f"its Ray actor is {info.get('State')}"
                ended = int(info.get("EndTime") or 0) / 1000  # (ms; the GCS's time of the death, 0 if unknown)
                self._fail(gang, generation, rank, why, at=ended or time.time())
                return
            if not math.isinf(gang.hang_timeout) and self._silent(gang, actor_id):
                _kill_stopped(info)
                self._fail(gang, generation, rank, hung_reason(gang.hang_timeout))
                return

    @staticmethod
    def _silent(gang: RayGang, actor_id: str) -> bool:
        """The member's heartbeat (a counter its process writes in Ray's KV) has not changed for hang_timeout
        (fray.runtime.gang.hung: longer while its __init__ runs)."""
        beat = last_beat(actor_id)
        last, since = gang.beats.get(actor_id, (None, time.monotonic()))
        now = time.monotonic()
        if beat != last:
            gang.beats[actor_id] = (beat, now)
            return False
        return hung(since, now, gang.hang_timeout, gang.up_since.get(actor_id))

    def _fail(
        self, gang: RayGang, generation: int, rank: int, why: str, restart: bool = True, at: float | None = None
    ) -> None:
        """Life `generation` of the group ended with its rank's death (at `at`, time.time(); now if None): every
        member killed; restarted or dead."""
        with self._lock:
            if gang not in self._live or gang.generation != generation or gang.error is not None:
                return
            gang.ended_at[generation] = time.time() if at is None else at
            can_restart = gang.max_restarts == -1 or gang.restarts < gang.max_restarts
            if restart and gang.respawn is not None and can_restart:
                gang.restarts += 1
                RECORDER.record(
                    Kind.GROUP_RESTART, gang.label, gang.label, {"reason": f"rank {rank}: {why}", "rank": rank}
                )
                gang.error = restarting_error(gang.label, rank, why, gang.restarts, gang.max_restarts)
            else:
                self._live.remove(gang)
                gang.dead = True
                gang.error = died_error(gang.label, rank, why)
            gang.failures[generation] = gang.error
            gang.generation += 1
            members = list(gang.actors)
            self._lock.notify_all()
        if self._stopping is not None:
            survivors = [a._actor_id.hex() for r, a in enumerate(members) if r != rank]
            self._stopping(survivors, f"fray stopped it: its {gang.label} lost rank {rank} ({why})")
        for actor in members:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # dead already
                pass
        if not gang.dead:
            threading.Thread(
                target=self._restart, args=(gang, gang.generation, members), name="fray-ray-gang-restart", daemon=True
            ).start()

    def _restart(self, gang: RayGang, generation: int, old: list[Any]) -> None:
        """Once the old members are dead (their names and bundles free again): new ones, on fresh processes."""
        from ray._private import state

        deadline = time.monotonic() + _RESTART_TIMEOUT
        for actor in old:
            while time.monotonic() < deadline and state.actors(actor_id=actor._actor_id.hex()).get("State") != "DEAD":
                time.sleep(0.05)
        assert gang.respawn is not None
        try:
            new = gang.respawn(gang)
        except Exception as exc:
            with self._lock:
                if gang.generation == generation and not gang.dead:
                    self._live.remove(gang)
                    gang.dead = True
                    gang.error = gang.failures[generation] = ActorDiedError(
                        f"{gang.label} is dead: its restart {gang.restarts} failed: {type(exc).__name__}: {exc}"
                    )
                    gang.generation += 1
                    self._lock.notify_all()
            return
        with self._lock:
            if gang.generation != generation or gang.dead:  # killed meanwhile
                stale = new
            else:
                stale = []
                self._adopt(gang, new)
                gang.error = None
                self._lock.notify_all()  # (gets waiting to send a call made during the restart: await_back)
                self._start_watching()
        for actor in stale:
            ray.kill(actor, no_restart=True)

    # ------------------------------------------------------------ calls and failed gets
    def route(self, actor: Any) -> tuple[Any, Any]:
        """(the Ray handle to call, None) for a call through `actor`: a member of a restarted group is called on
        its new actor. (None, a Ray ref whose get raises) while its group restarts or once it is dead: the call
        must not run on a survivor the kill has not reached yet."""
        if not self._ranks:
            return actor, None
        found = self._ranks.get(id(actor))
        if found is None:
            return actor, None
        gang, rank = found
        with self._lock:  # (one life's: the watcher may end it while the member's process is looked at below)
            error, generation = gang.error, gang.generation
        if error is None:
            if not self._member_ending(gang):
                return gang.actors[rank], None
            # A member's process has begun to exit (SIGKILLed: a torch process takes a while to end, Ray and the
            # watcher see the death after that): the call waits for the life after the one it was made in.
            self.refusing = True
            coming = ActorUnavailableError(f"{gang.label}: a member's process is ending; the group will restart")
            return None, ray.put(Refusal(coming, waits=True, after=generation))
        self.refusing = True
        return None, ray.put(Refusal(type(error)(str(error)), waits=not gang.dead))

    def _member_ending(self, gang: RayGang) -> bool:
        """A member's process here has begun to exit, or Ray reports a member gone. Until the watcher has seen
        every member alive, the GCS is asked here for the others' pids (once a POLL at most)."""
        pids, ids = gang.local_pids, gang.ids
        if any(exiting(pid) for pid in pids.values() if pid):
            return True
        if len(pids) >= len(ids) or time.monotonic() < gang.next_pid_look:
            return False
        gang.next_pid_look = time.monotonic() + POLL
        from ray._private import state

        learnt = dict(pids)
        for rank, actor_id in enumerate(ids):
            if rank not in learnt:
                try:
                    info = state.actors(actor_id=actor_id)
                except Exception:  # the GCS did not answer: the watcher's next look
                    return False
                if info.get("State") in _GONE:
                    return True
                if info.get("State") == "ALIVE":
                    learnt[rank] = _local_pid(info)
        if gang.ids is ids:  # (not replaced by a restart meanwhile)
            gang.local_pids = learnt
        return any(exiting(pid) for pid in learnt.values() if pid)

    def member_now(self, actor: Any) -> Any:
        """The Ray handle a call through `actor` goes to now (its group's current member of that rank); raises
        the group's error while it restarts or once it is dead."""
        found = self._ranks.get(id(actor))
        if found is None:
            return actor
        gang, rank = found
        with self._lock:
            if gang.error is not None:
                raise type(gang.error)(str(gang.error))
            return gang.actors[rank]

    def await_back(self, actor: Any, deadline: float | None, after: int = -1) -> None:
        """Wait until the group of member `actor` is back from its restart (a life later than `after`), or dead;
        GetTimeoutError at `deadline` (a call made while it restarts waits for it: fray_ray._resend)."""
        found = self._ranks.get(id(actor))
        if found is None:
            return
        gang = found[0]
        with self._lock:
            while not gang.dead and (gang.error is not None or gang.generation <= after):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise GetTimeoutError(f"{gang.label} did not come back from its restart {gang.restarts} in time")
                self._lock.wait(1.0 if left is None else min(left, 1.0))

    def is_member(self, actor: Any) -> bool:
        """`actor` (a Ray handle) is a member of an SPMD group made here."""
        return bool(self._ranks) and id(actor) in self._ranks

    def sent_after_death(self, payload: Any, sent_at: float) -> bool:
        """The call behind Ray ref `payload`, sent at `sent_at` (time.time()), was made after the death that ended
        the life of its group it was sent in (fray had not learnt of it yet): it was in flight at no death."""
        try:
            found = self._by_actor.get(payload.task_id().actor_id().hex())
        except Exception:  # not an actor call's ref
            return False
        if found is None:
            return False
        gang, generation = found
        with self._lock:
            return gang.generation != generation and sent_at > gang.ended_at.get(generation, math.inf)

    def involves(self, payload: Any) -> bool:
        """The Ray ref is of a call to a member of an SPMD group (its failure may be the group's: failure)."""
        if not self._by_actor:
            return False
        try:
            return payload.task_id().actor_id().hex() in self._by_actor
        except Exception:
            return False

    def failure(self, exc: BaseException, payloads: Sequence[Any]) -> FrayError | None:
        """The group's error to raise instead of `exc`, a failed get of these Ray refs, if the life of a member's
        group the call was sent in has ended (waiting up to LOST_PEER_GRACE for an end `exc` says has
        happened); else None."""
        if not self._by_actor:
            return None
        sent: list[tuple[RayGang, int]] = []
        for payload in payloads:
            try:
                found = self._by_actor.get(payload.task_id().actor_id().hex())
            except Exception:  # not an actor call's ref
                found = None
            if found is not None and found not in sent:
                sent.append(found)
        if not sent:
            return None
        cause = exc.cause if isinstance(exc, rex.RayTaskError) else exc
        if isinstance(exc, rex.RayActorError) or (cause is not None and lost_peer(cause)):
            self._poke.set()
            deadline = time.monotonic() + LOST_PEER_GRACE
            with self._lock:
                for gang, generation in sent:
                    while gang.generation == generation and time.monotonic() < deadline:
                        self._lock.wait(max(0.0, deadline - time.monotonic()))
        for gang, generation in sent:
            error = gang.failures.get(generation)
            if error is not None:
                return type(error)(str(error))
        return None


_RESTART_TIMEOUT = 60.0  # seconds the old members get to be DEAD in the GCS before the new ones are made


def _local_pid(info: dict[str, Any]) -> int:
    """The pid of a live member's process, from its GCS record, if on this machine; else 0."""
    return int(info.get("Pid") or 0) if _on_this_node(info) else 0


def _on_this_node(info: dict[str, Any]) -> bool:
    try:
        return str((info.get("Address") or {}).get("NodeID", "")) == ray.get_runtime_context().get_node_id()
    except Exception:
        return False


def _kill_stopped(info: dict[str, Any]) -> None:
    """SIGKILL a stopped member's process when it is on this machine's node (it cannot answer Ray's kill)."""
    pid = int(info.get("Pid") or 0)
    node = str((info.get("Address") or {}).get("NodeID", ""))
    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:
        return
    if pid and node and node == here:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
