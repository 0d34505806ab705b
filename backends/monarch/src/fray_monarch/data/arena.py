"""The owner side of a process's object store: an arena of shared-memory files.

Chunks (64 MiB, or one object's size) are /dev/shm files mapped once and reused, so writing a value is one
memory copy into pages that are already faulted in. Allocations are page aligned. The size of the store of one
fray host is `object_store_memory`, shared by its processes: a chunk is created only under a lock of the store
directory (flock), after adding up the chunk files of that host.

/dev/shm is shared by every user of the machine, so the files live in a directory of this user's
(/dev/shm/fray-<uid>, 0700, checked before use; if another user took that name, a fallback with a random part:
shm_dir): another user can neither read them, nor plant a file or a symlink where fray will open one, nor inflate
the usage fray counts. Files are named
`fray.<ctl>.<host>.<pid>-<starttime>-<pid namespace>.<random>`: the random part makes a name impossible to
pre-empt, and the owner's identity lets a later start reclaim the files of dead processes (and only those: a pid
of another pid namespace is not visible here, so its absence proves nothing).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
import secrets
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass

from fray.backend import FreeList, procfs
from fray.backend import align as _align
from fray.errors import FrayError, ObjectStoreFullError

SHM_ROOT = "/dev/shm"
CHUNK = 64 * 1024 * 1024
# Fully free chunks are kept for reuse up to this much per process (or a quarter of the host's budget, if more):
# a new chunk costs page allocation and faults, several times the one memcpy into a reused one.
RETAIN_FREE = 512 * 1024 * 1024

_checked: dict[str, str] = {}  # root -> this user's directory there, once checked


def shm_dir(root: str = SHM_ROOT) -> str:
    """This user's private directory for store files under `root`: `fray-<uid>`, made (0700) if missing. If
    another user made that name first (a denial of service to every user of the machine), a name
    with a random part only this user's processes know (`fray-<uid>-<suffix>`, the suffix in ~/.fray, chosen
    again if that name is taken too). FrayError if neither can be had, naming what is in the way."""
    found = _checked.get(root)
    if found is not None:
        return found
    path = os.path.join(root, f"fray-{os.getuid()}")
    why = _own_private_dir(path)
    if why is not None and os.lstat(path).st_uid != os.getuid():  # (this user's own, misconfigured: say how to fix)
        for fresh in (False, True):
            fallback = os.path.join(root, f"fray-{os.getuid()}-{_suffix(fresh)}")
            if _own_private_dir(fallback) is None:
                import warnings

                warnings.warn(f"fray: {why}; this user's store files go to {fallback} instead", stacklevel=2)
                path, why = fallback, None
                break
    if why is not None:
        raise FrayError(why if "chmod" in why else f"{why}, as is the directory fray falls back to: remove them")
    _checked[root] = path
    return path


def _own_private_dir(path: str) -> str | None:
    """Make `path` (0700) if it is missing; None if it is then a real directory of this user's, mode 0700, else
    what it is (said for the user: if it is theirs, how to fix it)."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # (a umask could have dropped bits mkdir asked for)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"fray cannot make its shared-memory directory {path}: {exc}"
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
        return None
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a file"
    fix = f"`chmod 700 {path}`" if st.st_uid == os.getuid() else "it is another user's"
    return (
        f"{path} must be a directory owned by uid {os.getuid()} with mode 0700, but it is {kind} owned by uid "
        f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} ({fix})"
    )


def _suffix(fresh: bool) -> str:
    """The random part of this user's fallback store directory's name, kept in ~/.fray/shm-suffix (0600: other
    users cannot learn it before the directory exists); `fresh`: a new one (the kept one's name was taken)."""
    from pathlib import Path

    from fray.backend import private_dir

    home = Path.home() / ".fray"
    private_dir(home)
    path = home / "shm-suffix"
    if not fresh:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                st = os.fstat(f.fileno())
                value = f.read(64).strip()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and value.isalnum():
                return value
        except OSError:
            pass
    value = secrets.token_hex(8)
    temp = home / f"shm-suffix.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(temp, path)
    return value


