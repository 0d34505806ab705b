"""The data plane between hosts protects the bytes, not only the ends (issue 29, item 4): a relay on the path that
changes a buffer's bytes gets the pull refused, never accepted; `transport=tls` encrypts them as well, and takes
only peers with a certificate of the user's authority.

Owner and reader are real ObjectStores on loopback; the relay is a real TCP proxy between them (the locator
given to the reader names the relay's address, as a redirected route would)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fray.errors import FrayError, ObjectLostError
from fray.runtime.serialization import dumps
from fray_monarch.core.protocol import Stored
from fray_monarch.data import transfer_tls, transfer_wire
from fray_monarch.data.store import ObjectStore
from fray_monarch.net import tls

MiB = 1024 * 1024
SECRET = np.frombuffer(b"fray-secret-bytes:" * (3 * MiB // 18), dtype=np.uint8)  # easy to spot on the wire


def _store(host: str, transport: str) -> ObjectStore:
    return ObjectStore("zztest", host, f"proc-{host}", 256 * MiB, "127.0.0.1", lambda oid: None, MiB, transport, True)


class Relay:
    """A TCP proxy to `target`: copies both ways, keeps what the owner sent, and (with `flip_at`) inverts the
    owner's byte at that position of the connection's stream."""

    def __init__(self, target: str, flip_at: int | None = None) -> None:
        self.target = target
        self.flip_at = flip_at
        self.seen = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(30)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                client, _ = self.sock.accept()
                host, port = self.target.rsplit(":", 1)
                server = socket.create_connection((host, int(port)), timeout=30)
                threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()
        except OSError:
            return

    def _pump(self, src: socket.socket, dst: socket.socket, from_owner: bool) -> None:
        src.settimeout(30)
        sent = 0
        try:
            while chunk := src.recv(1 << 16):
                data = bytearray(chunk)
                if from_owner:
                    if self.flip_at is not None and sent <= self.flip_at < sent + len(data):
                        data[self.flip_at - sent] ^= 0xFF
                    self.seen += data
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture()
def tcp_stores() -> Iterator[tuple[ObjectStore, ObjectStore]]:
    owner, reader = _store("h1", "tcp"), _store("h0", "tcp")
    try:
        yield owner, reader
    finally:
        reader.close()
        owner.close()


def _install_identity(monkeypatch: pytest.MonkeyPatch, where: Path, authority: Path) -> None:
    """This process's TLS identity, issued by the authority in `authority`, in files under `where`."""
    monkeypatch.setenv(tls.TLS_DIR_ENV, str(authority))
    identity = tls.issue(["127.0.0.1"])
    where.mkdir(mode=0o700)
    for env, text in ((tls.ENV_CA, identity.ca), (tls.ENV_CERT, identity.cert), (tls.ENV_KEY, identity.key)):
        path = where / env.lower()
        path.write_text(text)
        os.chmod(path, 0o600)
        monkeypatch.setenv(env, str(path))
    transfer_tls.contexts.cache_clear()


@pytest.fixture()
def tls_stores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[ObjectStore, ObjectStore]]:
    _install_identity(monkeypatch, tmp_path / "id", tmp_path / "authority")
    owner, reader = _store("h1", "tls"), _store("h0", "tls")
    try:
        yield owner, reader
    finally:
        reader.close()
        owner.close()
        transfer_tls.contexts.cache_clear()


def _put(owner: ObjectStore) -> Stored:
    value = owner.put(dumps(SECRET), "zztest-i.1")
    assert owner.server is not None
    return value


def _relayed(owner: ObjectStore, value: Stored, flip_at: int | None = None) -> tuple[Relay, Stored]:
    assert owner.server is not None
    relay = Relay(owner.server.address, flip_at)
    return relay, replace(value, address=relay.address)


# Where the owner's stream reaches the buffer's bytes: the challenge, the grant, then the allocation from 0.
BUFFER_AT = transfer_wire.CHALLENGE.size + transfer_wire.GRANT.size


