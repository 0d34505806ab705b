"""The owner side of a process's object store: an arena of shared-memory files.

Chunks (64 MiB, or one object's size) are /dev/shm files mapped once and reused, so writing a value is one
memory copy into pages that are already faulted in. Allocations are page aligned. The size of the store of one
fray host is `object_store_memory`, shared by its processes: a chunk is created only under the host's lock file,
after adding up the chunk files of that host. Files are named `fray.<ctl>.<host>.<pid>-<starttime>.<n>`, so a
later start can reclaim the files of dead processes (and only those: another live driver's files are never
touched).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

from fray import procfs
from fray._pool import FreeList
from fray._pool import align as _align
from fray.errors import ObjectStoreFullError

SHM_DIR = "/dev/shm"
CHUNK = 64 * 1024 * 1024
# Fully free chunks are kept for reuse up to this much per process (or a quarter of the host's budget, if more):
# a new 100 MiB chunk costs ~90 ms in page allocation and faults here, a reused one ~10 ms (one memcpy).
RETAIN_FREE = 512 * 1024 * 1024


def _proc_tag(pid: int) -> str | None:
    """pid-starttime of a live process (None if it is gone): survives pid reuse."""
    found = procfs.stat(pid)
    return f"{pid}-{found.start}" if found is not None and found.live else None


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


@dataclass
class _Chunk:
    name: str
    size: int
    fd: int
    map: mmap.mmap
    view: memoryview
    ranges: FreeList


class Arena:
    """Allocations in shared-memory chunks of this process, within the host's budget."""

    def __init__(self, ctl: str, host: str, budget: int) -> None:
        tag = _proc_tag(os.getpid())
        self.prefix = segment_prefix(ctl, host)
        self.tag = tag or str(os.getpid())
        self.budget = budget
        self.retain = max(RETAIN_FREE, budget // 4)
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
            return aid, chunk, offset

    def _find(self, size: int) -> tuple[_Chunk, int] | None:
        for chunk in self.chunks.values():
            offset = chunk.ranges.take(size)
            if offset is not None:
                return chunk, offset
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
        self.chunks[name] = _Chunk(name, size, fd, mapped, memoryview(mapped), FreeList(size))

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
        chunk.ranges.give(offset, size)
        self._release_free_chunks(keep=self.retain)

    def _release_free_chunks(self, keep: int) -> None:
        """Under the lock: unlink fully free chunks beyond `keep` bytes of them (largest first)."""
        idle = sorted((c for c in self.chunks.values() if c.ranges.used == 0), key=lambda c: -c.size)
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
        try:
            chunk.view.release()
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


class _Lease:
    """Frees an arena allocation when the views over it are gone."""

    def __init__(self, arena: Arena, aid: int) -> None:
        self.arena, self.aid = arena, aid

    def __del__(self) -> None:
        # Not arena.free here: a finalizer can run inside the arena's own critical section (a garbage collection
        # triggered there). The arena drains these at its next alloc or free.
        self.arena.released.append(self.aid)
