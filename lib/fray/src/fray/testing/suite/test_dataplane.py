"""Large values on every backend: torch tensors keep what they are, readers cannot change each other's values,
and transfer_stats says which path the bytes took."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fray.context import JobContext
from fray.telemetry.transfers import PATH_NAME, PathStats
from fray.testing import workloads as h

np = pytest.importorskip("numpy", reason="numpy is needed for the array tests")
torch = pytest.importorskip("torch", reason="torch is needed for the tensor tests")


def _tensors() -> dict[str, Any]:
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    leaf = torch.ones(5, requires_grad=True)
    return {
        "base": base,
        "view": base.t()[1:5],  # non-contiguous, offset into the same storage as base
        "bf16": torch.linspace(-1, 1, 300_000, dtype=torch.bfloat16),
        "leaf": leaf,
        "param": torch.nn.Parameter(torch.zeros(3)),
        "empty": torch.empty(0, 4),
    }


def _check(out: dict[str, Any]) -> None:
    expected = _tensors()
    for key, want in expected.items():
        got = out[key]
        assert type(got) is type(want), key
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), key
        assert got.requires_grad == want.requires_grad, key
        assert torch.equal(got.detach(), want.detach()), key
    assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()


def test_torch_tensors_round_trip_everywhere(fray_ctx: JobContext) -> None:
    values = _tensors()
    _check(fray_ctx.get(fray_ctx.put(values), timeout=60))
    _check(fray_ctx.get(fray_ctx.create_task(h.identity, args=(values,)), timeout=60))
    _check(fray_ctx.get(fray_ctx.create_task(h.identity, args=(fray_ctx.put(values),)), timeout=60))
    actor = fray_ctx.create_actor(h.Store)
    fray_ctx.get(actor.set(values), timeout=60)
    _check(fray_ctx.get(actor.get(), timeout=60))


def test_a_reader_writing_its_tensor_changes_no_other_reader(fray_ctx: JobContext) -> None:
    big = torch.zeros(2_000_000)
    for ref in (fray_ctx.put(big), fray_ctx.create_task(h.identity, args=(big,))):
        first = fray_ctx.get(ref, timeout=60)
        first += 1.0
        assert fray_ctx.get(ref, timeout=60).sum().item() == 0.0
    assert big.sum().item() == 0.0


def test_large_bytes_and_memoryviews_round_trip(fray_ctx: JobContext) -> None:
    blob = bytes(range(256)) * 4096  # 1 MiB
    out = fray_ctx.get(fray_ctx.create_task(h.identity, args=([blob, bytearray(blob), {"k": blob}],)), timeout=60)
    assert out[0] == blob and type(out[1]) is bytearray and out[1] == blob and out[2]["k"] == blob
    view = fray_ctx.get(fray_ctx.put(memoryview(blob)), timeout=60)
    assert isinstance(view, memoryview) and view.readonly and view.tobytes() == blob


def test_numpy_results_are_read_only(fray_ctx: JobContext) -> None:
    array = fray_ctx.get(fray_ctx.create_task(h.identity, args=(np.arange(1_000_000),)), timeout=60)
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 1


def test_transfer_stats_count_reads_by_path(fray_ctx: JobContext) -> None:
    ref = fray_ctx.put(np.ones(1_000_000))
    assert fray_ctx.get(fray_ctx.create_task(h.array_sum, args=(ref,)), timeout=60) == 1_000_000.0
    fray_ctx.get(ref, timeout=60)
    stats = fray_ctx.transfer_stats()
    assert stats and all(PATH_NAME.fullmatch(path) for path in stats), (
        stats
    )  # (fray.telemetry.transfers.KNOWN_PATHS or its own)
    assert all(isinstance(s, PathStats) and s.count > 0 and s.seconds >= 0 for s in stats.values())
    assert sum(s.bytes for s in stats.values()) >= 8_000_000
    shown = str(stats).splitlines()  # printed: one line a path, sizes in units (not a raw dict of PathStats)
    assert len(shown) == len(stats) and "PathStats" not in str(stats), shown
    line_format = r"[a-z0-9.-]+: \d+ transfers?, \d+(\.\d)? (B|KiB|MiB|GiB) in \S+ s( \(\S+ GB/s\))?"
    for line in shown:
        assert re.fullmatch(line_format, line), line
