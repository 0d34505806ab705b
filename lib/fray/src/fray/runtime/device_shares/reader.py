"""The reader's side of device shares: rebuild a value's device snapshot from its producer (producer.py).

One connection per producer, kept for the next value (a share costs a round trip, not a connect). Per value:
ask for a share, open it and copy into this process's own memory (`{memory}-ipc`), release the lease; in a get
into the caller's own memory (fray.runtime.borrowing), open it and lend the snapshot itself to that get's copy,
releasing the lease once the copy is done (`{memory}-ipc-out`). Where this process cannot open it
(`DeviceOpenError`), ask for the bytes staged through host memory instead (`{memory}-ipc-staged`). A producer
that is gone, or a value it no longer holds, is `ObjectLostError`: never a crash or garbage.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fray.errors import FrayError, ObjectLostError
from fray.runtime.borrowing import current_borrows
from fray.runtime.device_shares.memory import DeviceMemory, DeviceOpenError, Share, memfd_memory
from fray.runtime.device_shares.producer import host_key
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
    read_exactly,
    read_message,
    send_message,
)
from fray.telemetry.transfers import device_stats

__all__ = ["drop_connections", "memory_named", "rebuild_shared"]

_MAX_CONNECTIONS = 64  # producers this process keeps a connection to (the least recently used one goes)
_CONNECT_TIMEOUT_S = 10.0
_REPLY_TIMEOUT_S = 120.0  # a share is a handle; a staged reply is the value's bytes over a local socket

_connections: OrderedDict[str, _Connection] = OrderedDict()
_connections_lock = threading.Lock()


def memory_named(name: str) -> DeviceMemory:
    """The DeviceMemory a ShareRef names."""
    if name == "memfd":
        return memfd_memory
    if name == "cuda":
        from fray.runtime.device_shares.cuda_memory import cuda_memory

        return cuda_memory
    raise FrayError(f"a device value of memory {name!r}, which this fray does not know: upgrade fray here")


class _Connection:
    def __init__(self, address: str) -> None:
        self.address = address
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(_CONNECT_TIMEOUT_S)
        try:
            at_unix_path(address, self.sock.connect)
            check_peer_is_this_user(self.sock)
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(_REPLY_TIMEOUT_S)

    def close(self) -> None:
        self.sock.close()


def _connection(address: str) -> _Connection:
    with _connections_lock:
        found = _connections.get(address)
        if found is not None:
            _connections.move_to_end(address)
            return found
    made = _Connection(address)
    with _connections_lock:
        _connections[address] = made
        while len(_connections) > _MAX_CONNECTIONS:
            _, old = _connections.popitem(last=False)
            old.close()
    return made


def _forget(conn: _Connection) -> None:
    with _connections_lock:
        if _connections.get(conn.address) is conn:
            del _connections[conn.address]
    conn.close()


def drop_connections() -> None:
    """Close every connection to producers (a forked child's are its parent's)."""
    with _connections_lock:
        for conn in _connections.values():
            conn.close()
        _connections.clear()


def _lost(ref: ShareRef, why: str) -> ObjectLostError:
    return ObjectLostError(f"a device value ({ref.nbytes} bytes, {ref.memory} memory) is lost: {why}")


def rebuild_shared(ref: ShareRef, where: Any = None) -> Any:
    """The value behind `ref`, in this process's own memory on `where` (the memory's choice when None)."""
    if ref.host != host_key():
        raise FrayError(
            f"a device value shared by a process of host {ref.host} was read on host {host_key()}: shares work "
            "between processes of one host only, and values bound elsewhere are staged. This is a bug in the "
            "backend that sent it; please report it"
        )
    memory = memory_named(ref.memory)
    start = time.perf_counter()
    try:
        conn = _connection(ref.address)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise _lost(ref, f"the process that made it is gone ({type(exc).__name__})") from None
    except OSError as exc:
        raise _lost(ref, f"its producer cannot be reached ({exc})") from None
    try:
        with conn.lock:
            value, path = _fetch(conn, ref, memory, where)
    except (EOFError, ConnectionError) as exc:
        _forget(conn)
        raise _lost(ref, f"the process that made it ended while it was read ({type(exc).__name__})") from None
    except TimeoutError:
        _forget(conn)
        raise _lost(ref, f"its producer did not answer within {_REPLY_TIMEOUT_S:.0f} s") from None
    device_stats.record(path, ref.nbytes, time.perf_counter() - start)
    return value


def _fetch(conn: _Connection, ref: ShareRef, memory: DeviceMemory, where: Any) -> tuple[Any, str]:
    if memory.unopenable(ref.device, where) is None:
        shared = _fetch_shared(conn, ref, memory, where)
        if shared is not None:
            return shared
    return _fetch_staged(conn, ref, memory, where)


def _fetch_shared(conn: _Connection, ref: ShareRef, memory: DeviceMemory, where: Any) -> tuple[Any, str] | None:
    """The value through a share of its own; None when this process cannot open the share after all."""
    send_message(conn.sock, OpenShare(ref.snapshot))
    reply, fds = read_message(conn.sock)
    if isinstance(reply, Lost):
        raise _lost(ref, reply.reason)
    if not isinstance(reply, Granted):
        for fd in fds:
            os.close(fd)
        raise FrayError(f"a device-share producer answered {type(reply).__name__} to a request for a share")
    borrows = current_borrows()
    release = ReleaseLease(reply.lease)
    lent = False
    try:
        if borrows is not None:  # (a get into the caller's memory: the snapshot is read from, not copied first)
            alias, reads_done = memory.open_alias(Share(reply.handle), fds, where)
            borrows.hold(lambda: _let_go(conn, release, reads_done))
            lent = True
            return alias, f"{memory.name}-ipc-out"
        return memory.open_copy(Share(reply.handle), fds, where), f"{memory.name}-ipc"
    except DeviceOpenError:
        return None
    finally:
        if not lent:
            send_message(conn.sock, release)


def _fetch_staged(conn: _Connection, ref: ShareRef, memory: DeviceMemory, where: Any) -> tuple[Any, str]:
    """The value's bytes staged by its producer through host memory, uploaded here."""
    send_message(conn.sock, StageSnapshot(ref.snapshot))
    reply, fds = read_message(conn.sock)
    for fd in fds:
        os.close(fd)
    if isinstance(reply, Lost):
        raise _lost(ref, reply.reason)
    if not isinstance(reply, Staged) or reply.nbytes != ref.nbytes:
        raise FrayError(f"a device-share producer answered {reply!r} to a request for {ref.nbytes} staged bytes")
    with memory.host_buffer(reply.nbytes) as view:
        read_exactly(conn.sock, reply.nbytes, into=view)
        return memory.upload(view, where), f"{memory.name}-ipc-staged"


def _let_go(conn: _Connection, release: ReleaseLease, reads_done: Callable[[], None]) -> None:
    """A borrowed snapshot's lease goes back once every read of it is done (a connection closed meanwhile has
    given it back already: the producer ends a closed connection's leases)."""
    reads_done()
    try:
        with conn.lock:
            send_message(conn.sock, release)
    except OSError:
        pass


os.register_at_fork(after_in_child=drop_connections)
