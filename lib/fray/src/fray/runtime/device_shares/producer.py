"""The producer's side of device shares: this process's snapshot table and the socket that serves it.

A value that holds device memory and is sent to another process of this host is not copied to the host: the
serializer snapshots its bytes once on the device (`publish`), and the value carries a `ShareRef` to the snapshot.
Each reader connects to this process's share socket and asks for a share of it; it gets one share of its own
(torch counts each CUDA share once), copies the bytes into its own memory and releases the share's lease. The
snapshot lives while the serialized value does (`ShareToken`, kept by the value's blob in the backend's object
table) and while any lease on it is held; a reader that dies holding a lease has it released when its connection
closes. A reader that cannot open a share asks for the bytes staged through host memory instead.

The socket is a Unix socket in a private directory (0700, this user's, checked), and the peer of every
connection must be this user's process (SO_PEERCRED): another user on the machine can neither read a value nor
send anything that is unpickled here. One server per process, started at the first publish, stopped and its
threads joined at exit (or `stop_serving`); a forked child starts its own.
"""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fray.errors import FrayError
from fray.host.procfs import boot_id
from fray.host.state_dir import private_dir, state_dir
from fray.runtime.device_shares.memory import DeviceMemory
from fray.runtime.device_shares.wire import (
    Granted,
    Lost,
    OpenShare,
    ReleaseLease,
    ShareRef,
    Staged,
    StageSnapshot,
    at_unix_path,
    check_peer_is_this_user,
    read_message,
    send_message,
)

__all__ = ["ShareServer", "ShareToken", "host_key", "publish", "share_server", "shares_dir", "stop_serving"]

_JOIN_S = 5.0  # how long stopping waits for a connection's thread


def host_key() -> str:
    """This host as a reader and a producer compare it: the kernel's boot and the host's name (network
    namespaces standing in for hosts in tests share a boot, not a name)."""
    return f"{boot_id()}/{socket.gethostname()}"