def test_a_relay_that_changes_a_buffer_is_refused(tcp_stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = tcp_stores
    value = _put(owner)
    relay, through = _relayed(owner, value)  # an honest relay first: the path itself works
    assert np.array_equal(reader.load(through), SECRET)
    relay.close()
    relay, through = _relayed(owner, value, flip_at=BUFFER_AT + value.buffers[0].offset + 12345)
    with pytest.raises(ObjectLostError, match="changed on the way"):
        reader.load(through)
    relay.close()
    assert np.array_equal(reader.load(value), SECRET)  # the owner itself still serves it


def test_a_changed_tag_is_refused(tcp_stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = tcp_stores
    value = _put(owner)
    relay, through = _relayed(owner, value, flip_at=BUFFER_AT + value.length + 3)  # in the tag after the bytes
    with pytest.raises(ObjectLostError, match="changed on the way"):
        reader.load(through)
    relay.close()


def test_a_change_deep_in_a_large_pull_is_refused(tcp_stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = tcp_stores
    big = np.arange(3 * transfer_wire.CHUNK // 8, dtype=np.int64)  # three chunks, one tag after them
    value = owner.put(dumps(big), "zztest-i.2")
    relay, through = _relayed(owner, value)
    assert np.array_equal(reader.load(through), big)
    relay.close()
    relay, through = _relayed(owner, value, flip_at=BUFFER_AT + 2 * transfer_wire.CHUNK + 100)  # in the third
    with pytest.raises(ObjectLostError, match=f"changed on the way .*the {value.length} bytes received"):
        reader.load(through)
    relay.close()


def test_without_tls_the_bytes_cross_in_clear(tcp_stores: tuple[ObjectStore, ObjectStore]) -> None:
    """What docs/security.md says: the default protects the bytes' integrity, not their confidentiality."""
    owner, reader = tcp_stores
    value = _put(owner)
    relay, through = _relayed(owner, value)
    assert np.array_equal(reader.load(through), SECRET)
    relay.close()
    assert b"fray-secret-bytes:" * 4 in relay.seen


def test_tls_encrypts_and_protects_the_bytes(tls_stores: tuple[ObjectStore, ObjectStore]) -> None:
    owner, reader = tls_stores
    value = _put(owner)
    relay, through = _relayed(owner, value)
    assert np.array_equal(reader.load(through), SECRET)
    relay.close()
    assert len(relay.seen) > SECRET.nbytes and b"fray-secret" not in relay.seen
    relay, through = _relayed(owner, value, flip_at=len(relay.seen) // 2)
    with pytest.raises(ObjectLostError, match="failed"):
        reader.load(through)
    relay.close()
    assert reader.stats.snapshot()["tcp-direct"].count == 1


def test_tls_refuses_a_reader_of_another_authority(
    tls_stores: tuple[ObjectStore, ObjectStore], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    owner, _ = tls_stores
    value = _put(owner)
    owners_ca = os.environ[tls.ENV_CA]
    _install_identity(monkeypatch, tmp_path / "stranger-id", tmp_path / "stranger-authority")
    stranger = _store("h2", "tls")  # neither trusts the other's authority: the reader refuses the owner
    try:
        with pytest.raises(ObjectLostError, match="not from your fray authority"):
            stranger.load(value)
    finally:
        stranger.close()
    monkeypatch.setenv(tls.ENV_CA, owners_ca)
    transfer_tls.contexts.cache_clear()
    stranger = _store("h3", "tls")  # it trusts the owner's authority, but the owner refuses its certificate
    try:
        with pytest.raises(ObjectLostError, match="same fray authority"):
            stranger.load(value)
    finally:
        stranger.close()


def test_tls_needs_an_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in (tls.ENV_CA, tls.ENV_CERT, tls.ENV_KEY):
        monkeypatch.delenv(env, raising=False)
    transfer_tls.contexts.cache_clear()
    with pytest.raises(FrayError, match="not insecure=true"):
        _store("h3", "tls")
    transfer_tls.contexts.cache_clear()


def test_tls_transport_cannot_go_with_insecure() -> None:
    from fray_monarch.cluster.topology import topology

    with pytest.raises(ValueError, match="insecure=true has none"):
        topology({"transport": "tls", "insecure": True})
