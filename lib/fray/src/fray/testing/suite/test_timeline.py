"""The timeline on every backend: one workload's events, from every process that ran it, drawn as a Chrome trace
that fray.telemetry.timeline.validate accepts, with exactly its tasks, calls and transfer bytes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fray.context import JobContext
from fray.telemetry.timeline import validate
from fray.testing import workloads as h

np = pytest.importorskip("numpy", reason="numpy is needed for the 1 MiB value")


def _events(trace: dict[str, Any], ph: str, cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph and (cat is None or e.get("cat") == cat)]


def test_a_workload_draws_a_valid_timeline(fray_own_ctx: JobContext, tmp_path: Path) -> None:
    ctx = fray_own_ctx
    assert ctx.get([ctx.create_task(h.add, args=(i, 1)) for i in range(20)], timeout=60) == list(range(1, 21))
    counter = ctx.create_actor(h.Counter)
    assert ctx.get([counter.incr() for _ in range(5)], timeout=60) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="planned"):
        ctx.get(ctx.create_task(h.raise_value_error, args=("planned",)), timeout=60)
    value = np.ones(2**20, dtype=np.uint8)
    assert ctx.get(ctx.put(value), timeout=60).nbytes == 2**20
    doomed = ctx.create_actor(h.Counter)
    ctx.get(doomed.incr(), timeout=60)
    ctx.kill(doomed)

    moved = {path: stats.bytes for path, stats in ctx.transfer_stats().items()}
    # A backend may bring the workers' last events a little after the work ended (ray: its workers flush at most
    # every 0.2 s, later on a loaded machine): the timeline is asked again until it holds them, for a while.
    deadline = time.monotonic() + 20
    while True:
        summary = ctx.timeline(tmp_path / "trace.json")
        trace = json.loads((tmp_path / "trace.json").read_text())
        problems = validate(trace, tasks=21, calls=6, transfers=moved)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert problems == []
    assert (summary.tasks, summary.calls, summary.dropped) == (21, 6, 0)
    assert sum(moved.values()) >= 2**20, moved

    spans = _events(trace, "X", "task")
    assert sum(1 for s in spans if s["name"].endswith("add")) == 20
    failed = [s for s in spans if s["args"].get("status", "ok") == "error"]
    assert [s["args"].get("error") for s in failed] == ["ValueError"], failed
    calls = _events(trace, "X", "actor call")
    assert all(c["name"] == "Counter.incr" for c in calls)
    flows = _events(trace, "s")
    assert len(flows) == 21 + 6  # every task and call: an arrow from where it was submitted to where it started
    transfers = _events(trace, "X", "transfer")
    assert transfers and all(t["args"]["to"] for t in transfers), transfers[:3]  # (and "from" where it is known)
    deaths = [e for e in _events(trace, "i") if e["name"].startswith("actor.died")]
    assert len(deaths) == 1 and deaths[0]["args"]["reason"], deaths
    names = {e["args"]["name"] for e in _events(trace, "M") if e["name"] == "process_name"}
    assert any(name.startswith("driver ") for name in names), names
