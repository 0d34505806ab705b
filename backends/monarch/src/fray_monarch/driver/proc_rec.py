"""One worker process as the driver keeps it (the ProcessPool of processes.py and the parts that place work on its
processes share it), and what a process's env key says: the share of a process sized for big tasks, its GPUs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fray.backend import EPS, exiting, fits, held_from_env, settings

SIZED_ENV = settings.TASK_RESOURCES.name  # in the env key of a process sized for tasks bigger than a process's share

EnvKey = tuple[tuple[str, str], ...]


@dataclass
class Proc:
    """One worker process: what runs there, and what its tasks may use."""

    key: str
    host: int
    mesh: Any
    worker: Any
    capacity: dict[str, float]
    pid: int = 0  # known once it answered its first ping, for a process on this machine
    died_in_a_call: bool = False  # a call to it failed as it died, before the pool's news of that death
    claims: dict[str, float] = field(default_factory=dict)  # what the actors placed on it take of its share
    outstanding: set[str] = field(default_factory=set)  # tasks sent to it, not reported yet
    blocked: int = 0  # of those, how many wait in get/wait (their resources are lent)
    actors: set[str] = field(default_factory=set)
    fns_sent: set[str] = field(default_factory=set)
    alive: bool = True
    env_key: EnvKey = ()  # non-empty: a process that only runs tasks with exactly this env
    dedicated: str = ""  # non-empty: the process of one actor (an SPMD member, a group member): no tasks, no others
    taking_back: bool = False  # an unqueue request is in flight
    gpus: tuple[int, ...] = ()  # the GPUs it sees (its CUDA_VISIBLE_DEVICES); work there holds some of them

    @property
    def role(self) -> str:
        """What it is for, in words (how the timeline and the live page name it)."""
        return f"process of actor {self.dedicated}" if self.dedicated else "task process" if self.env_key else "worker"

    @property
    def general(self) -> bool:
        """A worker process for tasks (and actors) with no env of its own."""
        return not self.env_key and not self.dedicated

    @property
    def free_capacity(self) -> dict[str, float]:
        return {k: self.capacity.get(k, 0.0) - self.claims.get(k, 0.0) for k in set(self.capacity) | set(self.claims)}

    @property
    def slots(self) -> int:
        return max(1, math.floor(self.free_capacity.get("CPU", 0.0) + EPS))

    def fits_at_all(self, res: dict[str, float]) -> bool:
        return fits(self.free_capacity, res)

    def dying(self) -> bool:
        """It has begun to exit (its pid, on this machine), or, its pid not known yet (the worker's first answer
        can come late), a call to it failed as it died."""
        return exiting(self.pid) if self.pid else self.died_in_a_call


def local_part(resources: dict[str, float]) -> dict[str, float]:
    """What work takes of its process's share: all it asks for but its GPUs (held per host, by device)."""
    return {k: v for k, v in resources.items() if k != "GPU"} if "GPU" in resources else resources


def sized_capacity(env_key: EnvKey) -> dict[str, float]:
    """The capacity of a process started with this env key: what sized_env_key put in it, else {}."""
    value = settings.TASK_RESOURCES.read(dict(env_key))
    return {k: float(v) for k, _, v in (item.partition("=") for item in value.split(",") if item)}


def gpus_of_key(env_key: EnvKey) -> tuple[int, ...]:
    """The GPUs a process started with this env key holds (gpu_env_key), else ()."""
    return held_from_env(dict(env_key))
