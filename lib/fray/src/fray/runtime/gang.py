"""What every backend shares about an SPMD group (`create_actor_group(..., distributed=True)`) failing as one.

The members of an SPMD group are one program: when one dies, the others cannot go on (a survivor blocked in a
collective waits for the dead rank until the collective's own timeout, 30 minutes for gloo). So a member's death
is the group's: fray stops every member's process and fails every pending call of every member with an
ActorDiedError naming the group and the rank that died (ActorUnavailableError when the group will be restarted).

A survivor whose collective noticed the death first (gloo: "Connection closed by peer") answers its call with
that RuntimeError, maybe before fray has learnt of the death: `lost_peer` recognizes such an error, and a backend
holds it for up to `LOST_PEER_GRACE` seconds waiting for the death, so the call fails with the group's error.
"""

from __future__ import annotations

import math
import re

from fray.errors import ActorDiedError, ActorUnavailableError
from fray.host import settings
from fray.runtime.remote_errors import RemoteError

__all__ = [
    "DEFAULT_HANG_TIMEOUT",
    "HANG_TIMEOUT_ENV",
    "LOST_PEER_GRACE",
    "STARTUP_GRACE",
    "died_error",
    "died_rank",
    "group_label",
    "hang_timeout",
    "heartbeat_interval",
    "hung",
    "hung_reason",
    "lost_peer",
    "restarting_error",
]

# How long an error that says a collective lost a peer waits for fray to learn of that peer's death (on one
# machine the dead process's exit is seen in milliseconds; a busy cluster takes longer).
LOST_PEER_GRACE = 10.0

# What collective libraries say when a peer's process is gone (gloo's tcp pair, NCCL's and c10d's errors).
_LOST_PEER_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "nccl communicator was aborted",
)
_LOST_PEER_TYPES = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}


# A member that stops answering without dying (its machine lost power or network; SIGSTOP) is treated as dead
# after this many seconds without a heartbeat from its process. FRAY_SPMD_HANG_TIMEOUT sets it (read when a group
# is created); 0 turns the check off.
HANG_TIMEOUT_ENV = settings.SPMD_HANG_TIMEOUT.name
DEFAULT_HANG_TIMEOUT = settings.SPMD_HANG_TIMEOUT.default


def hang_timeout() -> float:
    """Seconds without a heartbeat after which an SPMD member counts as dead (inf: never); SettingError (a
    FrayError) where FRAY_SPMD_HANG_TIMEOUT is not a number."""
    return settings.SPMD_HANG_TIMEOUT.read()


def heartbeat_interval(timeout: float) -> float:
    """How often a member's process says it is alive: several beats per timeout, none needed when it is off."""
    return 5.0 if math.isinf(timeout) else max(0.05, min(timeout / 6, 5.0))


# Seconds of silence a member's process gets on top of the hang timeout while its __init__ runs: a process still
# starting (importing torch, held by a rendezvous, or an __init__ holding the interpreter) may not answer yet.
STARTUP_GRACE = 60.0


def hung(silent_since: float, now: float, timeout: float, up_since: float | None) -> bool:
    """A member's process silent since `silent_since` counts as hung (dead) at `now`: once its __init__ has
    returned (at `up_since`), after `timeout` seconds of silence counted from then at the earliest; while its
    __init__ runs (up_since None), after timeout + STARTUP_GRACE."""
    if up_since is None:
        return now - silent_since > timeout + STARTUP_GRACE
    return now - max(silent_since, up_since) > timeout


def hung_reason(timeout: float) -> str:
    return f"it stopped responding: no heartbeat from its process for {timeout:g} s"


def lost_peer(error: object) -> bool:
    """The error a collective raises when a peer is gone (torch.distributed's Dist*Error, or gloo's RuntimeError
    about a closed connection); `error` may also be a RemoteError (an exception on its way back to its caller)."""
    if isinstance(error, RemoteError):
        names, text = {error.type_name.rsplit(".", 1)[-1]}, error.message
    elif isinstance(error, BaseException):
        names, text = {klass.__name__ for klass in type(error).__mro__}, str(error)
    else:
        return False
    if names & _LOST_PEER_TYPES:
        return True
    runtime = "RuntimeError" in names or isinstance(error, RuntimeError)
    return runtime and any(marker in text.lower() for marker in _LOST_PEER_TEXT)


def group_label(class_name: str, size: int, name: str | None) -> str:
    """How errors name an SPMD group: its name, else its class and size."""
    return f"SPMD group {name!r} ({class_name} x{size})" if name else f"SPMD group {class_name} x{size}"


def died_error(label: str, rank: int, why: str) -> ActorDiedError:
    """The error of every pending and later call of a group that lost `rank` with no restart left."""
    return ActorDiedError(f"{label} is dead: its rank {rank} died ({why}); fray stopped every member of the group")


def died_rank(message: str) -> int | None:
    """The rank a died_error's message names (the one whose death ended the group: each member's calls fail with
    the same error), else None."""
    found = re.search(r" is dead: its rank (\d+) died \(", message)
    return int(found.group(1)) if found else None


def restarting_error(label: str, rank: int, why: str, restart: int, max_restarts: int) -> ActorUnavailableError:
    """The error of the calls pending when the group lost `rank` and of calls made while it restarts."""
    limit = "unlimited" if max_restarts == -1 else f"of {max_restarts}"
    return ActorUnavailableError(
        f"{label} is restarting (restart {restart} {limit}): its rank {rank} died ({why}); every member comes "
        "back on a fresh process"
    )
