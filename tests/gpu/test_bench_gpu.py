"""bench_gpu.py stays runnable on a GPU machine: its --quick run completes every row (timings are not a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_bench_gpu_runs_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_gpu.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "device copy" in proc.stdout and "fray-in_memory put -> get" in proc.stdout, proc.stdout


def test_bench_rlhf_runs_quick_on_the_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_rlhf.py"), "--quick", "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "fray-in_memory" in proc.stdout, proc.stdout
