"""What a Ray worker sees of the GPUs, on GPUs the test spec declares (num_gpus=2: Ray assigns ids as on a GPU
node, and sets CUDA_VISIBLE_DEVICES as it would there). CUDA reads CUDA_VISIBLE_DEVICES once, at its start in a
process, so what matters is the view each process has before anything of the work runs."""

from __future__ import annotations

import os
from typing import Any

from fray import TaskOptions
from fray_ray import RayJobContext

ONE_GPU = TaskOptions(resources={"CPU": 0.5, "GPU": 1})
STREAM_ONE_GPU = TaskOptions(resources={"CPU": 0.5, "GPU": 1}, streaming=True)


def _pid_and_view() -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def _streamed_pid_and_view() -> Any:
    yield os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_gpu_task_runs_in_a_fresh_worker_process(ctx: RayJobContext) -> None:
    """Ray recycles the worker of a GPU task only when the function was registered with num_gpus (its max_calls=1
    default); fray gives GPUs per call (.options(num_gpus=...)), and the worker was reused: a process whose CUDA
    started seeing one device then ran a task given another, and computed on the first."""
    seen = [ctx.get(ctx.create_task(_pid_and_view, options=ONE_GPU), timeout=120) for _ in range(4)]
    streamed = [next(iter(ctx.create_task(_streamed_pid_and_view, options=STREAM_ONE_GPU))) for _ in range(2)]
    pids = [pid for pid, _ in seen] + [ctx.get(ref, timeout=120)[0] for ref in streamed]
    assert len(set(pids)) == len(pids), seen
    assert all(view in ("0", "1") for _, view in seen), seen


def test_work_holding_no_gpu_sees_none(ctx: RayJobContext) -> None:
    """Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for work given no GPU (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO off):
    such work saw every device of its node, so a CPU-only reader of a CUDA value got it on a GPU that other work
    holds, instead of on the CPU with a warning."""
    assert ctx.get(ctx.create_task(_pid_and_view), timeout=120)[1] == ""
    actor = ctx.create_actor(_Viewer)
    try:
        assert ctx.get(actor.view(), timeout=120) == ""
    finally:
        ctx.kill(actor)
    assert ctx.get(ctx.create_task(_pid_and_view, options=ONE_GPU), timeout=120)[1] in ("0", "1")


class _Viewer:
    def view(self) -> str | None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
