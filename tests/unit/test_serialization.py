"""Serialization: copies at put, out-of-band buffers, remote errors keep their type."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from fray import SerializationError
from fray.errors import RemoteExceptionProxy
from fray.runtime.remote_errors import capture_exception
from fray.runtime.serialization import dumps, dumps_call, loads


def test_numpy_goes_out_of_band_and_reads_back_read_only() -> None:
    array = np.arange(1000, dtype=np.float64)
    blob = dumps(array)
    assert len(blob.buffers) == 1 and len(blob.data) < 1000
    array[:] = 0
    restored = loads(blob)
    assert restored.sum() == sum(range(1000))
    assert not restored.flags.writeable


def test_dumps_call_names_the_bad_argument() -> None:
    with pytest.raises(SerializationError, match="argument 1 of f"):
        dumps_call("f", (1, threading.Lock()), {})
    with pytest.raises(SerializationError, match="keyword argument 'k' of f"):
        dumps_call("f", (), {"k": threading.Lock()})


class NeedsTwoArgs(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def test_remote_error_round_trip() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        error = capture_exception(exc)
    rebuilt = error.rebuild()
    assert type(rebuilt) is KeyError and "test_remote_error_round_trip" in rebuilt.remote_traceback  # type: ignore[attr-defined]
    try:
        raise NeedsTwoArgs(1, 2)
    except NeedsTwoArgs as exc:
        proxy = capture_exception(exc).rebuild()
    assert isinstance(proxy, RemoteExceptionProxy) and "NeedsTwoArgs" in str(proxy) and "1/2" in str(proxy)
    again = pickle.loads(pickle.dumps(proxy))  # the proxy itself must travel (through Ray, for one)
    assert str(again) == str(proxy) and again.remote_traceback == proxy.remote_traceback  # type: ignore[attr-defined]


def test_main_module_objects_travel_by_value() -> None:
    """A class defined in __main__ must be pickled by value, or a worker process could not load it."""
    import subprocess
    import sys

    code = (
        "import pickle, sys\n"
        "from fray.runtime.serialization import dumps\n"
        "class Point:\n    def __init__(self, x): self.x = x\n"
        "blob = dumps(Point(3))\n"
        "sys.stdout.buffer.write(blob.data)\n"
    )
    data = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True).stdout
    assert pickle.loads(data).x == 3  # loads here, where __main__ has no Point


def test_large_copies_reuse_pooled_memory() -> None:
    from fray.runtime import pool

    value = np.ones(4 * 1024 * 1024, dtype=np.uint8)
    first = loads(dumps(value))
    assert not first.flags.writeable and first.sum() == value.size
    chunks = len(pool._pool.chunks)
    del first
    for _ in range(5):  # freed pieces come back: no new chunk per value
        assert loads(dumps(value)).sum() == value.size
    assert len(pool._pool.chunks) == chunks


def test_torch_read_from_a_stored_copy_is_private() -> None:
    torch = pytest.importorskip("torch", reason="torch is needed for the tensor test")
    blob = dumps(torch.zeros(1024 * 1024))
    first, second = loads(blob), loads(blob)
    first += 1
    assert second.sum().item() == 0 and loads(blob).sum().item() == 0


def test_scalars_take_the_plain_pickle_path_and_keep_their_types() -> None:
    import enum

    class Colour(enum.IntEnum):  # an int subclass: not a plain scalar, pickled by fray's own pickler
        RED = 1

    for value in (0, -7, 2**80, 1.5, True, None, "text", "", 3j, Colour.RED):
        blob = dumps(value, "a scalar")
        assert blob.buffers == [] and blob.contained == []
        back = loads(blob)
        assert back == value and type(back) is type(value)
    big = "x" * (1 << 20)  # a large str stays in band, like the C pickler writes it
    assert loads(dumps(big)) == big
    for value in (((1, "a"), {"k": None}), [b"small", 2.0], {"a": [1, 2]}, [[[1]]], list(range(100))):
        assert loads(dumps(value)) == value  # small containers of scalars: plain; deeper or longer: fray's
    large = (b"x" * (1 << 20),)  # large bytes still go out of band, inside a container too
    blob = dumps(large)
    assert len(blob.buffers) == 1 and loads(blob) == large


def test_transfer_stats_count_by_path() -> None:
    from fray.telemetry.transfers import PathStats, TransferStats, merge

    stats = TransferStats()
    stats.record("inline", 10, 0.5)
    stats.record("inline", 5, 0.25)
    stats.record("shm", 100, 1.0)
    snap = stats.snapshot()
    assert snap == {"inline": PathStats(2, 15, 0.75), "shm": PathStats(1, 100, 1.0)}
    stats.record("inline", 1, 0.0)
    assert snap["inline"].count == 2  # a snapshot does not move
    assert merge(snap, stats.snapshot())["inline"] == PathStats(5, 31, 1.5)
    stats.reset()
    assert stats.snapshot() == {}


def test_torch_read_from_a_stored_copy_maps_it_copy_on_write_and_keeps_it_leased() -> None:
    torch = pytest.importorskip("torch", reason="torch is needed for the tensor test")
    from fray.runtime import pool

    blob = dumps(torch.arange(2 * 1024 * 1024, dtype=torch.float32))
    (stored,) = blob.buffers
    reader = loads(blob)
    piece = stored.obj.lease
    address = reader.untyped_storage().data_ptr()
    assert address != pool.buffer_address(stored), "the reader should not alias the store"
    assert _mapping_at(address).endswith("rw-p memfd:fray-pool"), "the reader's tensor is not a copy-on-write mapping"
    reader[0] = -1.0  # a written page becomes the reader's own
    assert float(loads(blob)[0]) == 0.0
    del blob, stored
    taken = [pool.pool_copy(np.zeros(8 * 1024 * 1024, dtype=np.uint8), readonly=True) for _ in range(4)]
    for other in taken:  # the piece the reader maps is not handed out again while it lives
        assert other.obj.lease.chunk is not piece.chunk or other.obj.lease.offset != piece.offset
    assert float(reader[1]) == 1.0 and float(reader[-1]) == 2 * 1024 * 1024 - 1


def _mapping_at(address: int) -> str:
    """The permissions and file of the mapping holding `address`, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return f"{fields[1]} {fields[5].lstrip('/') if len(fields) > 5 else ''}"
    return ""


def test_a_pickled_tensor_is_freed_with_its_blob_without_the_cyclic_gc() -> None:
    torch = pytest.importorskip("torch", reason="torch is needed for the tensor test")
    import gc
    import weakref

    gc.disable()  # a loop of a few large tensors rarely triggers a collection: nothing may wait for one
    try:
        for copy in (False, True):
            tensor = torch.ones(1024 * 1024)
            alive = weakref.ref(tensor)
            blob = dumps([tensor, tensor[3:]], copy=copy)
            del blob, tensor
            assert alive() is None, f"dumps(copy={copy}) kept the tensor alive after its blob was gone"
    finally:
        gc.enable()
