"""Elastic ranks: `create_job(..., replicas=(min, max))` (`--replicas MIN:MAX` on the command line, as torchrun
takes nodes) runs as many ranks as fit, at least min and at most max.

What fits is counted against the nodes' totals (ClusterContext.node_status's "total" at submission, a job
context's node_resources at an attempt's start), the same totals a fixed job's feasibility is checked against:
what is free changes from one moment to the next, and a job holds its ranks' resources from its start anyway (it
waits PENDING until they are free, as a fixed job does). So the count is deterministic for a given cluster, and
changes only where the cluster's nodes do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fray.runtime.resources import ranks_fitting

__all__ = ["fitting", "parse_replicas", "replica_bounds", "world_size"]


def replica_bounds(replicas: object) -> tuple[int, int]:
    """(min, max) of create_job's `replicas`: an int N is (N, N); a pair (MIN, MAX) is elastic, 1 <= MIN <= MAX."""
    if isinstance(replicas, (tuple, list)):
        if len(replicas) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in replicas):
            raise ValueError(f"elastic replicas are a pair of ints (min, max), e.g. replicas=(2, 8); got {replicas!r}")
        low, high = int(replicas[0]), int(replicas[1])
        if not 1 <= low <= high:
            raise ValueError(
                f"elastic replicas (min, max) need 1 <= min <= max, got ({low}, {high}); "
                f"e.g. replicas=(1, {max(high, 1)})"
            )
        return low, high
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise TypeError(f"replicas must be an int or a pair (min, max) of ints, got {type(replicas).__name__}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    return replicas, replicas


def parse_replicas(text: str) -> int | tuple[int, int]:
    """`N` or `MIN:MAX` (the command line's --replicas), checked as replica_bounds checks create_job's."""
    low, colon, high = text.partition(":")
    try:
        value: int | tuple[int, int] = (int(low), int(high)) if colon else int(text)
    except ValueError:
        raise ValueError(f"--replicas takes N or MIN:MAX (e.g. 4 or 2:8), got {text!r}") from None
    replica_bounds(value)
    return value


def fitting(totals: Sequence[Mapping[str, float]], per_rank: Mapping[str, float]) -> tuple[int, int]:
    """How many ranks of `per_rank` the largest node holds, and how many all the nodes hold together."""
    counts = [ranks_fitting(total, per_rank) for total in totals]
    return max(counts, default=0), sum(counts)


def world_size(bounds: tuple[int, int], per_rank: Mapping[str, float], totals: Sequence[Mapping[str, float]]) -> int:
    """An attempt's ranks over the nodes: as many as the nodes' totals hold, within bounds. Where they hold fewer
    than min, min: the attempt then fares as a fixed job of min ranks would (its group waits or is refused)."""
    low, high = bounds
    if not per_rank or not totals:
        return high if not per_rank else low  # nothing limits them / nothing known of the nodes
    return max(low, min(high, fitting(totals, per_rank)[1]))
