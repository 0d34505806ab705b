"""The store in a loop (issue 21): a value is freed as soon as its last reference is gone (FREE_GRACE 0), so its
memory is reused by the next put. Reuse that early must never change a value somebody still refers to: refs in
flight to actors (top-level and inside a list), in an actor group's calls, and in an actor's reply (made there,
or arrived there and sent back: a worker's release of a ref that left in a reply is the one it delays)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import fray

MiB = 1 << 20


def fill(value: int) -> np.ndarray:
    return np.full(2 * MiB, value % 251, dtype=np.uint8)


def same(expected: int, array: np.ndarray) -> bool:
    return bool(array.min() == array.max() == expected % 251)


class Checker:
    def __init__(self) -> None:
        self.kept: list[tuple[int, list[fray.ObjectRef]]] = []

    def check(self, expected: int, array: np.ndarray) -> bool:
        return same(expected, array)

    def check_later(self, expected: int, refs: list[fray.ObjectRef]) -> bool:
        """Keeps a ref that arrived inside a list; read on a later call, after the driver dropped its own."""
        self.kept.append((expected, refs))
        if len(self.kept) < 3:
            return True
        old, old_refs = self.kept.pop(0)
        return same(old, fray.get_job_context().get(old_refs[0], timeout=60))

    def make(self, value: int) -> list[fray.ObjectRef]:
        return [fray.get_job_context().put(fill(value))]  # a ref made here, returned inside the reply

    def echo(self, refs: list[fray.ObjectRef]) -> list[fray.ObjectRef]:
        return refs  # a ref that arrived here, returned inside the reply: its release here must wait for the reply


@pytest.fixture(scope="module")
def ctx() -> Iterator[fray.JobContext]:
    context = fray.init("monarch?procs=2")
    try:
        yield context
    finally:
        fray.shutdown()


def test_values_freed_at_once_never_change_under_actors(ctx: fray.JobContext) -> None:
    checker = ctx.create_actor(Checker)
    group = ctx.create_actor_group(Checker, 2)
    for round_ in range(30):
        calls = [
            checker.check(round_, ctx.put(fill(round_))),  # the driver's ref is gone as soon as the call is sent
            checker.check_later(round_ + 1000, [ctx.put(fill(round_ + 1000))]),
            *group.check(round_ + 2000, ctx.put(fill(round_ + 2000))),
        ]
        made = ctx.get(checker.make(round_ + 3000), timeout=60)
        echoed = ctx.get(checker.echo([ctx.put(fill(round_ + 5000))]), timeout=60)
        churn = [ctx.put(fill(round_ + 4000)) for _ in range(3)]  # reuses whatever was freed meanwhile
        del churn
        assert same(round_ + 3000, ctx.get(made[0], timeout=60)), round_
        assert same(round_ + 5000, ctx.get(echoed[0], timeout=60)), round_
        assert ctx.get(calls, timeout=120) == [True] * 4, round_
    ctx.kill(group)
    ctx.kill(checker)


def test_a_put_loop_reuses_the_memory_of_the_previous_value(ctx: fray.JobContext) -> None:
    """Each value dropped before the next put: the driver's store ends with few chunks, not one per value (with a
    grace period the store grew a fresh chunk every few puts). Waits for each free, so no timing is assumed."""
    ctl = ctx.ctl  # type: ignore[attr-defined]
    arena = ctl.store.arena
    value = np.full(80 * MiB, 1, dtype=np.uint8)  # one chunk each (over the 64 MiB chunk size)
    chunks = []
    for _ in range(10):
        ref = ctx.put(value)
        aid = ctl.directory.entries[ref.payload.id].value.alloc
        del ref
        wait_until(lambda: aid not in arena.allocs)  # noqa: B023 (called at once)
        chunks.append(len(arena.chunks))
    assert chunks == chunks[:1] * 10, chunks


def wait_until(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the value was never freed"
        time.sleep(0.001)


def torch_full(n: int) -> object:
    import torch

    return torch.full((n,), 2.0, dtype=torch.float32)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_torch_result_is_mapped_without_populating_what_is_not_read(ctx: fray.JobContext) -> None:
    """The driver's copy-on-write mapping of a torch result faults pages in as they are touched: reading one element
    of 100 MiB does not bring 100 MiB into this process (it did when the private span was populated), and writing
    still copies only the page written, never into the owner's memory."""
    import torch  # (imported before measuring: the import alone adds ~150 MiB)

    ref = ctx.create_task(torch_full, args=(25 * MiB,))
    ctx.wait([ref], timeout=120)
    ctx.get(ctx.create_task(torch_full, args=(1024,)), timeout=60)  # a first torch value, off the measure
    before = _rss()
    tensor = ctx.get(ref, timeout=60)
    assert isinstance(tensor, torch.Tensor)
    assert float(tensor[0]) == 2.0 and float(tensor[-1]) == 2.0
    assert _rss() - before < 20 * MiB
    tensor[0] = -1.0  # private to this reader
    assert float(ctx.get(ref, timeout=60)[0]) == 2.0
    rest = tensor[1:]
    assert float(tensor[0]) == -1.0 and float(rest.min()) == float(rest.max()) == 2.0  # every page read
