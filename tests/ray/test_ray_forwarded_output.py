"""A task's last lines reach its driver's console even when the driver shuts down right after its result
(fray_ray._forwarded_output): Ray relays worker output asynchronously, and `ray.shutdown()` called by hand does not
wait for it. Real Ray for the whole; the waiting rule on files of a directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

from fray_ray._forwarded_output import SETTLE, settle

DRIVER = textwrap.dedent(
    """
    import fray

    def last_words():
        print("the task's last line", flush=True)
        return 7

    ctx = fray.init("ray")
    assert ctx.get(ctx.create_task(last_words), timeout=120) == 7
    fray.shutdown()  # at once: the line is still on its way through Ray's log monitor
    """
)


def test_a_tasks_last_line_reaches_a_driver_that_shuts_down_right_after_its_result() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FRAY_BACKEND")}
    done = subprocess.run([sys.executable, "-u", "-c", DRIVER], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the task's last line" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


def _worker_file(logs: Path, name: str, written_at: float) -> None:
    path = logs / name
    path.write_text("a line\n")
    os.utime(path, (written_at, written_at))


def test_the_driver_waits_out_the_settle_time_after_a_workers_last_write_and_no_longer(tmp_path: Path) -> None:
    slept: list[float] = []
    _worker_file(tmp_path, "worker-ab-01000000-42.out", 1000.0)
    _worker_file(tmp_path, "worker-cd-ffffffff-43.err", 1000.2)
    _worker_file(tmp_path, "raylet.out", 1000.9)  # (not a worker's output)
    assert settle(str(tmp_path), clock=lambda: 1000.4, sleep=slept.append) == pytest.approx(SETTLE - 0.2)
    assert settle(str(tmp_path), clock=lambda: 1000.2 + SETTLE + 0.1, sleep=slept.append) == 0.0  # quiet long enough
    assert settle(str(tmp_path), clock=lambda: 900.0, sleep=slept.append) == SETTLE  # (a clock set back: at most)
    assert slept == [pytest.approx(SETTLE - 0.2), SETTLE]


def test_nothing_is_waited_for_where_no_workers_files_are(tmp_path: Path) -> None:
    def never(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s")

    assert settle(None, sleep=never) == 0.0
    assert settle(str(tmp_path / "absent"), sleep=never) == 0.0
    assert settle(str(tmp_path), sleep=never) == 0.0
