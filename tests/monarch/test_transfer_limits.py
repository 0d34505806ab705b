"""What a connection to a transfer server may hold: a request is complete and proved within an absolute deadline
however slowly its bytes come; connections that proved nothing hold few places, whatever their addresses; idle
pooled connections and stale handshakes give way to new readers; a reader the server turns away waits and
tries again instead of failing the object.

Owner and readers are real ObjectStores and connection pools (real sockets on loopback; other peer addresses are
other loopback addresses, 127.0.0.2 and up)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _sockets import closed_within

from fray.errors import ObjectLostError
from fray.runtime.serialization import dumps
from fray_monarch.core.protocol import Stored
from fray_monarch.data import transfer, transfer_server
from fray_monarch.data.store import ObjectStore

MiB = 1024 * 1024


def _store(host: str) -> ObjectStore:
    return ObjectStore("zztest", host, f"proc-{host}", 256 * MiB, "127.0.0.1", lambda oid: None, MiB, "tcp", True)


@pytest.fixture()
def owner() -> Iterator[ObjectStore]:
    store = _store("h1")
    try:
        yield store
    finally:
        store.close()


def _value(owner: ObjectStore) -> Stored:
    return owner.put(dumps(np.arange(2 * MiB, dtype=np.uint8)), "zztest-l.1")


def _connect(address: str, source: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))


def _pull(conns: transfer.Connections, value: Stored) -> bytes:
    target = memoryview(bytearray(value.length))
    transfer.fetch(conns, value, 0, value.length, target)
    return bytes(target[value.buffers[0].offset : value.buffers[0].offset + value.buffers[0].length])


def _address(owner: ObjectStore) -> str:
    assert owner.server is not None
    return owner.server.address


def test_a_trickling_request_is_cut_at_its_deadline(owner: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _value(owner)
    monkeypatch.setattr(transfer_server, "AUTH_TIMEOUT", 1.0)
    conn = _connect(_address(owner), "127.0.0.2")
    start = time.monotonic()
    closed = False
    while not closed and time.monotonic() - start < 4:  # one byte every 0.25 s: each well within a second
        try:
            conn.sendall(b"x")
        except OSError:
            closed = True
            break
        closed = closed_within(conn, 0.25)
    took = time.monotonic() - start
    conn.close()
    assert closed, "a request trickling in a byte at a time must not hold its connection past the deadline"
    assert 0.8 < took < 2.0, took


def test_slow_strangers_do_not_keep_a_reader_out(owner: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strangers are counted by what they proved (nothing), not by their addresses, of which a local user has all
    of 127/8: however many addresses they come from, they hold at most MAX_UNPROVEN places and a reader is served
    at once. Before, each address had its own cap, and MAX_CONNECTIONS strangers from as many addresses, fresh
    ones never giving way, kept every reader out (here for the 30 s a reader keeps trying)."""
    value = _value(owner)
    address = _address(owner)
    monkeypatch.setattr(transfer_server, "HANDSHAKE_GRACE", 30.0)  # none of the strangers goes stale meanwhile
    one_peer = [_connect(address, "127.0.0.2") for _ in range(transfer_server.MAX_CONNECTIONS + 8)]
    many_peers = [_connect(address, f"127.0.1.{i + 1}") for i in range(transfer_server.MAX_CONNECTIONS)]
    try:
        for conn in one_peer + many_peers:
            conn.sendall(b"slow")  # the start of a request, never finished
        time.sleep(0.2)
        still_open = sum(not closed_within(conn, 0.01) for conn in one_peer + many_peers)
        assert still_open <= transfer_server.MAX_UNPROVEN, still_open
        monkeypatch.setattr(transfer, "REFUSED_WAIT", 2.0)
        conns = transfer.Connections()
        try:
            start = time.monotonic()
            assert _pull(conns, value) == np.arange(2 * MiB, dtype=np.uint8).tobytes()
            assert time.monotonic() - start < 1.0
        finally:
            conns.close()
    finally:
        for conn in one_peer + many_peers:
            conn.close()


def test_more_readers_than_places_are_all_served(owner: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer_server, "MAX_CONNECTIONS", 3)
    value = _value(owner)  # (the server starts here)
    expected = np.arange(2 * MiB, dtype=np.uint8).tobytes()
    pools = [transfer.Connections() for _ in range(8)]
    try:
        for conns in pools:  # each keeps its connection pooled, idle, after its pull
            assert _pull(conns, value) == expected
        failures: list[Any] = []

        def read_often(conns: transfer.Connections) -> None:
            try:
                for _ in range(4):
                    assert _pull(conns, value) == expected
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=read_often, args=(conns,)) for conns in pools]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failures, failures[:2]
    finally:
        for conns in pools:
            conns.close()


def test_a_turned_away_reader_waits_for_a_place(owner: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _value(owner)
    address = _address(owner)
    monkeypatch.setattr(transfer_server, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(transfer_server, "HANDSHAKE_GRACE", 30.0)  # the holders below never give way
    held = [_connect(address, f"127.0.0.{2 + i}") for i in range(3)]
    conns = transfer.Connections()
    try:
        monkeypatch.setattr(transfer, "REFUSED_WAIT", 1.0)
        start = time.monotonic()
        with pytest.raises(ObjectLostError, match="closed every connection before answering for 1 s"):
            _pull(conns, value)
        assert time.monotonic() - start < 5
        monkeypatch.setattr(transfer, "REFUSED_WAIT", 30.0)
        threading.Timer(0.5, lambda: [conn.close() for conn in held]).start()
        start = time.monotonic()
        assert _pull(conns, value) == np.arange(2 * MiB, dtype=np.uint8).tobytes()
        assert time.monotonic() - start > 0.4
    finally:
        conns.close()
        for conn in held:
            conn.close()
