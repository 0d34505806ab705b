"""Between fray hosts: each process serves its allocations over TCP to readers of other hosts (`tcp-direct`),
or offers them as Monarch RDMABuffers where the transport is RDMA. Which one is chosen, and why, is here.
"""

from __future__ import annotations

import secrets
import socket
import struct
import threading

from fray_monarch.arena import Arena

STREAM_MIN = 32 * 1024 * 1024  # pulls larger than this are split over parallel streams
STREAMS = 2  # parallel streams per pull: 2 reached ~2 GB/s over loopback on 2 cores, 1 ~1.6, 4 ~1.7
CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 120.0


_REQUEST = struct.Struct("!16sH QQ")  # token, segment name length, offset, length (name follows)


class TransferServer:
    """Serves this process's allocations to readers on other hosts: one thread per connection."""

    def __init__(self, arena: Arena, bind_host: str) -> None:
        self.arena = arena
        self.token = secrets.token_bytes(16)
        self.sock = socket.create_server((bind_host, 0), backlog=64)
        self.address = f"{bind_host}:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, name="fray-transfer-server", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="fray-transfer", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                try:
                    header = _recv_exact(conn, _REQUEST.size)
                    token, name_len, offset, length = _REQUEST.unpack(header)
                    name = _recv_exact(conn, name_len).decode()
                except (OSError, ConnectionError):
                    return
                chunk = self.arena.locate(name)
                if not secrets.compare_digest(token, self.token) or chunk is None or offset + length > chunk.size:
                    conn.sendall(b"\x00")
                    return
                conn.sendall(b"\x01")
                conn.sendall(chunk.view[offset : offset + length])

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (closing alone leaves it blocked)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(conn, memoryview(buf))
    return bytes(buf)


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the owner closed the connection")
        got += n


class _Connections:
    """Idle connections to transfer servers, reused (a new TCP connection per transfer costs ~0.1 ms)."""

    def __init__(self) -> None:
        self.idle: dict[str, list[socket.socket]] = {}
        self.lock = threading.Lock()

    def take(self, address: str) -> socket.socket:
        with self.lock:
            pool = self.idle.get(address)
            if pool:
                return pool.pop()
        host, port = address.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        conn.settimeout(IO_TIMEOUT)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def give(self, address: str, conn: socket.socket) -> None:
        with self.lock:
            self.idle.setdefault(address, []).append(conn)

    def close(self) -> None:
        with self.lock:
            for pool in self.idle.values():
                for conn in pool:
                    conn.close()
            self.idle.clear()


# --------------------------------------------------------------------------------------- transports
def _ibverbs() -> bool:
    try:
        from monarch.rdma import is_ibverbs_available

        return bool(is_ibverbs_available())
    except Exception:
        return False


def choose_transport(transport: str) -> str | None:
    """The RDMA backend this process's values are offered over (None: direct TCP).

    auto: RDMA where ibverbs exists; else direct TCP, because Monarch 0.7's RDMA TCP fallback moves ~0.25 GB/s
    here (one stream), against ~1-2 GB/s for fray's own sockets. rdma: RDMABuffer even over its TCP fallback.
    """
    if transport == "tcp":
        return None
    if transport == "rdma":
        return "ibverbs" if _ibverbs() else "tcp"
    if transport != "auto":
        raise ValueError(f"transport must be auto, tcp or rdma, got {transport!r}")
    return "ibverbs" if _ibverbs() else None


def value_rdma_path() -> str:
    return "rdma-ibverbs" if _ibverbs() else "rdma-tcp"


def why(path: str) -> str:
    return {
        "rdma-ibverbs": "ibverbs is available",
        "rdma-tcp": "transport=rdma was asked for; no ibverbs device, so Monarch's RDMA TCP fallback",
        "tcp-direct": "no ibverbs device: fray's direct sockets beat Monarch's RDMA TCP fallback",
    }.get(path, path)
