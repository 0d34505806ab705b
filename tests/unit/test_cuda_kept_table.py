"""fray.runtime.cuda_values without a GPU: the kept table's bookkeeping (the CUDA paths themselves: tests/gpu)."""

from __future__ import annotations

import gc
import threading

from fray.runtime import cuda_values
from fray.runtime.cuda_values import KeptToken


class _Cycle:
    """Freed only by the cyclic garbage collector, with the KeptToken it holds."""

    def __init__(self, token: KeptToken) -> None:
        self.token = token
        self.me = self


def test_a_kept_token_freed_by_a_collection_inside_the_locked_section_does_not_deadlock() -> None:
    """A garbage collection can start at any allocation, also one made while this thread holds the kept table's
    lock; a KeptToken it frees takes that lock again. Before the fix (a plain Lock) this thread hung for good."""
    token = 10**9 + 7
    cuda_values._kept[token] = (object(), None)
    _Cycle(KeptToken(token))  # unreachable now, but alive until a collection
    done = threading.Event()

    def collect_while_holding_the_lock() -> None:
        with cuda_values._kept_lock:
            gc.collect()  # (what an allocation inside the section may do)
        done.set()

    gc.disable()  # only the collection under the lock may free it
    try:
        worker = threading.Thread(target=collect_while_holding_the_lock, daemon=True)
        worker.start()
        assert done.wait(10), "KeptToken.__del__ deadlocked on the kept table's lock held by its own thread"
    finally:
        gc.enable()
    assert token not in cuda_values._kept
