"""The data plane between hosts authenticates both ends (issue 20, item 2): the pickle stream rides the control
plane, the socket only raw bytes; a capability per allocation, checked against the owner's live allocations,
proved by each side without ever crossing the socket; idle, excess and malformed connections are closed without
disturbing the others; a context of one host runs no transfer server at all.

Owner and reader are real ObjectStores (two fray hosts, real sockets on loopback); the one-host case runs on real
Monarch processes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from _sockets import closed_within

import fray
from fray.errors import ObjectLostError
from fray.runtime.serialization import dumps
from fray_monarch.core.protocol import Stored
from fray_monarch.data import transfer_server, transfer_wire
from fray_monarch.data.store import ObjectStore

MiB = 1024 * 1024


def _store(host: str) -> ObjectStore:
    return ObjectStore("zztest", host, f"proc-{host}", 512 * MiB, "127.0.0.1", lambda oid: None, MiB, "tcp", True)


@pytest.fixture()
def stores() -> Iterator[tuple[ObjectStore, ObjectStore]]:
    owner, reader = _store("h1"), _store("h0")
    try:
        yield owner, reader
    finally:
        reader.close()
        owner.close()


def _put(owner: ObjectStore, value: Any, oid: str = "zztest-p.1") -> Stored:
    return owner.put(dumps(value), oid)


def _connect(address: str, source: str = "") -> socket.socket:
    """A connection to `address`, from the loopback address `source` (the server caps connections per address)."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0) if source else None)


def test_a_value_crosses_hosts_with_its_pickle_stream_in_the_locator(stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = stores
    array = np.arange(4 * MiB, dtype=np.uint8)
    value = _put(owner, array)
    assert value.pickle is not None and len(value.capability) == 32 and not hasattr(value, "token")
    assert np.array_equal(reader.load(value), array)
    numbers = list(range(3_000_000))
    big = _put(owner, numbers, "zztest-p.2")  # pickled in band (~15 MB): the stream stays, its digest rides
    assert big.pickle is None and len(big.digest) == 32
    assert reader.load(big) == numbers
    assert reader.stats.snapshot()["tcp-direct"].count == 2


def test_altered_pickle_bytes_are_never_unpickled(stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = stores
    big = _put(owner, list(range(100_000)))
    assert big.pickle is None
    with pytest.raises(ObjectLostError, match="digest"):
        reader.load(replace(big, digest=b"\0" * 32))


def test_a_wrong_or_freed_capability_reads_nothing(stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = stores
    value = _put(owner, np.ones(2 * MiB))
    forged = replace(value, capability=bytes(32))
    with pytest.raises(ObjectLostError, match="did not prove"):
        reader.load(forged)
    wider = replace(value, length=value.length + 4096)  # the capability covers exactly its allocation
    with pytest.raises(ObjectLostError, match="did not prove"):
        reader.load(wider)
    assert reader.load(value).sum() == 2 * MiB
    owner.free([value.alloc])
    with pytest.raises(ObjectLostError, match="no longer has it"):
        reader.load(value)


def test_a_reader_never_sends_its_capability_to_a_stranger(stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = stores
    value = _put(owner, np.ones(2 * MiB))
    stranger = socket.create_server(("127.0.0.1", 0))
    heard = bytearray()

    def pretend() -> None:
        conn, _ = stranger.accept()
        with conn:
            conn.settimeout(5)
            heard.extend(conn.recv(4096))
            conn.sendall(bytes(16) + bytes(32))  # a challenge with a proof it cannot make
            try:
                while chunk := conn.recv(4096):
                    heard.extend(chunk)
            except OSError:
                pass

    thread = threading.Thread(target=pretend)
    thread.start()
    with pytest.raises(ObjectLostError, match="did not prove"):
        reader.load(replace(value, address=f"127.0.0.1:{stranger.getsockname()[1]}"))
    thread.join(10)
    stranger.close()
    assert heard and value.capability not in bytes(heard)


def test_malformed_requests_close_only_their_connection(stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = stores
    value = _put(owner, np.ones(2 * MiB))
    assert owner.server is not None
    address = owner.server.address
    keep = _connect(address)  # an idle neighbour: must survive the others
    head = transfer_wire.REQUEST
    bad = [
        b"garbage" * 20,
        head.pack(bytes(16), value.alloc, value.offset, value.length, 0, value.length, 60000),  # huge name
        head.pack(bytes(16), value.alloc, value.offset, value.length, 0, value.length, 2) + b"\xff\xfe",  # not UTF-8
        head.pack(bytes(16), value.alloc, value.offset, value.length, 0, 2**63, 4) + b"fray",  # beyond the allocation
    ]
    for request in bad:
        conn = _connect(address)
        conn.sendall(request)
        assert closed_within(conn, 5), request[:40]
        conn.close()
    assert not closed_within(keep, 0.2)
    assert reader.load(value).sum() == 2 * MiB
    keep.close()


def test_idle_and_excess_connections_areclosed_within(
    stores: tuple[ObjectStore, ObjectStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, reader = stores
    value = _put(owner, np.ones(2 * MiB))
    assert owner.server is not None
    address = owner.server.address
    monkeypatch.setattr(transfer_server, "MAX_CONNECTIONS", 6)
    monkeypatch.setattr(transfer_server, "HANDSHAKE_GRACE", 30.0)  # none of these gives way to a newcomer here
    held = [_connect(address, f"127.0.0.{2 + i}") for i in range(6)]  # one per peer address: under its own cap
    time.sleep(0.3)
    extra = _connect(address, "127.0.0.9")
    assert closed_within(extra, 5), "a connection beyond the cap must be closed at once"
    assert not any(closed_within(c, 0.01) for c in held[:4])
    for conn in held:
        conn.close()
    monkeypatch.setattr(transfer_server, "AUTH_TIMEOUT", 0.5)
    deadline = time.monotonic() + 5
    while True:  # the server notices the closed ones and frees their slots
        idle = _connect(address)
        start = time.monotonic()
        if closed_within(idle, 3):
            break
        assert time.monotonic() < deadline
    assert 0.3 < time.monotonic() - start < 2.5, "an idle connection is closed after AUTH_TIMEOUT"
    assert reader.load(value).sum() == 2 * MiB


def big_value() -> np.ndarray:
    return np.ones(4 * MiB, dtype=np.uint8)


def servers_here() -> bool:
    from fray_monarch.workers import process as worker_process

    assert worker_process._worker is not None
    return worker_process._worker.rt.store.server is not None


@pytest.fixture(scope="module")
def one_host() -> Iterator[fray.JobContext]:
    context = fray.init("monarch?procs=1")
    try:
        yield context
    finally:
        fray.shutdown()


def test_one_host_runs_no_transfer_server(one_host: fray.JobContext) -> None:
    made = one_host.create_task(big_value)
    kept = one_host.put(big_value())
    assert one_host.get(made, timeout=60).sum() == 4 * MiB and one_host.get(kept, timeout=60).sum() == 4 * MiB
    ctl = one_host.ctl  # type: ignore[attr-defined]
    assert ctl.store.server is None
    assert one_host.get(one_host.create_task(servers_here), timeout=60) is False
    with ctl.lock:
        locators = [e.value for e in ctl.directory.entries.values() if isinstance(e.value, Stored)]
    assert locators and all(v.address == "" and v.capability == b"" for v in locators)
