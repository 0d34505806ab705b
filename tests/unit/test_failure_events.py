"""A failed conformance-style test's report carries what its context recorded while it ran (the fray pytest
plugin, fray.testing.failure_events): a once-in-a-run failure then says what the backend did. Run as a child
pytest on a real in_memory context, as CI runs the suite."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import fray
from fray.testing.failure_events import events_during

FAILING_CASE = """
import fray
from fray.testing import workloads as h


def test_fails_after_an_actor_died(fray_ctx: fray.JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter, args=(1,))
    assert fray_ctx.get(counter.incr(), timeout=60) == 2
    fray_ctx.kill(counter)
    assert False, "failed on purpose"


def test_passes(fray_ctx: fray.JobContext) -> None:
    assert fray_ctx.get(fray_ctx.put(3), timeout=60) == 3
"""


def test_a_failed_tests_report_shows_its_contexts_events(tmp_path: Path) -> None:
    (tmp_path / "test_case.py").write_text(FAILING_CASE)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fray-backend=in_memory", "test_case.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = run.stdout + run.stderr
    assert "1 failed, 1 passed" in out, out
    assert out.count("fray events during this test") == 1, out  # (the failed case's, not the passing one's)
    section = out.split("fray events during this test", 1)[1]
    assert "actor.create" in section and "Counter" in section, section
    assert "call.end" in section and "incr" in section, section


def test_events_during_names_each_events_process_and_skips_earlier_ones() -> None:
    ctx = fray.init("in_memory?events=on")
    try:
        ctx.get(ctx.create_task(len, args=([1],)), timeout=60)
        since = time.time_ns()
        ctx.get(ctx.create_task(sorted, args=([2, 1],)), timeout=60)
        text = events_during(ctx, since)
    finally:
        ctx.shutdown()
    assert "task.end" in text and "sorted" in text and "pid" in text, text
    assert "len" not in text.replace("sorted", ""), text  # (the task before `since` is not shown)


def test_events_during_says_so_when_the_context_cannot_answer() -> None:
    ctx = fray.init("in_memory?events=on")
    ctx.shutdown()
    assert events_during(ctx, 0).startswith("the events could not be read: ")
