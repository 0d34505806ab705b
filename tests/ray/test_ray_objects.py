"""Values through fray-ray on real Ray (no mocks): torch tensors out of band, numpy read-only, nested refs on
Ray's own path, argument refs not pinned, transfer stats."""

from __future__ import annotations

import gc
from typing import Any

import pytest

pytest.importorskip("fray_ray")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import ray  # noqa: E402

from fray.runtime.refs import ObjectRef  # noqa: E402
from fray_ray import RayJobContext  # noqa: E402
from fray_ray._values import Packed, pack  # noqa: E402


def awkward_tensor() -> Any:
    """bfloat16, a transposed strided view into a larger storage (non-zero offset), requires_grad."""
    base = torch.randn(64, 300, dtype=torch.bfloat16)
    return base[1:, 2::3].t().requires_grad_(True)


def describe(t: Any) -> tuple[Any, ...]:
    return (t.dtype, tuple(t.shape), t.stride(), t.requires_grad, type(t).__name__)


def same(a: Any, b: Any) -> bool:
    return describe(a) == describe(b) and torch.equal(a.detach(), b.detach())


def identity(x: Any) -> Any:
    return x


def remote_describe(x: Any) -> tuple[Any, ...]:
    return describe(x)


def add_one_in_place(t: Any) -> float:
    t.add_(1)  # the task's argument is its own copy: writable, and nobody else sees the write
    return float(t.sum())


class Holder:
    def __init__(self) -> None:
        self.value: Any = None

    def keep(self, value: Any) -> tuple[Any, ...]:
        self.value = value
        return describe(value)

    def give(self) -> Any:
        return self.value

    async def give_async(self) -> Any:
        return self.value

    def pair(self) -> Any:
        return (self.value, self.value[1:])


def test_tensors_travel_packed_and_plain_values_do_not() -> None:
    assert isinstance(pack(awkward_tensor()), Packed)
    assert isinstance(pack([1, awkward_tensor()]), Packed)
    assert isinstance(pack({"w": awkward_tensor()}), Packed)
    for plain in (1, "x", [1, 2], np.zeros(3), {"a": np.zeros(3)}):
        assert pack(plain) is plain


def test_tensor_round_trips_through_put_and_get(ctx: RayJobContext) -> None:
    t = awkward_tensor()
    assert not t.is_contiguous() and t.storage_offset() > 0
    got = ctx.get(ctx.put(t), timeout=60)
    assert same(got, t)
    assert got.storage_offset() == t.storage_offset()
    param = torch.nn.Parameter(torch.randn(5, 4))
    got_param = ctx.get(ctx.put(param), timeout=60)
    assert type(got_param) is torch.nn.Parameter and same(got_param, param)


def test_tensor_as_task_argument_and_result(ctx: RayJobContext) -> None:
    t = awkward_tensor()
    assert ctx.get(ctx.create_task(remote_describe, args=(t,)), timeout=60) == describe(t)
    assert ctx.get(ctx.create_task(remote_describe, kwargs={"x": t}), timeout=60) == describe(t)
    assert same(ctx.get(ctx.create_task(identity, args=(t,)), timeout=60), t)
    ref = ctx.put(t)
    assert ctx.get(ctx.create_task(remote_describe, args=(ref,)), timeout=60) == describe(t)
    back = ctx.get(ctx.create_task(identity, args=([t, {"k": t}],)), timeout=60)
    assert same(back[0], t) and same(back[1]["k"], t)


def test_tensor_as_actor_argument_and_result(ctx: RayJobContext) -> None:
    t = awkward_tensor()
    holder = ctx.create_actor(Holder)
    assert ctx.get(holder.keep(t), timeout=60) == describe(t)
    assert same(ctx.get(holder.give(), timeout=60), t)
    assert same(ctx.get(holder.give_async(), timeout=60), t)
    plain = awkward_tensor().detach()  # views of a requires_grad tensor are not leaves (torch will not pickle)
    ctx.get(holder.keep(plain), timeout=60)
    whole, tail = ctx.get(holder.pair(), timeout=60)
    assert same(whole, plain) and same(tail, plain[1:])
    # views of one storage stay views of one storage after the trip
    assert whole.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()
    ctx.kill(holder)


