"""`ctx.get(ref, out=...)`: a value received into the caller's own tensors and arrays (a weight refresh)."""

from __future__ import annotations

import numpy as np
import pytest

from fray.context import JobContext
from fray.testing import workloads as h


def test_a_state_dict_is_received_into_the_callers_tensors(fray_ctx: JobContext) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    weights = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int64), "step": 7}
    ref = fray_ctx.put(weights)
    out = {"w": torch.zeros(3, 4), "b": np.zeros(5, dtype=np.int64), "step": 7}
    w, b = out["w"], out["b"]
    assert fray_ctx.get(ref, timeout=60, out=out) is out
    assert out["w"] is w and out["b"] is b, "received in place, into the same objects"
    assert torch.equal(w, weights["w"]) and np.array_equal(b, weights["b"])


def test_a_task_result_and_a_list_of_refs_are_received_in_place(fray_ctx: JobContext) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    refs = [fray_ctx.create_task(h.identity, args=([torch.full((4,), float(i))],)) for i in range(3)]
    out = [[torch.zeros(4)] for _ in range(3)]
    targets = [o[0] for o in out]
    fray_ctx.get(refs, timeout=60, out=out)
    assert [t.tolist() for t in targets] == [[float(i)] * 4 for i in range(3)]


def test_a_mismatched_out_is_refused_naming_where_and_nothing_is_written(fray_ctx: JobContext) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ref = fray_ctx.put({"a": torch.ones(2), "b": torch.ones(3)})
    out = {"a": torch.zeros(2), "b": torch.zeros(4)}
    with pytest.raises(ValueError, match=r"out\['b'\] is a torch.float32 tensor of shape \(4,\)"):
        fray_ctx.get(ref, timeout=60, out=out)
    assert out["a"].tolist() == [0.0, 0.0], "checked before anything was written"
    with pytest.raises(ValueError, match="missing 'b'; not in the value: none"):
        fray_ctx.get(ref, timeout=60, out={"a": torch.zeros(2)})
