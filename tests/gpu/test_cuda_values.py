"""CUDA tensors through fray on every backend: they arrive on a GPU, never through torch's pickle, as
snapshots no reader can change for another; the path is reported; device memory comes back (issue 27)."""

from __future__ import annotations

from typing import Any

import pytest

from fray import ActorOptions, TaskOptions
from fray.context import JobContext
from fray.testing import gpu_workloads as w

ON_GPU = TaskOptions(resources={"CPU": 0.5, "GPU": 0.5})
CUDA_PATHS = {"cuda-device-copy", "cuda-staged", "cuda-ipc", "cuda-ipc-staged"}


def _torch() -> Any:
    import torch

    return torch


def test_a_put_cuda_tensor_comes_back_on_a_gpu_as_a_snapshot(gpu_backend_ctx: JobContext) -> None:
    torch = _torch()
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    ref = gpu_backend_ctx.put(t)
    t.zero_()  # a value sent stays a snapshot
    got = gpu_backend_ctx.get(ref, timeout=120)
    assert got.device.type == "cuda" and got.device.index == t.device.index
    assert float(got.double().sum().item()) == float(sum(range(1 << 20)))
    got.zero_()  # a reader's writes reach no other reader
    assert float(gpu_backend_ctx.get(ref, timeout=120).double().sum().item()) == float(sum(range(1 << 20)))
    stats = gpu_backend_ctx.transfer_stats()
    assert CUDA_PATHS & set(stats), stats


def test_structures_views_dtypes_and_parameters_keep_what_they_are(gpu_backend_ctx: JobContext) -> None:
    torch = _torch()
    base = torch.arange(16, dtype=torch.bfloat16, device="cuda")
    state = {f"layer{i}.weight": torch.randn(64, 64, device="cuda") for i in range(8)}
    param = torch.nn.Parameter(torch.ones(4, device="cuda"), requires_grad=True)
    value = {"state": state, "views": (base[:8], base[8:]), "param": param}
    got = gpu_backend_ctx.get(gpu_backend_ctx.put(value), timeout=120)
    assert all(torch.equal(got["state"][k], state[k]) for k in state)
    a, b = got["views"]
    assert a.dtype == torch.bfloat16 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
    assert got["param"].device.type == "cuda"


def test_a_task_gets_a_cuda_argument_and_returns_a_cuda_result(gpu_backend_ctx: JobContext) -> None:
    torch = _torch()
    arg = torch.ones(1 << 18, device="cuda")
    assert gpu_backend_ctx.get(gpu_backend_ctx.create_task(w.describe, args=(arg,), options=ON_GPU), timeout=120) == (
        "cuda",
        float(1 << 18),
        1 << 18,
    )
    made = gpu_backend_ctx.get(gpu_backend_ctx.create_task(w.make_on_gpu, args=(1000, 2.0), options=ON_GPU), 120)
    assert made.device.type == "cuda" and float(made.double().sum().item()) == 2000.0


def test_actor_to_actor_and_into_the_callers_own_buffers(gpu_backend_ctx: JobContext) -> None:
    torch = _torch()
    opts = ActorOptions(resources={"GPU": 0.25})
    a, b = gpu_backend_ctx.create_actor(w.Holder, options=opts), gpu_backend_ctx.create_actor(w.Holder, options=opts)
    try:
        assert gpu_backend_ctx.get(b.keep(a.make(4096)), timeout=120) == ("cuda", 4096.0)
        out = torch.zeros(4096, device="cuda")
        assert gpu_backend_ctx.get(a.make(4096), timeout=120, out=out) is out
        assert float(out.double().sum().item()) == 4096.0
    finally:
        gpu_backend_ctx.kill(a)
        gpu_backend_ctx.kill(b)


def test_a_get_into_the_callers_tensors_makes_no_copy_of_its_own_on_the_way(gpu_backend_ctx: JobContext) -> None:
    """put -> get(out=) and a task's result -> get(out=): the value goes straight into the caller's tensors, by
    whichever path it came (`*-out`: no temporary copy on the device first), and no device memory is left held."""
    torch = _torch()
    value = {"w": torch.arange(1 << 20, dtype=torch.float32, device="cuda"), "b": torch.ones(7, device="cuda")}
    out = {"w": torch.zeros(1 << 20, device="cuda"), "b": torch.zeros(7, device="cuda")}
    ref = gpu_backend_ctx.put(value)
    made = gpu_backend_ctx.create_task(w.make_on_gpu, args=(1 << 20, 3.0), options=ON_GPU)
    gpu_backend_ctx.wait([made], timeout=120)
    before = gpu_backend_ctx.transfer_stats()
    assert gpu_backend_ctx.get(ref, timeout=120, out=out) is out
    assert torch.equal(out["w"], value["w"]) and torch.equal(out["b"], value["b"])
    into = torch.zeros(1 << 20, device="cuda")
    assert gpu_backend_ctx.get(made, timeout=120, out=into) is into
    assert float(into.double().sum().item()) == 3.0 * (1 << 20)
    paths = {p for p, n in gpu_backend_ctx.transfer_stats().items() if p not in before or n != before[p]}
    assert paths & {"cuda-device-copy-out", "cuda-staged-out", "cuda-ipc-out"}, paths
    assert not paths & CUDA_PATHS, f"a copy was made before the one into out: {paths}"


def test_device_memory_comes_back_after_a_loop(gpu_backend_ctx: JobContext) -> None:
    torch = _torch()
    t = torch.ones(1 << 22, device="cuda")
    for _ in range(3):  # warm-up: caches, pinned buffers, worker processes
        gpu_backend_ctx.get(gpu_backend_ctx.create_task(w.describe, args=(t,), options=ON_GPU), timeout=120)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(100):
        ref = gpu_backend_ctx.put(t)
        gpu_backend_ctx.get(gpu_backend_ctx.create_task(w.describe, args=(ref,), options=ON_GPU), timeout=120)
        del ref
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    assert after <= before * 1.01 + (1 << 20), (before, after)


def test_work_asking_for_a_gpu_runs_on_its_device(gpu_backend_ctx: JobContext) -> None:
    seen = gpu_backend_ctx.get(
        gpu_backend_ctx.create_task(w.assigned, options=TaskOptions(resources={"GPU": 1})), timeout=120
    )
    assert len(seen["gpus"]) == 1 and seen["count"] >= 1
    if gpu_backend_ctx.backend != "in_memory":  # a process started for it sees its device, as cuda:0
        assert seen["visible"] is not None and seen["current"] == 0
    with pytest.raises(Exception, match="GPU"):
        gpu_backend_ctx.create_task(w.assigned, options=TaskOptions(resources={"GPU": 64}))