def test_writes_by_one_reader_are_not_seen_by_another(ctx: RayJobContext) -> None:
    t = torch.arange(100_000, dtype=torch.float32)
    ref = ctx.put(t)
    first = ctx.get(ref, timeout=60)
    first.mul_(-1)  # writable, and private to this reader
    assert torch.equal(ctx.get(ref, timeout=60), t)
    # a task writing into its argument changes neither the stored object nor the caller's tensor
    assert ctx.get(ctx.create_task(add_one_in_place, args=(ref,)), timeout=60) == float((t + 1).sum())
    assert torch.equal(ctx.get(ref, timeout=60), t)
    assert torch.equal(t, torch.arange(100_000, dtype=torch.float32))


def test_tensor_changed_after_put_does_not_change_the_stored_value(ctx: RayJobContext) -> None:
    t = torch.ones(50_000)
    ref = ctx.put(t)
    t.zero_()
    assert torch.equal(ctx.get(ref, timeout=60), torch.ones(50_000))


def test_numpy_from_get_stays_read_only(ctx: RayJobContext) -> None:
    arr = np.arange(500_000, dtype=np.float64)
    got = ctx.get(ctx.put(arr), timeout=60)
    assert not got.flags.writeable and np.array_equal(got, arr)
    with pytest.raises(ValueError):
        got[0] = 1.0
    # numpy travelling beside a tensor (packed) is read-only too
    mixed = ctx.get(ctx.put([torch.ones(3), arr]), timeout=60)
    assert not mixed[1].flags.writeable and np.array_equal(mixed[1], arr)


def test_values_with_nested_refs_keep_rays_path(ctx: RayJobContext) -> None:
    inner = ctx.put(123)
    t = torch.arange(10)
    for value in ([t, inner], {"t": t, "ref": inner}, [t, [inner]], [t, {"deep": [inner]}], [t, inner.payload]):
        assert pack(value) is value  # not packed: Ray must see the ref while it serializes
    got = ctx.get(ctx.put([t, inner]), timeout=60)
    assert torch.equal(got[0], t) and type(got[1]) is ObjectRef and ctx.get(got[1], timeout=60) == 123
    deep = ctx.get(ctx.create_task(identity, args=([t, [inner]],)), timeout=60)
    assert torch.equal(deep[0], t) and ctx.get(deep[1][0], timeout=60) == 123
    raw = ctx.get(ctx.put([t, inner.payload]), timeout=60)
    assert ray.get(raw[1], timeout=60) == 123


def test_put_refs_passed_to_tasks_are_not_pinned(ctx: RayJobContext) -> None:
    arr = np.zeros(200_000)
    results = [ctx.create_task(remote_describe_np, args=(ctx.put(arr),)) for _ in range(5)]
    assert ctx.get(results, timeout=60) == [arr.shape] * 5
    assert len(ctx._cancels.deps) == 0  # puts are ready at once: fray keeps no ref to them


def remote_describe_np(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def slow_zeros(n: int) -> Any:
    return np.zeros(n)


def test_pending_argument_is_released_with_the_tasks_ref(ctx: RayJobContext) -> None:
    upstream = ctx.create_task(slow_zeros, args=(200_000,))
    downstream = ctx.create_task(remote_describe_np, args=(upstream,))
    assert downstream in ctx._cancels.deps  # kept for cancel: the argument may be pending
    assert ctx.get(downstream, timeout=60) == (200_000,)
    del downstream
    gc.collect()
    assert not any(upstream.payload in deps for deps in ctx._cancels.deps.values())


def test_transfer_stats_count_gets(ctx: RayJobContext) -> None:
    before = ctx.transfer_stats().get("ray-object-store")
    arr = np.ones(100_000)
    t = torch.ones(50_000)
    ctx.get([ctx.put(arr), ctx.put(t)], timeout=60)
    after = ctx.transfer_stats()["ray-object-store"]
    count0, bytes0 = (before.count, before.bytes) if before else (0, 0)
    assert after.count == count0 + 2
    assert after.bytes - bytes0 >= arr.nbytes + t.nbytes
    assert after.seconds > 0
