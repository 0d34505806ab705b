"""The monarch data plane on real Monarch processes: zero-copy on one host (same memory, safe against writes),
host to host over loopback TCP (never through the driver), the driver's memory staying flat, store limits,
lost objects, and no shared-memory file left behind however a process ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fray
from fray import ObjectLostError, ObjectStoreFullError, TaskOptions
from fray_monarch.data.arena import proc_tag, shm_dir

MiB = 1024 * 1024


def _fray_files(ctx: Any = None) -> set[str]:
    """fray's store files (in /dev/shm/fray-<uid>): of one context (`fray.<context key>.`), else of every
    context of this user's on the machine."""
    prefix = f"fray.{ctx.ctl.key}." if ctx is not None else "fray."
    return {n for n in os.listdir(shm_dir()) if n.startswith(prefix)}


def _shm_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process mapped from fray's shared-memory files."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith(shm_dir() + "/fray."):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((lo, hi))
    return ranges


def _in_shm(address: int) -> bool:
    return any(lo <= address < hi for lo, hi in _shm_ranges())


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def make_array(n: int) -> np.ndarray:
    return np.full(n, 7, dtype=np.uint8)


def make_tensor(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)


def checksum(a: np.ndarray) -> int:
    return int(a[::4096].astype(np.int64).sum()) + int(a.size)


def shm_stats_of_worker() -> dict[str, int]:
    ctx = fray.get_job_context()
    return {k: v.count for k, v in ctx.transfer_stats().items()}


def crash() -> None:
    os._exit(1)


@pytest.fixture(scope="module")
def ctx() -> Iterator[fray.JobContext]:
    context = fray.init("monarch?procs=2")
    try:
        yield context
    finally:
        fray.shutdown()


def test_numpy_from_a_worker_is_mapped_zero_copy_and_read_only(ctx: fray.JobContext) -> None:
    ref = ctx.create_task(make_array, args=(8 * MiB,))
    first, second = ctx.get(ref, timeout=60), ctx.get(ref, timeout=60)
    assert _in_shm(first.ctypes.data), "the array should live in a fray shared-memory mapping"
    assert not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 1
    assert int(second[0]) == 7


def test_torch_from_a_worker_is_mapped_copy_on_write(ctx: fray.JobContext) -> None:
    ref = ctx.create_task(make_tensor, args=(2 * MiB,))
    first, second = ctx.get(ref, timeout=60), ctx.get(ref, timeout=60)
    assert _in_shm(first.data_ptr()) and _in_shm(second.data_ptr())
    first[0] = -1.0  # private to this reader
    assert second[0].item() == 0.0
    assert ctx.get(ref, timeout=60)[0].item() == 0.0
    assert ctx.get(ctx.create_task(torch.sum, args=(ref,)), timeout=60).item() == float(sum(range(2 * MiB)))


def test_transfer_stats_name_the_paths(ctx: fray.JobContext) -> None:
    before = ctx.transfer_stats()
    ref = ctx.put(np.ones(4 * MiB, dtype=np.uint8))
    assert ctx.get(ctx.create_task(checksum, args=(ref,)), timeout=60) == 4 * MiB // 4096 + 4 * MiB
    ctx.get(ctx.put(3), timeout=60)
    after = ctx.transfer_stats()
    shm_before = before.get("shm", fray.PathStats())
    assert after["shm"].count > shm_before.count and after["shm"].bytes >= shm_before.bytes + 4 * MiB
    assert after["inline"].count > before.get("inline", fray.PathStats()).count


def test_store_full_is_a_clear_error() -> None:
    with fray.init(f"monarch?procs=1&object_store_memory={64 * MiB}") as small:
        with pytest.raises(ObjectStoreFullError, match="object_store_memory"):
            small.put(np.zeros(100 * MiB, dtype=np.uint8))
        with pytest.raises(ObjectStoreFullError):
            small.get(small.create_task(make_array, args=(100 * MiB,)), timeout=60)
        assert small.get(small.create_task(make_array, args=(MiB,)), timeout=60).size == MiB


