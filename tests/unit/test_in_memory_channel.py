"""in_memory's child processes (SPMD members, runtime_env tasks) exchange values through shared memory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import fray
from fray import TaskOptions
from fray.errors import SerializationError
from fray.in_memory._channel import Channel, Serialized
from fray.runtime.serialization import dumps

MiB = 1024 * 1024


@pytest.fixture
def ends() -> Iterator[tuple[Channel, Channel]]:
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    yield left, right
    left.close()
    right.close()


def trip(sender: Channel, receiver: Channel, value: object, what: str = "a value") -> object:
    """Send on one end, receive on the other (a thread: the receiver answers the sender's request for room)."""
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(receiver.recv(what)))
    reader.start()
    try:
        sender.send(value, what)
    finally:
        reader.join(timeout=60)
    assert got, "nothing arrived"
    return got[0]


def test_large_buffers_land_in_the_receivers_pool_and_its_chunks_are_mapped_once(
    ends: tuple[Channel, Channel],
) -> None:
    left, right = ends
    first = np.arange(8 * MiB // 8, dtype=np.int64)
    got = trip(left, right, {"a": first, "small": b"x" * 100})
    assert isinstance(got, dict) and np.array_equal(got["a"], first) and got["small"] == b"x" * 100
    assert not got["a"].flags.writeable  # read-only, as a value from a store
    mapped = dict(left._peer)
    assert len(mapped) == 1 and set(right._shared) == set(mapped), "the receiver's chunk, mapped by the sender"
    second = trip(left, right, first + 1)  # the same chunk: no fd crosses again
    assert left._peer == mapped
    assert np.array_equal(got["a"], first), "a value already received changed when the next one arrived"
    assert np.array_equal(second, first + 1)  # type: ignore[arg-type]
    big = trip(left, right, np.zeros(200 * MiB // 8))  # larger than a chunk: a new one, its fd sent along
    assert big.shape == (200 * MiB // 8,) and len(left._peer) == 2  # type: ignore[attr-defined]
    back = trip(right, left, first * 3)  # the other way: into the other end's pool
    assert np.array_equal(back, first * 3) and len(right._peer) == 1  # type: ignore[arg-type]


def test_a_torch_tensor_arrives_writable_and_private(ends: tuple[Channel, Channel]) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional dependency of fray-core")
    left, right = ends
    tensor = torch.arange(4 * MiB // 4, dtype=torch.float32)
    whole, view = trip(left, right, [tensor, tensor[10:20]], "tensors")  # type: ignore[misc]
    whole[10] = -1.0
    assert float(view[0]) == -1.0, "a view and its base share one storage after the trip"
    assert float(tensor[10]) == 10.0, "the receiver's writes reach the sender's tensor"
    trip(left, right, tensor * 2, "tensors")
    assert float(whole[11]) == 11.0, "the next message changed a tensor already received"


def call_trip(
    sender: Channel, receiver: Channel, message: tuple[object, tuple[object, ...], dict[str, object]]
) -> list[object]:
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(receiver.recv_call("a call")))
    reader.start()
    try:
        sender.send_call(message, "a call")  # type: ignore[arg-type]
    finally:
        reader.join(timeout=60)
    assert got, "nothing arrived"
    return got


def test_a_stored_value_is_lent_copy_on_write_and_returned_once_the_receiver_drops_it(
    ends: tuple[Channel, Channel],
) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional dependency of fray-core")
    left, right = ends
    tensor = torch.arange(4 * MiB // 4, dtype=torch.float32)
    stored = dumps(tensor)  # as in_memory stores a value: its buffer copied once, into this process's pool
    array = dumps(np.arange(2 * MiB // 8, dtype=np.int64))
    [(method, args, kwargs)] = call_trip(
        left, right, ("train", (1, Serialized(stored)), {"batch": Serialized(array), "note": "x"})
    )
    assert method == "train" and args[0] == 1 and kwargs["note"] == "x"  # type: ignore[index]
    got, batch = args[1], kwargs["batch"]  # type: ignore[index]
    assert float(got[7]) == 7.0 and np.array_equal(batch, np.arange(2 * MiB // 8))
    assert not right._peer_maps and len(right._peer) == 1, "lent: nothing was copied into the receiver's pool"
    assert len(left._lent) == 2, "the sender keeps both pieces leased while the receiver maps them"
    got[7] = -1.0  # copy-on-write: the receiver's own page
    assert float(torch.frombuffer(bytearray(stored.buffers[0]), dtype=torch.float32)[7]) == 7.0, (
        "the stored value changed"
    )
    assert not batch.flags.writeable  # not a torch storage: read-only, as any stored value
    del got, batch, args, kwargs
    trip(right, left, "done")  # the receiver's next message says what it dropped
    assert not left._lent, "the pieces the receiver dropped are still leased"


def test_a_value_that_is_not_stored_is_copied_even_from_the_senders_pool(ends: tuple[Channel, Channel]) -> None:
    """Only a store's values are lent (nobody writes them): memory its owner may still write is sent as a copy."""
    from fray.runtime.pool import pool_piece

    left, right = ends
    piece = pool_piece(2 * MiB)  # writable memory of the sender's pool, as a reader's private copy may be
    mine = np.frombuffer(piece.view, dtype=np.int64)
    mine[:] = 7
    [(_, args, _)] = call_trip(left, right, ("f", (mine,), {}))
    mine[:] = 8  # the owner writes it after the call
    assert not left._lent and int(args[0][0]) == 7, "the receiver saw the sender's later write"  # type: ignore[index]


def test_an_unpicklable_value_fails_before_anything_is_sent(ends: tuple[Channel, Channel]) -> None:
    left, right = ends
    with pytest.raises(SerializationError, match="a lock"):
        left.send(__import__("threading").Lock(), "a lock")
    assert trip(left, right, np.ones(2 * MiB), "next").sum() == 2 * MiB  # type: ignore[attr-defined]


def test_a_closed_peer_is_end_of_file(ends: tuple[Channel, Channel]) -> None:
    left, right = ends
    left.close()
    with pytest.raises(EOFError):
        right.recv("a value")


class Member:
    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.pid = os.getpid()

    def double(self, array: np.ndarray) -> tuple[int, np.ndarray]:
        return self.pid, array * 2

    def tensor(self, n: int) -> object:
        import torch

        return torch.ones(n)

    def lock(self) -> object:
        return __import__("threading").Lock()

    def scribble(self, tensor: object) -> float:
        tensor[0] = -5.0  # type: ignore[index]
        return float(tensor.sum())  # type: ignore[attr-defined]


def test_spmd_members_take_and_return_large_arrays_in_their_own_processes() -> None:
    pytest.importorskip("torch", reason="SPMD groups need torch.distributed")
    ctx = fray.init("in_memory")
    try:
        group = ctx.create_actor_group(Member, 2, distributed=True)
        array = np.arange(16 * MiB // 8, dtype=np.int64)
        for _ in range(3):  # the arenas are reused from the second call on
            results = ctx.get(group.double(array), timeout=120)
            assert {pid for pid, _ in results}.isdisjoint({os.getpid()}) and len({pid for pid, _ in results}) == 2
            assert all(np.array_equal(doubled, array * 2) for _, doubled in results)
        stored = group[0].tensor(4 * MiB)
        first, second = ctx.get(stored, timeout=60), ctx.get(stored, timeout=60)
        first[0] = -1.0
        assert float(second[0]) == 1.0 and float(ctx.get(stored, timeout=60)[0]) == 1.0, "readers share a result"
        with pytest.raises(SerializationError, match="the result"):
            ctx.get(group[0].lock(), timeout=60)
        assert np.array_equal(ctx.get(group[0].double(array), timeout=60)[1], array * 2)  # the member lives on
    finally:
        fray.shutdown()


def test_spmd_members_read_a_stored_tensor_without_copying_it_and_write_only_their_own_pages() -> None:
    torch = pytest.importorskip("torch", reason="SPMD groups need torch.distributed")
    from fray.runtime import pool

    ctx = fray.init("in_memory")
    try:
        group = ctx.create_actor_group(Member, 2, distributed=True)
        n = 16 * MiB // 4
        for step in range(6):
            ref = ctx.put(torch.full((n,), float(step)))
            assert ctx.get(group.scribble(ref), timeout=120) == [float(step) * (n - 1) - 5.0] * 2
            assert float(ctx.get(ref, timeout=60)[0]) == float(step), "a member's write reached the stored value"
            del ref
        ctx.get(group.scribble(torch.zeros(4)), timeout=60)  # (its replies say which lent pieces were dropped)
        used = sum(chunk.ranges.used for chunk in pool._pool.chunks)
        assert used < 2 * 16 * MiB, f"{used >> 20} MiB of the pool still in use: lent pieces were never returned"
    finally:
        fray.shutdown()


def child_pid_and_sum(array: np.ndarray) -> tuple[int, int, np.ndarray]:
    return os.getpid(), int(array.sum()), array[::-1].copy()


def test_a_runtime_env_task_takes_and_returns_large_arrays_in_a_child_process() -> None:
    ctx = fray.init("in_memory")
    try:
        array = np.arange(16 * MiB // 8, dtype=np.int64)
        options = TaskOptions(runtime_env=fray.RuntimeEnv(env={"FRAY_TEST_CHILD": "1"}))
        pid, total, reversed_ = ctx.get(ctx.create_task(child_pid_and_sum, args=(array,), options=options), timeout=120)
        assert pid != os.getpid() and total == int(array.sum()) and np.array_equal(reversed_, array[::-1])
    finally:
        fray.shutdown()


def test_without_memfds_values_still_cross_and_torch_reads_copy() -> None:
    """Where os.memfd_create is missing (not Linux), the pool uses anonymous memory and the channel the socket."""
    pytest.importorskip("torch", reason="torch is an optional dependency of fray-core")
    code = textwrap.dedent(
        """
        import os, socket
        del os.memfd_create
        import numpy as np, torch
        from fray.in_memory._channel import Channel
        from fray.runtime.serialization import dumps, loads

        blob = dumps(torch.arange(1 << 20, dtype=torch.float32))
        first, second = loads(blob), loads(blob)
        first[1] = -1.0
        assert float(second[1]) == 1.0
        import threading
        a, b = socket.socketpair()
        left, right = Channel(a), Channel(b)
        got = []
        reader = threading.Thread(target=lambda: got.append(right.recv("a value")))  # 8 MiB fill the socket
        reader.start()
        left.send(np.arange(1 << 20), "a value")
        reader.join()
        assert got[0].sum() == np.arange(1 << 20).sum() and not left._peer
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
