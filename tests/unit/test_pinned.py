"""Pinned staging memory (fray.runtime.pinned) with a pinning that records its calls in place of CUDA's: regions of
the value's own size, reused while recently used, given back past the spare bound or when idle, and never given
back while a view of them lives."""

from __future__ import annotations

import gc

import pytest

from fray.runtime.pinned import PinnedPool
from fray.runtime.pool import PAGE


class RecordedPinning:
    def __init__(self, fail: bool = False) -> None:
        self.pinned: dict[int, int] = {}  # address -> bytes, while pinned
        self.calls = 0
        self.fail = fail

    def pin(self, address: int, nbytes: int) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("cudaHostRegister failed (recorded)")
        assert address not in self.pinned
        self.pinned[address] = nbytes

    def unpin(self, address: int) -> None:
        del self.pinned[address]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_region_has_the_values_size_rounded_to_the_page_not_the_next_power_of_two() -> None:
    pinning = RecordedPinning()
    pool = PinnedPool(pinning, keep_bytes=1 << 30)
    nbytes = 300 * PAGE + 1
    view = pool.take(nbytes)
    assert view.nbytes == nbytes and not view.readonly
    assert list(pinning.pinned.values()) == [301 * PAGE] and pool.pinned_bytes() == 301 * PAGE
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd"


def test_a_region_comes_back_as_a_spare_and_serves_the_next_value_of_its_size() -> None:
    pinning = RecordedPinning()
    pool = PinnedPool(pinning, keep_bytes=1 << 30)
    view = pool.take(5 * PAGE)
    address = next(iter(pinning.pinned))
    del view
    gc.collect()
    assert pool.spare_bytes() == 5 * PAGE
    again = pool.take(5 * PAGE - 10)
    assert pinning.calls == 1 and list(pinning.pinned) == [address] and pool.spare_bytes() == 0
    other = pool.take(2 * PAGE)  # another size: a region of its own
    assert pinning.calls == 2 and pool.pinned_bytes() == 7 * PAGE
    del again, other


def test_spares_past_the_bound_are_given_back_at_once() -> None:
    pinning = RecordedPinning()
    pool = PinnedPool(pinning, keep_bytes=4 * PAGE)
    small, big = pool.take(3 * PAGE), pool.take(8 * PAGE)
    del big  # more than the bound alone: given back
    gc.collect()
    assert pool.spare_bytes() == 0 and list(pinning.pinned.values()) == [3 * PAGE]
    del small
    gc.collect()
    assert pool.spare_bytes() == 3 * PAGE and pool.pinned_bytes() == 3 * PAGE
    pool.release_spares()
    assert pinning.pinned == {} and pool.pinned_bytes() == 0


def test_a_spare_unused_for_the_idle_time_is_given_back_when_the_pool_is_next_used() -> None:
    pinning, clock = RecordedPinning(), Clock()
    pool = PinnedPool(pinning, keep_bytes=1 << 30, idle_seconds=60.0, clock=clock)
    pool.take(6 * PAGE)  # (dropped at once)
    gc.collect()
    assert pool.spare_bytes() == 6 * PAGE
    clock.now += 59.0
    kept = pool.take(PAGE)
    assert pool.spare_bytes() == 6 * PAGE, "a spare used 59 s ago is kept"
    clock.now += 1.0
    del kept
    gc.collect()
    assert pool.spare_bytes() == PAGE and list(pinning.pinned.values()) == [PAGE]


def test_a_region_is_not_given_back_while_a_tensor_or_a_pickle_buffer_still_reads_it() -> None:
    torch = pytest.importorskip("torch")
    import pickle

    pinning = RecordedPinning()
    pool = PinnedPool(pinning, keep_bytes=0)  # (no spares: a region comes back only to be given back)
    view = pool.take(2 * PAGE)
    tensor = torch.frombuffer(view, dtype=torch.uint8)
    buffer = pickle.PickleBuffer(view)
    del view
    gc.collect()
    tensor.fill_(9)
    assert len(pinning.pinned) == 1, "given back while a tensor of it lives"
    del tensor
    gc.collect()
    assert len(pinning.pinned) == 1, "given back while a pickle buffer of it lives"
    assert bytes(buffer.raw()[:2]) == b"\x09\x09"
    del buffer
    gc.collect()
    assert pinning.pinned == {} and pool.pinned_bytes() == 0


def test_a_region_the_driver_refuses_to_pin_is_unmapped_and_the_error_raised() -> None:
    pinning = RecordedPinning(fail=True)
    pool = PinnedPool(pinning, keep_bytes=1 << 30)
    with pytest.raises(RuntimeError, match="cudaHostRegister failed"):
        pool.take(PAGE)
    assert pool.pinned_bytes() == 0 and pool.spare_bytes() == 0
