"""The calls and streams of an actor whose process died, failed as soon as fray sees the death.

fray sees a worker process end at once: a pidfd on this machine, its lifeline from another host. Monarch fails a
call's future only when its own supervision finds the process gone: at its next poll, or up to
HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE later when the poll races the death. So the calls sent to one actor alone
(a group broadcast is failed with its group) and the streams it produces are failed here, REPLY_GRACE after the
death, unless their answer came meanwhile: a reply the process sent just before it ended may still be on its way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fray.backend import ActorState
from fray.errors import ActorDiedError, ActorUnavailableError
from fray_monarch.core import runtime
from fray_monarch.driver.actor_rec import ActorRec

__all__ = ["REPLY_GRACE", "fail_after_grace", "stream_failure"]

REPLY_GRACE = 1.0  # seconds between a death fray saw and the failure of what its process had not answered


def stream_failure(actor: ActorRec, restarts: int) -> Exception:
    """How a stream of `actor` ends when its process died during it (`restarts`: the actor's when it began)."""
    restarted = actor.restarts > restarts
    if not restarted and (actor.state == ActorState.DEAD or not actor.can_restart):
        return ActorDiedError(f"actor {actor.label} died: {actor.reason or 'its process crashed'}")
    return ActorUnavailableError(f"actor {actor.label}: its process crashed during this stream; it is restarting")


def fail_after_grace(
    rec: ActorRec,
    reason: str,
    awaited: Callable[[list[Any]], object],
    reply: Callable[[Any, Any, BaseException | None], None],
    stream_reply: Callable[[Any, ActorRec, int, Any, BaseException | None], None],
) -> None:
    """Under the lock: rec's process died. Its calls not answered yet and its open streams fail REPLY_GRACE from
    now, each as if Monarch had failed it (`reply`, `stream_reply`: the registry's), unless answered meanwhile:
    `awaited` makes each call's reply complete it by itself from now on."""
    calls, rec.calls = list(rec.calls.values()), {}
    streams, rec.streams = list(rec.streams.values()), {}
    if not calls and not streams:
        return
    awaited(calls)
    error = RuntimeError(reason)

    def fail() -> None:
        for entry in calls:
            reply(entry, None, error)  # (nothing, for one answered meanwhile)
        for stream, restarts in streams:
            stream_reply(stream, rec, restarts, None, error)

    runtime.call_later(REPLY_GRACE, fail)