def test_value_of_a_dead_worker_is_lost_and_its_files_removed() -> None:
    with fray.init("monarch?procs=2") as c:
        ref = c.create_task(make_array, args=(4 * MiB,))
        c.wait([ref], timeout=60)
        before = _fray_files(c)  # this context's only: never kill another fray session's processes
        owners = {n.split(".")[3] for n in before if n.count(".") == 4}  # pid-starttime-namespace
        for tag in owners:  # kill the process that holds the value (the driver's own files have no value yet)
            pid = int(tag.split("-")[0])
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        with pytest.raises(ObjectLostError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                c.get(ref, timeout=30)
                time.sleep(0.2)
        deadline = time.monotonic() + 10
        while any(_tag(f) != proc_tag(os.getpid()) for f in _fray_files(c) if f.count(".") == 4):
            assert time.monotonic() < deadline, _fray_files(c)
            time.sleep(0.2)
        assert c.get(c.create_task(pow, args=(2, 3)), timeout=60) == 8


DRIVER = textwrap.dedent(
    """
    import numpy as np, os, sys, time, fray
    ctx = fray.init("monarch?procs=2")
    ref = ctx.create_task(np.ones, args=(4_000_000,))
    keep = ctx.put(np.ones(4_000_000))
    ctx.wait([ref], timeout=120)
    print("READY", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_files_of_a_killed_driver_are_reclaimed(how: str) -> None:
    before = _fray_files()
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        assert _fray_files() - before, "the driver should have made store files"
        proc.send_signal(getattr(signal, how))
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # the next start reclaims the files of dead processes (and only those)
    with fray.init("monarch?procs=1") as c:
        assert c.get(c.create_task(pow, args=(2, 2)), timeout=60) == 4
        deadline = time.monotonic() + 10
        while _fray_files() - before - {f for f in _fray_files() if _owner_alive(f)}:
            assert time.monotonic() < deadline, _fray_files() - before
            time.sleep(0.2)


def _owner_alive(name: str) -> bool:
    parts = name.split(".")
    if len(parts) != 5:
        return True  # a lock file: removed with its context or a minute after its last store file
    return proc_tag(int(parts[3].split("-")[0])) == _tag(name)


def _tag(name: str) -> str:
    """pid-starttime of the owner of store file `name`."""
    return "-".join(name.split(".")[3].split("-")[:2])


def test_one_gib_between_two_workers_keeps_the_driver_flat(ctx: fray.JobContext) -> None:
    rss_before = _rss()
    ref = ctx.create_task(make_array, args=(1024 * MiB,), options=TaskOptions(max_retries=0))
    assert ctx.get(ctx.create_task(checksum, args=(ref,)), timeout=300) == 1024 * MiB // 4096 * 7 + 1024 * MiB
    assert _rss() - rss_before < 50 * MiB


def matmul_sum(rows: int, projection: np.ndarray) -> float:
    return float((np.ones((rows, projection.shape[0]), dtype=np.float32) @ projection).sum())


def test_many_threads_reading_one_value_while_others_drop_it() -> None:
    """Regression: a mapping unmapped by one thread's finalizer while another thread was handed the same mapping
    crashed the worker (SIGSEGV in the reader)."""
    with fray.init("monarch?procs=2") as c:
        projection = c.put(np.full((1024, 1024), 0.5, dtype=np.float32))
        for _ in range(3):
            sums = c.get([c.create_task(matmul_sum, args=(1000, projection)) for _ in range(32)], timeout=120)
            assert sums == [1000 * 1024 * 1024 * 0.5] * 32


def fill(value: int) -> np.ndarray:
    return np.full(2 * MiB, value % 251, dtype=np.uint8)


def put_inside(value: int) -> list[fray.ObjectRef]:
    return [fray.get_job_context().put(fill(value))]  # a ref made in a worker, returned inside a list


def check(expected: int, array: np.ndarray) -> bool:
    return bool(array.min() == array.max() == expected % 251)


def check_nested(expected: int, refs: list[fray.ObjectRef]) -> bool:
    return check(expected, fray.get_job_context().get(refs[0], timeout=60))


def test_memory_reused_quickly_never_changes_a_live_value(ctx: fray.JobContext) -> None:
    """Freed allocations are reused within milliseconds: a value still referenced (by the driver, a pending task,
    a ref inside a list, a ref made in a worker) must never see another value's bytes."""
    kept = []
    for round_ in range(40):
        put_ref = ctx.put(fill(round_))
        made = ctx.create_task(fill, args=(round_ + 1000,))
        nested = ctx.create_task(put_inside, args=(round_ + 2000,))
        checks = [
            ctx.create_task(check, args=(round_, put_ref)),
            ctx.create_task(check, args=(round_ + 1000, made)),
            ctx.create_task(check_nested, args=(round_ + 2000, nested)),
        ]
        if round_ % 10 == 0:
            kept.append((round_, put_ref, made))
        assert ctx.get(checks, timeout=120) == [True, True, True], round_
        del put_ref, made, nested, checks
    for round_, put_ref, made in kept:  # old values, kept alive all along, are intact
        assert check(round_, ctx.get(put_ref, timeout=60)) and check(round_ + 1000, ctx.get(made, timeout=60))


def test_another_drivers_start_never_touches_our_live_files(ctx: fray.JobContext) -> None:
    ref = ctx.put(np.full(4 * MiB, 9, dtype=np.uint8))
    ours = {f for f in _fray_files() if f.count(".") == 4 and _owner_alive(f)}
    assert ours, "the live context should have store files"
    other = subprocess.run(
        [sys.executable, "-c", "import fray; c = fray.init('monarch?procs=1'); c.get(c.put(1)); fray.shutdown()"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert other.returncode == 0, other.stderr[-2000:]
    assert ours <= _fray_files(), ours - _fray_files()
    assert int(ctx.get(ref, timeout=60)[0]) == 9
