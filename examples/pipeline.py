"""A small feature-statistics pipeline, written once, run on any Fray backend.

    python examples/pipeline.py                       # in_memory (threads in this process)
    FRAY_BACKEND=ray python examples/pipeline.py      # a private local Ray
    FRAY_BACKEND=monarch fray run -- python examples/pipeline.py  # Monarch (its driver under fray's socket guard)

It puts one large shared array (a projection matrix) in the object store once, fans out one task per data
shard (each projects its shard and returns summary statistics), feeds results to a stateful aggregator actor
as they arrive (wait-driven, not in submission order), and retries a flaky shard.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

import fray

NUM_SHARDS = 16
ROWS_PER_SHARD = 1_000
FEATURES = 1024
PROJECTED = 1024


FLAKY_SHARD = 5  # fails on its first attempt, as a shard on a preempted node or a flaky read would


class TransientShardError(Exception):
    """A failure worth retrying (the task is re-run; other exceptions fail the pipeline at once)."""


def project_shard(shard_id: int, projection: np.ndarray, scratch: str) -> dict:
    """Project one shard of synthetic data and summarize it. `projection` arrives as a value (it was a ref)."""
    if shard_id == FLAKY_SHARD:
        marker = os.path.join(scratch, f"shard-{shard_id}-attempted")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise TransientShardError(f"shard {shard_id}: simulated transient read failure")
    rng = np.random.default_rng(shard_id)
    rows = rng.standard_normal((ROWS_PER_SHARD, FEATURES), dtype=np.float32)
    projected = rows @ projection
    return {
        "shard": shard_id,
        "rows": len(rows),
        "sum": projected.sum(axis=0),
        "sumsq": (projected**2).sum(axis=0),
    }


class Aggregator:
    """Keeps running totals across shards: state lives in the actor, calls arrive one at a time."""

    def __init__(self, width: int) -> None:
        self.rows = 0
        self.sum = np.zeros(width)
        self.sumsq = np.zeros(width)
        self.shards: list[int] = []

    def add(self, stats: dict) -> int:
        self.rows += stats["rows"]
        self.sum += stats["sum"]
        self.sumsq += stats["sumsq"]
        self.shards.append(stats["shard"])
        return len(self.shards)

    def summary(self) -> dict:
        mean = self.sum / self.rows
        std = np.sqrt(self.sumsq / self.rows - mean**2)
        return {
            "rows": self.rows,
            "mean_of_means": float(mean.mean()),
            "mean_std": float(std.mean()),
            "arrival_order": self.shards,
        }


def main() -> None:
    start = time.perf_counter()
    ctx = fray.init()  # FRAY_BACKEND, else in_memory
    print(f"backend: {ctx.backend}  (started in {time.perf_counter() - start:.2f} s)")

    projection = np.random.default_rng(0).standard_normal((FEATURES, PROJECTED), dtype=np.float32)
    projection_ref = ctx.put(projection)  # stored once, shared by every task
    print(f"put a {projection.nbytes / 2**20:.1f} MiB projection matrix once")

    aggregator = ctx.create_actor(Aggregator, args=(PROJECTED,), options=fray.ActorOptions(name="aggregator"))
    # retried up to twice, but only for the transient error: a bug in project_shard fails fast
    options = fray.TaskOptions(resources={"CPU": 1}, max_retries=2, retry_exceptions=[TransientShardError])
    scratch = tempfile.mkdtemp(prefix="fray-example-")
    pending = [
        ctx.create_task(project_shard, args=(i, projection_ref, scratch), options=options) for i in range(NUM_SHARDS)
    ]
    print(f"submitted {len(pending)} shard tasks (shard {FLAKY_SHARD} fails once and is retried)")

    acks = []
    while pending:  # handle results as they finish, not in submission order
        done, pending = ctx.wait(pending, num_returns=1, timeout=120)
        if not done:
            raise TimeoutError("no shard finished within 120 s")
        acks.append(aggregator.add(done[0]))  # the ref arrives at the actor as its value
    ctx.get(acks, timeout=120)
    retried = os.path.exists(os.path.join(scratch, f"shard-{FLAKY_SHARD}-attempted"))
    os.remove(os.path.join(scratch, f"shard-{FLAKY_SHARD}-attempted"))
    os.rmdir(scratch)

    summary = ctx.get(aggregator.summary(), timeout=120)
    elapsed = time.perf_counter() - start
    print(f"aggregated {summary['rows']:,} rows from {NUM_SHARDS} shards in {elapsed:.2f} s")
    print(f"arrival order: {summary['arrival_order']}")
    assert retried and FLAKY_SHARD in summary["arrival_order"]
    print(f"shard {FLAKY_SHARD} failed once with TransientShardError and succeeded on its retry")
    print(f"mean of projected means: {summary['mean_of_means']:+.4f}   mean std: {summary['mean_std']:.3f}")
    expected_std = float(np.sqrt((projection.astype(np.float64) ** 2).sum(axis=0)).mean())
    assert abs(summary["mean_std"] - expected_std) / expected_std < 0.05, (summary["mean_std"], expected_std)
    print("ok: statistics match the projection's theoretical spread")
    fray.shutdown()


if __name__ == "__main__":
    main()
