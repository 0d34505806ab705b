"""The GPU benchmarks stay runnable on a GPU machine: their --quick runs complete (timings are not a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _quick(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_bench_gpu_runs_quick() -> None:
    out = _quick(str(BENCH / "bench_gpu.py"), "--quick")
    assert "device copy" in out and "fray-in_memory put -> get" in out, out


def test_bench_rlhf_runs_quick_on_the_gpu() -> None:
    out = _quick(str(BENCH / "bench_rlhf.py"), "--quick", "--device", "cuda")
    assert "fray-in_memory" in out, out
