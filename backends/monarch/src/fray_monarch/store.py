"""The per-process object store: large values live in shared memory with the process that made them.

Owner side: an arena of /dev/shm files ("chunks", 64 MiB or one object's size) mapped once and reused, so
writing a value is one memory copy into already-faulted pages. Allocations are page aligned; each out-of-band
buffer starts on a page, so a reader can map it on its own.

Reader side, same fray host: each buffer is mmap'ed from the owner's file (MAP_POPULATE: one system call, no
page fault per page). numpy buffers are mapped read-only (writing raises, as with Ray). torch storages are mapped
copy-on-write (MAP_PRIVATE): a reader that writes gets private pages and never changes another reader's value.
The mapping holds a ref to the object, so the owner cannot free and reuse the memory while it is mapped.

Reader side, another fray host: the bytes are pulled from the owner's transfer server over TCP (`tcp-direct`,
chosen when ibverbs is missing; see docs/backends/monarch.md), split over parallel streams when large, straight
into private memory of the reader.

The size of the store of one fray host is `object_store_memory`, shared by its processes: a chunk is created
only under the host's lock file, after adding up the chunk files of that host. Files are named
`fray.<ctl>.<host>.<pid>-<starttime>.<n>`, so a later start can reclaim the files of dead processes (and only
those: another live driver's files are never touched).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import itertools
import logging
import mmap
import os
import secrets
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fray.errors import ObjectLostError, ObjectStoreFullError
from fray.serialization import Blob, loads
from fray.transfers import TransferStats
from fray_monarch.protocol import Inline, Span, Stored, Value

log = logging.getLogger("fray_monarch")

SHM_DIR = "/dev/shm"
PAGE = mmap.PAGESIZE
CHUNK = 64 * 1024 * 1024
RETAIN_FREE = 512 * 1024 * 1024  # fully free chunks kept for reuse (no page faults) up to this much per process
STREAM_MIN = 32 * 1024 * 1024  # pulls larger than this are split over parallel streams
STREAMS = 2  # parallel streams per pull: 2 reached ~2 GB/s over loopback on 2 cores, 1 ~1.6, 4 ~1.7
CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 120.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _align(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def _proc_tag(pid: int) -> str | None:
    """pid-starttime of a live process (None if it is gone): survives pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    return f"{pid}-{int(fields[19])}"


def segment_prefix(ctl: str, host: str) -> str:
    return f"fray.{ctl}.{host}."


def reclaim_dead_segments(shm_dir: str = SHM_DIR) -> int:
    """Remove fray store files whose owner process is dead, and lock files of hosts left with no store file
    for a minute. Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    for name in names:
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "fray" and parts[3] == "lock":
            removed += _reclaim_lock(shm_dir, name, names)
            continue
        if len(parts) != 5 or parts[0] != "fray" or "-" not in parts[3]:
            continue
        pid = parts[3].split("-", 1)[0]
        if not pid.isdigit() or _proc_tag(int(pid)) == parts[3]:
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed += 1
        except OSError:
            pass
    return removed


def _reclaim_lock(shm_dir: str, name: str, names: list[str]) -> int:
    prefix = name[: -len("lock")]
    if any(n.startswith(prefix) and n != name for n in names):
        return 0
    path = os.path.join(shm_dir, name)
    try:
        if time.time() - os.stat(path).st_mtime < 60:  # a live context between two chunks: leave it
            return 0
        os.unlink(path)
        return 1
    except OSError:
        return 0


def remove_segments(prefix: str, owner_tag: str | None = None, shm_dir: str = SHM_DIR) -> None:
    """Remove the store files of one context's host (of one owner process, if given)."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and (owner_tag is None or name.split(".")[3] == owner_tag):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass


# --------------------------------------------------------------------------------------- owner side: arena
@dataclass
class _Chunk:
    name: str
    size: int
    fd: int
    map: mmap.mmap
    view: memoryview
    free: list[tuple[int, int]] = field(default_factory=list)  # (offset, size), sorted, coalesced
    used: int = 0


