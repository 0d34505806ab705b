"""Staging a CUDA tensor through host memory pins a region of the value's own size (fray.runtime.pinned, registered
with cudaHostRegister), not torch's next power of two, reuses it for the next value of that size, and the bytes
staged are the tensor's."""

from __future__ import annotations

import gc

from fray.runtime import pinned
from fray.runtime.cuda_values import STAGED
from fray.runtime.pool import PAGE
from fray.runtime.serialization import dumps, loads


def test_a_staged_tensor_pins_its_own_size_and_the_next_one_reuses_it() -> None:
    import torch

    nbytes = 3 * (1 << 20) + 4 * 5  # not a power of two, nor a whole number of pages
    t = torch.arange(nbytes // 4, dtype=torch.float32, device="cuda")
    pool = pinned.cuda_pool()
    pool.release_spares()  # (the pool is the process's: tests before this one may have left spares of their sizes)
    in_use = pool.pinned_bytes()
    blob = dumps(t, device_mode=STAGED)
    rounded = -(-nbytes // PAGE) * PAGE
    assert pool.pinned_bytes() - in_use == rounded, (pool.pinned_bytes(), in_use, rounded)
    assert torch.equal(loads(blob).cpu(), t.cpu())
    del blob
    gc.collect()
    assert pool.spare_bytes() == rounded
    again = dumps(t * 2, device_mode=STAGED)
    assert pool.pinned_bytes() - in_use == rounded and pool.spare_bytes() == 0, "the spare served the same size again"
    assert torch.equal(loads(again).cpu(), (t * 2).cpu())
