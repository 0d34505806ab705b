"""What a Ray worker sees of the GPUs, on GPUs the test spec declares (num_gpus=2: Ray assigns ids as on a GPU
node, and sets CUDA_VISIBLE_DEVICES as it would there). CUDA reads CUDA_VISIBLE_DEVICES once, at its start in a
process, so what matters is the view each process has before anything of the work runs."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
import ray

from fray import ActorOptions, TaskOptions
from fray.errors import UnsupportedFeatureError
from fray.registry import job_context_from
from fray.runtime.capabilities import Capability
from fray_ray import RayBackend, RayJobContext

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


class ViewWhenUnpickled:
    """A constructor argument that records the process's CUDA_VISIBLE_DEVICES when it is unpickled (where a CUDA
    tensor's storage is made, and CUDA starts with the view of that moment)."""

    def __init__(self, view: str | None = None) -> None:
        self.view = view

    def __reduce__(self) -> tuple[Any, ...]:
        return (_view_now, ())


def _view_now() -> ViewWhenUnpickled:
    return ViewWhenUnpickled(os.environ.get("CUDA_VISIBLE_DEVICES"))


class _Member:
    def __init__(self, arg: ViewWhenUnpickled, kwarg: ViewWhenUnpickled | None = None) -> None:
        self.at_unpickling = (arg.view, kwarg.view if kwarg is not None else None)

    def views(self) -> tuple[tuple[str | None, str | None], str | None, int]:
        return self.at_unpickling, os.environ.get("CUDA_VISIBLE_DEVICES"), int(os.environ["LOCAL_RANK"])


def test_an_spmd_members_arguments_are_unpickled_after_its_group_view_is_set(ctx: RayJobContext) -> None:
    """A member's constructor arguments holding a CUDA tensor start CUDA where they are unpickled: before the fix
    that was before the member widened its view to its group's devices, so CUDA saw only its own device and
    `torch.cuda.set_device(LOCAL_RANK)` failed for rank 1 (the CUDA half of this: tests/gpu)."""
    pickle.dumps(ViewWhenUnpickled())  # (it pickles)
    opts = ActorOptions(resources={"CPU": 0.5, "GPU": 1})
    group = ctx.create_actor_group(
        _Member, 2, args=(ViewWhenUnpickled(),), kwargs={"kwarg": ViewWhenUnpickled()}, options=opts, distributed=True
    )
    try:
        views = ctx.get(group.views(), timeout=180)
        for (arg_view, kwarg_view), view, local_rank in views:
            assert view is not None and len(view.split(",")) == 2, views
            assert arg_view == view and kwarg_view == view, views
            assert 0 <= local_rank < 2
    finally:
        ctx.kill(group)


def test_gpu_view_host_is_refused_by_name_before_ray_starts() -> None:
    was_up = ray.is_initialized()
    with pytest.raises(UnsupportedFeatureError, match="gpu_host_view") as refused:
        job_context_from(RayBackend(), {"gpu_view": "host", "num_cpus": "1"})
    assert refused.value.capability is Capability.GPU_HOST_VIEW
    assert ray.is_initialized() == was_up  # (refused before connecting)
    with pytest.raises(ValueError, match=r"'held'.*'host'"):
        job_context_from(RayBackend(), {"gpu_view": "all"})
