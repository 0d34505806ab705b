"""put/get: copies at put time, refs as arguments, large arrays, zero-copy where declared."""

from __future__ import annotations

import pytest

from fray.context import JobContext
from fray.testing import requires_capability
from fray.testing import workloads as h

np = pytest.importorskip("numpy", reason="numpy is needed for the array tests")


def test_put_get_round_trip(fray_ctx: JobContext) -> None:
    value = {"a": [1, 2, 3], "b": ("x", None)}
    assert fray_ctx.get(fray_ctx.put(value), timeout=60) == value
    assert fray_ctx.get([fray_ctx.put(1), fray_ctx.put("two")], timeout=60) == [1, "two"]


def test_put_is_a_copy(fray_ctx: JobContext) -> None:
    items = [1, 2, 3]
    ref = fray_ctx.put(items)
    items.append(4)
    assert fray_ctx.get(ref, timeout=60) == [1, 2, 3]
    array = np.arange(10)
    array_ref = fray_ctx.put(array)
    array[:] = -1
    assert fray_ctx.get(array_ref, timeout=60).tolist() == list(range(10))


def test_put_ref_as_task_argument(fray_ctx: JobContext) -> None:
    ref = fray_ctx.put(np.ones(1000))
    assert fray_ctx.get(fray_ctx.create_task(h.array_sum, args=(ref,)), timeout=60) == 1000.0
    is_ref, value = fray_ctx.get(fray_ctx.create_task(h.first_is_ref_then_value, args=([ref],)), timeout=60)
    assert is_ref is True and value.sum() == 1000.0


def test_large_array_round_trip(fray_ctx: JobContext) -> None:
    array = np.random.default_rng(0).random(2_000_000)  # 16 MB
    ref = fray_ctx.put(array)
    assert np.array_equal(fray_ctx.get(ref, timeout=120), array)
    returned = fray_ctx.get(fray_ctx.create_task(h.identity, args=(ref,)), timeout=120)
    assert np.array_equal(returned, array)


def test_put_of_a_ref_is_refused(fray_ctx: JobContext) -> None:
    with pytest.raises(TypeError):
        fray_ctx.put(fray_ctx.put(1))


@requires_capability("zero_copy_objects")
def test_get_of_numpy_is_zero_copy_and_read_only(fray_ctx: JobContext) -> None:
    ref = fray_ctx.put(np.zeros(1_000_000))
    first, second = fray_ctx.get(ref, timeout=60), fray_ctx.get(ref, timeout=60)
    assert np.shares_memory(first, second)
    assert not first.flags.writeable  # readers must not be able to change each other's view
