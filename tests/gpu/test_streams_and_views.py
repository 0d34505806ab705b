"""CUDA streams and device views on a real GPU (skipped elsewhere, saying why: tests/gpu/conftest.py). The CPU
half of each is tested without a GPU: tests/ray/test_ray_gpus.py (the order a member's view and its arguments are
set in), tests/unit/test_gpus.py (UUIDs, device order), tests/unit/test_cuda_kept_table.py (the kept table's lock)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from fray import ActorOptions, TaskOptions
from fray.context import JobContext
from fray.testing import gpu_workloads as w

ON_GPU = TaskOptions(resources={"CPU": 0.5, "GPU": 0.5})
SLEEP_CYCLES = 200_000_000  # ~0.1 s of device time on an H100/H200 (torch.cuda._sleep spins that many cycles)
N = 1 << 28  # 1 GiB of float32: a device copy long enough (~0.5 ms) for a reader on another stream to overtake it


def _torch() -> Any:
    import torch

    return torch


def test_a_value_written_on_a_side_stream_is_sent_once_that_stream_is_done(gpu_backend_ctx: JobContext) -> None:
    """Before the fix the dump copied it on the current stream while the side stream still wrote: a snapshot of
    zeros (put), or of a half-written tensor (a task's result)."""
    torch = _torch()
    t = torch.zeros(1 << 22, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        t.fill_(7.0)
    ref = gpu_backend_ctx.put(t)  # the side stream still sleeps
    side.synchronize()
    assert float(gpu_backend_ctx.get(ref, timeout=120).double().sum().item()) == 7.0 * (1 << 22)
    made = gpu_backend_ctx.create_task(w.made_on_side_stream, args=(1 << 22, 3.0, SLEEP_CYCLES), options=ON_GPU)
    assert float(gpu_backend_ctx.get(made, timeout=120).double().sum().item()) == 3.0 * (1 << 22)


def _in_memory_only(ctx: JobContext) -> None:
    if ctx.backend != "in_memory":
        pytest.skip("the kept (same-process) path is in_memory's; other backends stage through the host")


def test_a_kept_copy_read_on_another_stream_waits_for_it(gpu_backend_ctx: JobContext) -> None:
    """The reader's copy (on its own stream) could run before the dump's copy (on the writer's) was done."""
    _in_memory_only(gpu_backend_ctx)
    torch = _torch()
    t = torch.full((N,), 5.0, device="cuda")
    other = torch.cuda.Stream()
    for _ in range(3):
        ref = gpu_backend_ctx.put(t)
        with torch.cuda.stream(other):
            got = gpu_backend_ctx.get(ref, timeout=120)
        other.synchronize()
        assert float(got.double().sum().item()) == 5.0 * N
        del got, ref
    torch.cuda.empty_cache()


def test_a_kept_copy_freed_while_another_stream_reads_it_is_not_reused_first(gpu_backend_ctx: JobContext) -> None:
    """Without record_stream the kept memory went back to the allocator when the value was freed, while the
    reader's copy still waited on its stream; a tensor made next on the writer's stream took it and the reader
    copied that tensor's bytes."""
    _in_memory_only(gpu_backend_ctx)
    torch = _torch()
    t = torch.full((N,), 5.0, device="cuda")
    other = torch.cuda.Stream()
    ref = gpu_backend_ctx.put(t)
    with torch.cuda.stream(other):
        torch.cuda._sleep(SLEEP_CYCLES)  # the reader's copy is queued behind this
        got = gpu_backend_ctx.get(ref, timeout=120)
    del ref
    gc.collect()  # the value and its kept copy are freed now, the reader's copy still queued
    overwrite = torch.full((N,), 9.0, device="cuda")  # same size, on the writer's stream: its block if free
    other.synchronize()
    assert float(got.double().sum().item()) == 5.0 * N
    del overwrite, got
    torch.cuda.empty_cache()


def test_an_spmd_member_given_a_cuda_tensor_sets_its_local_rank_device(gpu_backend_ctx: JobContext) -> None:
    """Ray: the argument's CUDA started before the member saw its group's devices (only its own), so
    set_device(LOCAL_RANK) failed for rank 1 ("invalid device ordinal")."""
    torch = _torch()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs (one per member); this machine has {torch.cuda.device_count()}")
    t = torch.ones(1024, device="cuda")
    opts = ActorOptions(resources={"CPU": 0.5, "GPU": 1})
    group = gpu_backend_ctx.create_actor_group(w.CudaMember, 2, args=(t,), options=opts, distributed=True)
    try:
        seen = gpu_backend_ctx.get(group.where(), timeout=180)
        for visible, local_rank, total, mine in seen:
            assert total == 1024.0 and visible is not None, seen
            assert visible.split(",")[local_rank] == str(mine[0]), seen  # LOCAL_RANK's device is its own
    finally:
        gpu_backend_ctx.kill(group)
