"""The Monarch actor classes the driver spawns on worker processes, by name: processes.py, meshgroups.py and
actor_registry.py (driver/) spawn them without importing the worker's modules.

The classes live in workers/hosts.py, both in that one module (see its docstring: a new process unpickles them on
two threads at once, through that module's import lock). Monarch's spawn takes the class itself (it checks it, reads
the signature of its __init__ and its endpoints, and pickles it by reference), so the driver's process loads
workers/hosts.py when it first asks for one; what stays apart is the code: nothing under driver/ imports workers/.
"""

from __future__ import annotations

import importlib

from fray_monarch.core.monarch_api import Actor

__all__ = ["HOSTS_MODULE", "actor_host", "worker_host"]

HOSTS_MODULE = "fray_monarch.workers.hosts"


def _load(name: str) -> type[Actor]:
    klass = getattr(importlib.import_module(HOSTS_MODULE), name)
    if not (isinstance(klass, type) and issubclass(klass, Actor)):
        raise TypeError(f"{HOSTS_MODULE}.{name} is not a Monarch actor class")
    return klass


def worker_host() -> type[Actor]:
    """WorkerHost: one per worker process (its tasks, frees, capacity, stream stops, death watches)."""
    return _load("WorkerHost")


def actor_host() -> type[Actor]:
    """FrayActorHost: one per fray actor (its instance and its calls)."""
    return _load("FrayActorHost")