class Arena:
    """Allocations in shared-memory chunks of this process, within the host's budget."""

    def __init__(self, ctl: str, host: str, budget: int) -> None:
        tag = _proc_tag(os.getpid())
        self.prefix = segment_prefix(ctl, host)
        self.tag = tag or str(os.getpid())
        self.budget = budget
        self.chunks: dict[str, _Chunk] = {}
        self.allocs: dict[int, tuple[_Chunk, int, int]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.names = itertools.count()
        self.released: deque[int] = deque()  # allocations whose leases died (see _Lease)

    def alloc(self, size: int) -> tuple[int, _Chunk, int]:
        """(allocation id, chunk, offset) of `size` page-aligned bytes; ObjectStoreFullError if no room."""
        size = _align(max(size, 1))
        with self.lock:
            self._drain_released()
            found = self._find(size)
            if found is None:
                try:
                    self._grow(max(CHUNK, size))
                except ObjectStoreFullError:
                    self._release_free_chunks(keep=0)
                    self._grow(max(CHUNK, size))
                found = self._find(size)
                assert found is not None
            chunk, offset = found
            aid = next(self.ids)
            self.allocs[aid] = (chunk, offset, size)
            chunk.used += size
            return aid, chunk, offset

    def _find(self, size: int) -> tuple[_Chunk, int] | None:
        for chunk in self.chunks.values():
            for i, (off, n) in enumerate(chunk.free):
                if n >= size:
                    if n == size:
                        del chunk.free[i]
                    else:
                        chunk.free[i] = (off + size, n - size)
                    return chunk, off
        return None

    def _grow(self, size: int) -> None:
        name = f"{self.prefix}{self.tag}.{next(self.names)}"
        path = os.path.join(SHM_DIR, name)
        lock_fd = os.open(os.path.join(SHM_DIR, self.prefix + "lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            used = _host_usage(self.prefix)
            if used + size > self.budget:
                raise ObjectStoreFullError(
                    f"the object store of this host is full: {used / 2**20:.0f} MiB used of "
                    f"{self.budget / 2**20:.0f} MiB (object_store_memory), {size / 2**20:.0f} MiB more needed. "
                    "Drop refs to values you no longer need, or raise object_store_memory in the spec."
                )
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # claims the pages now: a full /dev/shm fails here, not at write
            except OSError as exc:
                os.close(fd)
                os.unlink(path)
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise ObjectStoreFullError(
                        f"no room in {SHM_DIR} for {size / 2**20:.0f} MiB more ({exc.strerror})"
                    ) from exc
                raise
        finally:
            os.close(lock_fd)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.chunks[name] = _Chunk(name, size, fd, mapped, memoryview(mapped), [(0, size)])

    def _drain_released(self) -> None:
        while self.released:
            self._free_locked(self.released.popleft())

    def free(self, aid: int) -> None:
        with self.lock:
            self._drain_released()
            self._free_locked(aid)

    def _free_locked(self, aid: int) -> None:
        found = self.allocs.pop(aid, None)
        if found is None:
            return
        chunk, offset, size = found
        chunk.used -= size
        chunk.free.append((offset, size))
        chunk.free.sort()
        merged: list[tuple[int, int]] = []
        for off, n in chunk.free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        chunk.free = merged
        self._release_free_chunks(keep=RETAIN_FREE)

    def _release_free_chunks(self, keep: int) -> None:
        """Under the lock: unlink fully free chunks beyond `keep` bytes of them (largest first)."""
        idle = sorted((c for c in self.chunks.values() if c.used == 0), key=lambda c: -c.size)
        total = sum(c.size for c in idle)
        for chunk in idle:
            if total <= keep:
                break
            total -= chunk.size
            self._drop(chunk)

    def _drop(self, chunk: _Chunk) -> None:
        del self.chunks[chunk.name]
        try:
            os.unlink(os.path.join(SHM_DIR, chunk.name))
        except OSError:
            pass
        chunk.view.release()
        try:
            chunk.map.close()
        except BufferError:  # a local reader still has a view: the mapping goes with it
            pass
        os.close(chunk.fd)

    def close(self) -> None:
        with self.lock:
            for chunk in list(self.chunks.values()):
                self._drop(chunk)
            self.allocs.clear()

    def locate(self, name: str) -> _Chunk | None:
        return self.chunks.get(name)


def _host_usage(prefix: str) -> int:
    total = 0
    with os.scandir(SHM_DIR) as it:
        for entry in it:
            if entry.name.startswith(prefix) and not entry.name.endswith(".lock"):
                try:
                    total += entry.stat().st_size
                except OSError:
                    pass
    return total


# --------------------------------------------------------------------------------------- reader side: mappings
class _Mapping:
    """One mmap of a span of a store file, and how many buffer views use it.

    A view holds a _Use; when the view dies its _Use only queues the mapping (a finalizer must not unmap: it can
    run while another thread is handing the same mapping out, and unmapping there crashed readers). The table
    below unmaps queued mappings that no view uses any more, under its lock."""

    def __init__(self, path: str, offset: int, length: int, private: bool, pin: Any) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            flags = (mmap.MAP_PRIVATE if private else mmap.MAP_SHARED) | mmap.MAP_POPULATE
            # Populated read-only even when private: populating a writable private mapping would copy every page.
            addr = _libc.mmap(None, length, mmap.PROT_READ, flags, fd, offset)
        finally:
            os.close(fd)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {path} failed: {os.strerror(err)}")
        if private and _libc.mprotect(addr, length, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            _libc.munmap(addr, length)
            raise OSError(ctypes.get_errno(), "mprotect failed")
        self.addr, self.length, self.pin = addr, length, pin
        self.users = 0
        self.key: tuple[str, int, int] | None = None

    def view(self, length: int, writable: bool) -> memoryview:
        """Under the table's lock."""
        raw = (ctypes.c_ubyte * length).from_address(self.addr)
        raw.use = _Use(self)  # type: ignore[attr-defined]
        self.users += 1
        view = memoryview(raw).cast("B")
        return view if writable else view.toreadonly()


class _Use:
    __slots__ = ("mapping",)

    def __init__(self, mapping: _Mapping) -> None:
        self.mapping = mapping

    def __del__(self) -> None:
        _maps.released.append(self.mapping)


class _MapTable:
    """The mappings of this process: read-only ones shared by key (segment, offset, allocation), so every get of
    one value returns views of one mapping; unmapped once no view uses them (checked every UNMAP_EVERY s)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shared: dict[tuple[str, int, int], _Mapping] = {}
        self.released: deque[_Mapping] = deque()
        self.sweeper: threading.Thread | None = None
        self.arenas: weakref.WeakSet[Arena] = weakref.WeakSet()  # their leases are drained by the sweep too

    def views(self, path: str, spans: list[tuple[int, int, bool, tuple[str, int, int]]], pin: Any) -> list[Any]:
        out: list[Any] = []
        with self.lock:
            self._drain()
            for start, length, private, key in spans:
                mapping = None if private else self.shared.get(key)
                if mapping is None:
                    mapping = _Mapping(path, start, _align(length), private, pin)
                    if not private:
                        mapping.key = key
                        self.shared[key] = mapping
                out.append(mapping.view(length, writable=private))
            if self.sweeper is None:
                self.sweeper = threading.Thread(target=self._sweep, name="fray-unmap", daemon=True)
                self.sweeper.start()
        return out

    def _drain(self) -> None:
        """Under the lock: unmap the mappings whose last view died."""
        while self.released:
            mapping = self.released.popleft()
            mapping.users -= 1
            if mapping.users > 0:
                continue
            if mapping.key is not None and self.shared.get(mapping.key) is mapping:
                del self.shared[mapping.key]
            _libc.munmap(mapping.addr, mapping.length)
            mapping.pin = None  # the owner may free the value now (if nothing else holds it)

    def _sweep(self) -> None:
        while True:
            time.sleep(UNMAP_EVERY)
            if self.released:
                with self.lock:
                    self._drain()
            for arena in list(self.arenas):
                if arena.released:
                    with arena.lock:
                        arena._drain_released()


_maps = _MapTable()
UNMAP_EVERY = 0.5


class _Lease:
    """Frees an arena allocation when the views over it are gone."""

    def __init__(self, arena: Arena, aid: int) -> None:
        self.arena, self.aid = arena, aid

    def __del__(self) -> None:
        # Not arena.free here: a finalizer can run inside the arena's own critical section (a garbage collection
        # triggered there). The arena drains these at its next alloc or free.
        self.arena.released.append(self.aid)


# --------------------------------------------------------------------------------------- transfer server
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


# --------------------------------------------------------------------------------------- the store
class ObjectStore:
    """One per process: puts large values in its arena, loads values of any host (and counts how)."""

    def __init__(
        self,
        ctl: str,
        host: str,
        owner: str,
        budget: int,
        bind_host: str,
        pin: Callable[[str], Any],
        inline_limit: int,
        transport: str = "auto",
        several_hosts: bool = False,
    ) -> None:
        self.ctl, self.host, self.owner = ctl, host, owner
        self.arena = Arena(ctl, host, budget)
        self.bind_host = bind_host
        self.pin = pin  # oid -> an object holding a ref to it (kept alive by mappings of that object)
        self.inline_limit = inline_limit
        self.stats = TransferStats()
        self.server: TransferServer | None = None
        self.server_lock = threading.Lock()
        self.conns = _Connections()
        self.pool: ThreadPoolExecutor | None = None
        # With one fray host (no hosts= spec) every read is shm: nothing to register for RDMA.
        self.rdma = choose_transport(transport) if several_hosts else None
        self.rdma_buffers: dict[int, Any] = {}
        self.decided: set[str] = set()

    # ----------------------------------------------------------- owner
    def encode(self, blob: Blob, oid: str | None) -> Value:
        """The value to send for blob: inline below the limit (or without an oid to pin), else stored here."""
        if oid is None or blob.nbytes < self.inline_limit:
            return Inline.of(blob)
        return self.put(blob, oid)

    def put(self, blob: Blob, oid: str) -> Stored:
        sizes = [len(blob.data)] + [memoryview(b).nbytes for b in blob.buffers]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += _align(n)
        aid, chunk, base = self.arena.alloc(total)
        view = chunk.view
        view[base : base + sizes[0]] = blob.data
        for off, n, buf in zip(offsets[1:], sizes[1:], blob.buffers, strict=True):
            view[base + off : base + off + n] = memoryview(buf).cast("B")
        spans = [Span(o, n) for o, n in zip(offsets, sizes, strict=True)]
        server = self._server()
        rdma = None
        if self.rdma is not None:
            from monarch.rdma import RDMABuffer

            rdma = self.rdma_buffers[aid] = RDMABuffer(view[base : base + total])
        return Stored(
            oid=oid,
            host=self.host,
            owner=self.owner,
            address=server.address,
            token=server.token.hex(),
            segment=chunk.name,
            offset=base,
            length=total,
            data=spans[0],
            buffers=tuple(spans[1:]),
            private=blob.private,
            alloc=aid,
            rdma=rdma,
        )

    def _server(self) -> TransferServer:
        with self.server_lock:
            if self.server is None:
                self.server = TransferServer(self.arena, self.bind_host)
            return self.server

    def free(self, allocs: list[int]) -> None:
        for aid in allocs:
            rdma = self.rdma_buffers.pop(aid, None)
            if rdma is not None:
                try:
                    rdma.drop()
                except Exception:
                    log.debug("fray: RDMA buffer drop failed", exc_info=True)
            self.arena.free(aid)

    # ----------------------------------------------------------- reader
    def load(self, value: Value) -> Any:
        start = time.perf_counter()
        if isinstance(value, Inline):
            result = loads(Blob(value.data, list(value.buffers)))
            self.stats.record("inline", value.nbytes, time.perf_counter() - start)
            return result
        if value.host == self.host:
            blob = self._map(value)
            path = "shm"
        elif value.rdma is not None:
            blob, path = self._read_rdma(value), value_rdma_path()
        else:
            blob, path = self._pull(value), "tcp-direct"
        if path != "shm" and value.host not in self.decided:
            self.decided.add(value.host)
            log.info("fray: host %s reads values of host %s by %s (%s)", self.host, value.host, path, why(path))
        result = loads(blob)
        self.stats.record(path, value.nbytes, time.perf_counter() - start)
        return result

    def _map(self, value: Stored) -> Blob:
        path = os.path.join(SHM_DIR, value.segment)
        pin = self.pin(value.oid)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectLostError(f"object {value.oid} is lost: its store file is gone (owner process died)") from None
        try:
            data = os.pread(fd, value.data.length, value.offset + value.data.offset)
        finally:
            os.close(fd)
        spans = []
        for i, span in enumerate(value.buffers):
            start = value.offset + span.offset
            spans.append((start, span.length, i in value.private, (value.segment, start, value.alloc)))
        views = _maps.views(path, [s for s in spans if s[1] > 0], pin)
        buffers: list[Any] = [views.pop(0) if s[1] > 0 else b"" for s in spans]
        return Blob(data, buffers)

    def _pull(self, value: Stored) -> Blob:
        """Copy the whole allocation from its owner into private memory here (parallel streams when large)."""
        target = self._landing(value.length)
        token = bytes.fromhex(value.token)
        if value.length >= STREAM_MIN:
            step = _align(-(-value.length // STREAMS))
            parts = [(o, min(step, value.length - o)) for o in range(0, value.length, step)]
            if self.pool is None:
                self.pool = ThreadPoolExecutor(STREAMS, thread_name_prefix="fray-pull")
            for fut in [self.pool.submit(self._fetch, value, token, o, n, target) for o, n in parts]:
                fut.result()
        else:
            self._fetch(value, token, 0, value.length, target)
        return self._blob_of(value, target)

    def _landing(self, length: int) -> memoryview:
        """Private memory for a copy pulled from another host: an allocation of this process's arena (its pages
        are reused, already faulted in: fresh memory costs ~0.7 ms per MiB in page faults here), freed when the
        last view of it is gone; anonymous memory if the store is full."""
        try:
            aid, chunk, offset = self.arena.alloc(length)
        except ObjectStoreFullError:
            return memoryview(mmap.mmap(-1, max(length, 1)))
        raw = (ctypes.c_ubyte * max(length, 1)).from_buffer(chunk.map, offset)
        raw.lease = _Lease(self.arena, aid)  # type: ignore[attr-defined]
        _maps.arenas.add(self.arena)
        return memoryview(raw).cast("B")

    @staticmethod
    def _blob_of(value: Stored, target: memoryview) -> Blob:
        """A value's blob over a private copy of its allocation: torch storages writable, the rest read-only."""
        data = bytes(target[value.data.offset : value.data.offset + value.data.length])
        buffers = []
        for i, span in enumerate(value.buffers):
            view = target[span.offset : span.offset + span.length]
            buffers.append(view if i in value.private else view.toreadonly())
        return Blob(data, buffers)

    def _read_rdma(self, value: Stored) -> Blob:
        """The whole allocation read with Monarch's RDMABuffer (ibverbs, or its TCP fallback) into private memory."""
        target = self._landing(value.length)
        try:
            value.rdma.read_into(target, timeout=int(IO_TIMEOUT)).get()
        except Exception as exc:
            raise ObjectLostError(f"object {value.oid}: RDMA read from host {value.host} failed: {exc}") from exc
        return self._blob_of(value, target)

    def _fetch(self, value: Stored, token: bytes, offset: int, length: int, target: memoryview) -> None:
        name = value.segment.encode()
        try:
            conn = self.conns.take(value.address)
        except OSError as exc:
            raise ObjectLostError(
                f"object {value.oid} is lost: its owner ({value.owner} on host {value.host}) is unreachable: {exc}"
            ) from exc
        try:
            conn.sendall(_REQUEST.pack(token, len(name), value.offset + offset, length) + name)
            if _recv_exact(conn, 1) != b"\x01":
                raise ObjectLostError(f"object {value.oid} is lost: its owner no longer has it")
            _recv_into(conn, target[offset : offset + length])
        except (OSError, ConnectionError) as exc:
            conn.close()
            raise ObjectLostError(f"object {value.oid}: transfer from {value.address} failed: {exc}") from exc
        self.conns.give(value.address, conn)

    # ----------------------------------------------------------- lifetime
    def close(self) -> None:
        self.free(list(self.rdma_buffers))
        if self.server is not None:
            self.server.close()
        self.conns.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        self.arena.close()