def open_segment(name: str, flags: int = os.O_RDONLY) -> int:
    """An fd of this user's store file `name`: never through a symlink, never another user's file."""
    if not name.startswith("fray.") or "/" in name:
        raise FrayError(f"{name!r} is not the name of a fray store file")
    fd = os.open(os.path.join(shm_dir(), name), flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise FrayError(f"{os.path.join(shm_dir(), name)} is not a store file of this user's: refused")
    return fd


def _own_files(directory: str) -> list[os.DirEntry[str]]:
    """The regular files of this user's in `directory` (the names fray reads, accounts and removes)."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError:
        return []
    uid, own = os.getuid(), []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
            own.append(entry)
    return own


def proc_tag(pid: int) -> str | None:
    """pid-starttime of a live process (None if it is gone): survives pid reuse."""
    found = procfs.stat(pid)
    return f"{pid}-{found.start}" if found is not None and found.live else None


def pid_namespace() -> str:
    """This process's pid namespace (its inode number; "" if unknown): pids are only comparable within one."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    inner = link[link.find("[") + 1 : link.rfind("]")]
    return inner if inner.isdigit() else ""


def segment_prefix(ctl: str, host: str) -> str:
    return f"fray.{ctl}.{host}."


def _owner_dead(owner: str) -> bool:
    """`owner` (pid-starttime-namespace) is proven dead: same pid namespace as ours, and no such process."""
    pid, _, rest = owner.partition("-")
    start, _, namespace = rest.partition("-")
    ours = pid_namespace()
    if not (pid.isdigit() and start.isdigit() and ours and namespace == ours):
        return False
    return proc_tag(int(pid)) != f"{pid}-{start}"


def reclaim_dead_segments(root: str = SHM_ROOT) -> int:
    """Remove this user's fray store files whose owner process is proven dead, and the lock files an earlier fray
    made (one per host; it locks the directory now) left with no store file for a minute. Returns how many were
    removed."""
    directory = shm_dir(root)
    removed = 0
    entries = _own_files(directory)
    names = [e.name for e in entries]
    for name in names:
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "fray" and parts[3] == "lock":
            removed += _reclaim_lock(directory, name, names)
            continue
        if len(parts) != 5 or parts[0] != "fray" or not _owner_dead(parts[3]):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed += 1
        except OSError:
            pass
    return removed


def _reclaim_lock(directory: str, name: str, names: list[str]) -> int:
    prefix = name[: -len("lock")]
    if any(n.startswith(prefix) and n != name for n in names):
        return 0
    path = os.path.join(directory, name)
    try:
        if time.time() - os.lstat(path).st_mtime < 60:  # a live context between two chunks: leave it
            return 0
        os.unlink(path)
        return 1
    except OSError:
        return 0


def remove_segments(prefix: str) -> None:
    """Remove this user's store files of one context's host (and the lock file an earlier fray made)."""
    directory = shm_dir()
    for entry in _own_files(directory):
        if entry.name.startswith(prefix):
            try:
                os.unlink(entry.path)
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
        self.dir = shm_dir()
        self.prefix = segment_prefix(ctl, host)
        self.tag = f"{proc_tag(os.getpid()) or os.getpid()}-{pid_namespace()}"
        self.budget = budget
        self.retain = max(RETAIN_FREE, budget // 4)
        self.chunks: dict[str, _Chunk] = {}
        self.allocs: dict[int, tuple[_Chunk, int, int]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.released: deque[int] = deque()  # allocations whose leases died (see Lease)

    def alloc(self, size: int) -> tuple[int, _Chunk, int]:
        """(allocation id, chunk, offset) of `size` page-aligned bytes; ObjectStoreFullError if no room."""
        size = _align(max(size, 1))
        with self.lock:
            self.drain_released()
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
        name = f"{self.prefix}{self.tag}.{secrets.token_hex(8)}"
        path = os.path.join(self.dir, name)
        # The store directory itself is the lock of the host's budget (flock on its fd): a lock file of its own
        # could outlive its users (a host worker that SIGKILLs its processes before their lifelines remove their
        # files left one behind).
        lock_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            used = _host_usage(self.dir, self.prefix)
            if used + size > self.budget:
                raise ObjectStoreFullError(
                    f"the object store of this host is full: {used / 2**20:.0f} MiB used of "
                    f"{self.budget / 2**20:.0f} MiB (object_store_memory), {size / 2**20:.0f} MiB more needed. "
                    "Drop refs to values you no longer need, or raise object_store_memory in the spec."
                )
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # claims the pages now: a full /dev/shm fails here, not at write
            except OSError as exc:
                os.close(fd)
                os.unlink(path)
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise ObjectStoreFullError(
                        f"no room in {SHM_ROOT} for {size / 2**20:.0f} MiB more ({exc.strerror})"
                    ) from exc
                raise
        finally:
            os.close(lock_fd)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.chunks[name] = _Chunk(name, size, fd, mapped, memoryview(mapped), FreeList(size))

    def drain_released(self) -> None:
        """(The caller holds self.lock.) Free the allocations whose leases died since the last drain."""
        while self.released:
            self._free_locked(self.released.popleft())

    def free(self, aid: int) -> None:
        with self.lock:
            self.drain_released()
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
            os.unlink(os.path.join(self.dir, chunk.name))
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

    def live_view(self, aid: int, segment: str, offset: int, length: int) -> memoryview | None:
        """The bytes of allocation `aid` if it is live and is `length` bytes (at most) at `offset` of `segment`;
        None if it was freed or never was (what a transfer server may serve)."""
        with self.lock:
            found = self.allocs.get(aid)
            if found is None:
                return None
            chunk, start, size = found
            if chunk.name != segment or start != offset or length > size or self.chunks.get(segment) is not chunk:
                return None
            return chunk.view[offset : offset + length]


def _host_usage(directory: str, prefix: str) -> int:
    """Bytes of the store files of one host: this user's files only (another's could be made to look huge)."""
    total = 0
    for entry in _own_files(directory):
        if entry.name.startswith(prefix) and not entry.name.endswith(".lock"):
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass
    return total


class Lease:
    """Frees an arena allocation when the views over it are gone."""

    def __init__(self, arena: Arena, aid: int) -> None:
        self.arena, self.aid = arena, aid

    def __del__(self) -> None:
        # Not arena.free here: a finalizer can run inside the arena's own critical section (a garbage collection
        # triggered there). The arena drains these at its next alloc or free.
        self.arena.released.append(self.aid)
