"""SPMD members' heartbeats on Ray: a member's process counts up in Ray's KV (`start_heartbeat`); the driver's
group watcher (fray_ray._gangs) reads the count (`last_beat`), and a count that stops changing is a stopped
process."""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from ray.experimental import internal_kv

from fray.backend import settings

__all__ = ["HEARTBEAT_ENV", "last_beat", "start_heartbeat"]

HEARTBEAT_ENV = settings.SPMD_HEARTBEAT.name  # in an SPMD member's environment: seconds between its heartbeats


def _beat_key(actor_id: str) -> bytes:
    return f"fray-beat/{actor_id}".encode()


def start_heartbeat(interval: float) -> None:
    """In an SPMD member's process: a thread counting up in Ray's KV every `interval` seconds (a stopped process
    stops counting; the driver's watcher notices)."""
    key = _beat_key(ray.get_runtime_context().get_actor_id() or "")

    def beat() -> None:
        count = 0
        while True:
            count += 1
            try:
                internal_kv._internal_kv_put(key, str(count).encode(), overwrite=True)
            except Exception:  # Ray going away
                return
            time.sleep(interval)

    threading.Thread(target=beat, name="fray-heartbeat", daemon=True).start()


def last_beat(actor_id: str) -> Any:
    """The count member `actor_id`'s process last put (None before its first)."""
    return internal_kv._internal_kv_get(_beat_key(actor_id))