def shares_dir() -> Path:
    """Where producers' share sockets live: $XDG_RUNTIME_DIR/fray-shares, else the state directory's shares/."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.path.isdir(runtime) else state_dir()
    return private_dir(base / "fray-shares" if runtime else base / "shares")


@dataclass
class _Snapshot:
    memory: DeviceMemory
    snapshot: Any
    leases: int = 0
    dropped: bool = False


class ShareToken:
    """Keeps one snapshot published while the serialized value that refers to it lives (Blob.keep holds it)."""

    __slots__ = ("server", "snapshot")

    def __init__(self, server: ShareServer, snapshot: int) -> None:
        self.server, self.snapshot = server, snapshot

    def __del__(self) -> None:
        self.server.drop(self.snapshot)


class ShareServer:
    """This process's snapshots and the socket readers ask for shares of them on."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.address = str(shares_dir() / f"{self.pid}-{secrets.token_hex(4)}")
        self._lock = threading.Lock()
        self._table: dict[int, _Snapshot] = {}
        self._ids = itertools.count(1)
        self._leases = itertools.count(1)
        self._granted = 0
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopped = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        at_unix_path(self.address, self._listener.bind)
        self._listener.listen(64)
        self._acceptor = threading.Thread(target=self._accept, name="fray-device-shares", daemon=True)
        self._acceptor.start()

    def publish(self, memory: DeviceMemory, snapshot: Any, device: int | None) -> tuple[ShareRef, ShareToken]:
        with self._lock:
            key = next(self._ids)
            self._table[key] = _Snapshot(memory, snapshot)
        ref = ShareRef(self.address, host_key(), key, memory.nbytes(snapshot), memory.name, device)
        return ref, ShareToken(self, key)

    def drop(self, key: int) -> None:
        """The value is gone: free its snapshot now, or when its last lease is released."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                return
            entry.dropped = True
            if entry.leases:
                return
            del self._table[key]
        entry.memory.free(entry.snapshot)

    def held(self) -> int:
        """How many snapshots this process holds (a value's, or leased by a reader)."""
        with self._lock:
            return len(self._table)

    def leases(self) -> int:
        with self._lock:
            return sum(entry.leases for entry in self._table.values())

    def granted(self) -> int:
        """How many shares this process has handed out (each one a reader asked for)."""
        with self._lock:
            return self._granted

    def _lease(self, key: int) -> _Snapshot | None:
        with self._lock:
            entry = self._table.get(key)
            if entry is None or entry.dropped:  # (a freed value has no new readers)
                return None
            entry.leases += 1
            return entry

    def _release(self, key: int) -> None:
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                return
            entry.leases -= 1
            if entry.leases or not entry.dropped:
                return
            del self._table[key]
        entry.memory.free(entry.snapshot)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                check_peer_is_this_user(sock)
            except (FrayError, OSError):
                sock.close()
                continue
            thread = threading.Thread(target=self._serve, args=(sock,), name="fray-device-share", daemon=True)
            with self._lock:
                if self._stopped:
                    sock.close()
                    return
                self._connections.add(sock)
                self._threads.add(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        held: dict[int, int] = {}  # lease -> snapshot, of this connection's reader
        try:
            while True:
                message, fds = read_message(sock)
                for fd in fds:  # (a reader sends none)
                    os.close(fd)
                if isinstance(message, OpenShare):
                    self._grant(sock, message.snapshot, held)
                elif isinstance(message, StageSnapshot):
                    self._stage(sock, message.snapshot)
                elif isinstance(message, ReleaseLease):
                    key = held.pop(message.lease, None)
                    if key is not None:
                        self._release(key)
                else:
                    return  # not a reader of fray's: drop the connection
        except (EOFError, OSError, FrayError, ValueError, TypeError, AttributeError, ImportError):
            return  # (the reader is gone, or sent what is not a request)
        finally:
            for key in held.values():  # a reader gone with its leases: they go with it
                self._release(key)
            with self._lock:
                self._connections.discard(sock)
                self._threads.discard(threading.current_thread())
            sock.close()

    def _grant(self, sock: socket.socket, key: int, held: dict[int, int]) -> None:
        entry = self._lease(key)
        if entry is None:
            send_message(sock, Lost("its value was freed"))
            return
        lease = next(self._leases)
        held[lease] = key
        try:
            share = entry.memory.share(entry.snapshot)
        except Exception as exc:  # the memory could not share it: the reader asks for staging
            held.pop(lease)
            self._release(key)
            send_message(sock, Lost(f"it could not be shared ({type(exc).__name__}: {exc})"))
            return
        with self._lock:
            self._granted += 1
        send_message(sock, Granted(lease, share.handle), share.fds)

    def _stage(self, sock: socket.socket, key: int) -> None:
        entry = self._lease(key)
        if entry is None:
            send_message(sock, Lost("its value was freed"))
            return
        try:
            with entry.memory.stage(entry.snapshot) as data:
                send_message(sock, Staged(data.nbytes))
                sock.sendall(data)
        finally:
            self._release(key)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            connections = list(self._connections)
            threads = list(self._threads)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(_JOIN_S)
        for thread in threads:
            thread.join(_JOIN_S)
        try:
            os.unlink(self.address)
        except OSError:
            pass


_server: list[ShareServer] = []
_server_lock = threading.Lock()


def share_server() -> ShareServer:
    """This process's share server (started here at the first call)."""
    with _server_lock:
        if not _server or _server[0].pid != os.getpid():
            _server[:] = [ShareServer()]
        return _server[0]


def publish(memory: DeviceMemory, source: Any, device: int | None) -> tuple[ShareRef, ShareToken]:
    """Snapshot `source` in `memory` and serve shares of it; the token keeps it published."""
    return share_server().publish(memory, memory.snapshot(source), device)


def stop_serving() -> None:
    """Stop this process's share server (at exit; readers of its values then get ObjectLostError)."""
    with _server_lock:
        server = _server[0] if _server and _server[0].pid == os.getpid() else None
        _server.clear()
    if server is not None:
        server.stop()


def _forget_in_child() -> None:
    _server.clear()  # (the parent's server, threads and table are the parent's)


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(stop_serving)
