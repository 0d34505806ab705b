"""The benchmarks stay runnable: each runs in its --quick mode (small sizes, few steps) on each installed backend.

Smoke runs only: they check that the loops complete and print their tables, never how fast (timings on a shared
machine are not a test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fray

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
BACKENDS = ("in_memory", "ray", "monarch")


def run_bench(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(BENCH)}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=BENCH.parent, check=False
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_rlhf_step_loop_runs_quick(backend: str) -> None:
    if backend not in fray.available_backends():
        pytest.skip(f"{backend} is not installed")
    out = run_bench(str(BENCH / "bench_rlhf.py"), "--quick", "--backend", backend)
    assert "copy floor of the step" in out
    assert f"fray-{backend}" in out
    if backend != "in_memory":  # the engine used directly, in the same run
        assert f"raw {backend}" in out


def test_store_loop_runs_quick() -> None:
    if "monarch" not in fray.available_backends():
        pytest.skip("monarch is not installed")
    out = run_bench(str(BENCH / "bench_store_loop.py"), "--quick", "--backend", "monarch")
    assert "numpy put" in out and "torch actor -> driver" in out and "memcpy p50" in out


def test_monarch_round_trip_and_tasks_run_quick() -> None:
    if "monarch" not in fray.available_backends():
        pytest.skip("monarch is not installed")
    out = run_bench(str(BENCH / "bench_monarch.py"), "--quick")
    assert "actor round trip" in out and "paired block ratios" in out and "tiny tasks: fray-on-monarch" in out
    assert "killed worker reported after" in out


def test_dataplane_runs_small_on_every_installed_backend() -> None:
    backends = [b for b in ("in_memory", "ray", "monarch") if b in fray.available_backends()]
    if "monarch" in backends:
        backends.append("rdma")
    chosen = ",".join(backends)
    out = run_bench(str(BENCH / "bench_dataplane.py"), "--sizes", "1M", "--repeats", "2", "--backends", chosen)
    assert "FAILED" not in out, out
    assert "| p90 |" in out and "task -> get (create+get)" in out


def test_gpu_bench_says_why_it_cannot_measure_without_cuda() -> None:
    """Its --quick run on a GPU machine is in tests/gpu; here it must say what it lacks and end cleanly."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: tests/gpu/test_bench_gpu.py runs the benchmark instead")
    out = run_bench(str(BENCH / "bench_gpu.py"), "--quick")
    assert "no CUDA device here" in out


def test_jobs_bench_runs_quick() -> None:
    backends = ",".join(b for b in BACKENDS if b in fray.available_backends())
    out = run_bench(str(BENCH / "bench_jobs.py"), "--quick", "--backend", backends)
    for backend in backends.split(","):
        assert f"fray-{backend}" in out
    assert out.count("retried / clean (p50)") == len(backends.split(",")) and "logs(tail=100)" in out


def test_timeline_bench_runs_quick() -> None:
    out = run_bench(str(BENCH / "bench_timeline.py"), "--quick")
    assert "tiny tasks, a page polling" in out and "of a core with no page open" in out
    assert "-task timeline: written in" in out and "dropped" in out


@pytest.mark.parametrize("backend", ("in_memory", "ray", "monarch"))
def test_events_bench_runs_quick(backend: str) -> None:
    if backend not in fray.available_backends():
        pytest.skip(f"{backend} is not installed")
    # (the untimed pause between blocks keeps a measurement's blocks alike; a smoke run measures nothing)
    out = run_bench(str(BENCH / "bench_events.py"), "--quick", "--pause", "0.05", "--backend", backend)
    assert "recording off: records in" in out and "recording on: records in" in out
    assert "task round trip" in out and "actor call round trip" in out


def test_executors_bench_runs_quick() -> None:
    out = run_bench(str(BENCH / "bench_executors.py"), "--quick")
    assert "executor.map" in out and "ctx.map" in out
    assert "ThreadPoolExecutor" in out and "driver RSS growth" in out


def test_idle_bench_runs_quick() -> None:
    """fray-monarch beside raw Monarch (and in_memory), each in a process of its own; Ray's pair is left to `make
    bench` (two more Ray starts for a smoke run)."""
    if "monarch" not in fray.available_backends():
        pytest.skip("monarch is not installed")
    out = run_bench(str(BENCH / "bench_idle.py"), "--quick", "--systems", "fray-in_memory,fray-monarch,monarch")
    assert "Idle context, 2 live actors" in out
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"fray-in_memory", "fray-monarch", "monarch"} <= rows, out
