"""Resource amounts ({"CPU": 1.5, "memory": 2e9, "tag": 1}) and the one way fray compares and counts them.

Fractions add up with rounding errors (ten tasks of 0.1 CPU give back 0.9999999999999999 CPU), so every
comparison allows the same tolerance, EPS: what fits on one backend fits on every other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fray.types import ActorOptions, TaskOptions, normalize_resources

__all__ = [
    "EPS",
    "Resources",
    "actor_resources",
    "add",
    "capacity",
    "fits",
    "format_amount",
    "format_resources",
    "ranks_fitting",
    "short_of",
    "subtract",
    "task_resources",
]

EPS = 1e-9

Resources = dict[str, float]


def fits(free: Mapping[str, float], request: Mapping[str, float]) -> bool:
    """`request` can be taken from `free` (names missing from `free` count as 0)."""
    return all(free.get(name, 0.0) + EPS >= qty for name, qty in request.items() if qty > 0)


def short_of(free: Mapping[str, float], request: Mapping[str, float]) -> Resources:
    """What `free` lacks of `request` (empty if it fits)."""
    return {
        name: qty - free.get(name, 0.0) for name, qty in request.items() if qty > 0 and free.get(name, 0.0) + EPS < qty
    }


def add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    """`into` += `amounts`, in place."""
    for name, qty in amounts.items():
        into[name] = into.get(name, 0.0) + qty


def subtract(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    """`into` -= `amounts`, in place (an amount may go below zero: what was lent while oversubscribed)."""
    for name, qty in amounts.items():
        into[name] = into.get(name, 0.0) - qty


def capacity(free: Mapping[str, float], per_item: Mapping[str, float], unlimited: int = 1 << 30) -> int:
    """How many items of `per_item` fit in `free` (`unlimited` if an item needs nothing)."""
    counts = [math.floor(free.get(name, 0.0) / qty + EPS) for name, qty in per_item.items() if qty > 0]
    return max(0, min(counts)) if counts else unlimited


def task_resources(options: TaskOptions) -> dict[str, float]:
    """What a task holds while it runs: 1 CPU unless it says otherwise (as in Ray), raised to its runtime_env's
    minimum_resources; a request above its maximum_resources is a ValueError."""
    env = options.runtime_env
    if options.resources is None and (env is None or not (env.minimum_resources or env.maximum_resources)):
        return {"CPU": 1.0}
    requested = normalize_resources(options.resources)
    if options.resources is None or "CPU" not in options.resources:
        requested = {"CPU": 1.0, **requested}
    if env is not None:
        for res in env.minimum_resources:
            requested[res.name] = max(requested.get(res.name, 0.0), float(res.quantity))
        for res in env.maximum_resources:
            if requested.get(res.name, 0.0) > res.quantity:
                raise ValueError(
                    f"the task requests {res.name}={requested[res.name]:g}, above its runtime_env's maximum "
                    f"{res.name}={res.quantity:g}"
                )
    return requested


def actor_resources(options: ActorOptions) -> dict[str, float]:
    """What an actor holds for its whole life: only what it asks for (as Ray actors hold 0 CPU by default)."""
    return normalize_resources(options.resources)


def format_amount(name: str, value: float) -> str:
    """One resource's quantity as a person reads it: memory in bytes as GiB/MiB/KiB (`23.5 GiB`, not
    `2.52765e+10`), anything else as a short number."""
    if "memory" not in name.lower() or abs(value) < 1024:
        return f"{value:g}"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:g}"  # (not reached: 1 KiB and up has a unit)


def ranks_fitting(total: Mapping[str, float], each: Mapping[str, float]) -> int:
    """How many requests of `each` fit in `total` at once (a resource `total` lacks holds none)."""
    counts = [math.floor(total.get(name, 0.0) / qty + EPS) for name, qty in each.items() if qty > EPS]
    return max(0, min(counts)) if counts else 0


def format_resources(resources: Mapping[str, float]) -> str:
    """`{CPU: 2, memory: 23.5 GiB}` (Ray's internal `node:...` labels left out)."""
    shown = sorted((k, v) for k, v in resources.items() if not k.startswith("node:"))
    return "{" + ", ".join(f"{k}: {format_amount(k, float(v))}" for k, v in shown) + "}"
