"""Load and repetition on every installed backend: nothing lost under 10k tasks and many actors, 500 MB values,
and init/shutdown cycles that leave no growth in threads, file descriptors, processes, temp entries or shared
memory behind."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import fray
from fray.host import procfs

BACKENDS = [b for b in ("in_memory", "monarch", "ray") if b in fray.available_backends()]
SPECS = {
    "in_memory": "in_memory?cpus=2",
    "monarch": "monarch?procs=2",
    "ray": "ray?num_cpus=2&object_store_memory=1200000000&log_to_driver=false",
}
# A Ray actor is a process of its own (~100 MB, ~1 CPU s to start): many of them at once are the suite's
# test_50_actors; here a few show that actors still start and answer on an instance the 10,000 tasks went through.
ACTORS = {"in_memory": 100, "monarch": 100, "ray": 5}
CYCLES = {"in_memory": 30, "monarch": 5, "ray": 2}


def add_one(x: int) -> int:
    return x + 1


def checksum(a: np.ndarray) -> int:
    return int(a[::4096].sum()) + int(a.size)


def big(n: int) -> np.ndarray:
    return np.full(n, 3, dtype=np.uint8)


class Keeper:
    def __init__(self, i: int) -> None:
        self.i = i

    def who(self) -> int:
        return self.i


def _installed(backend: str) -> None:
    if backend not in BACKENDS:
        pytest.skip(f"backend {backend!r} is not installed")


@pytest.mark.parametrize("backend", ["in_memory", "monarch", "ray"])
def test_ten_thousand_tasks_and_many_actors_lose_nothing(backend: str) -> None:
    _installed(backend)
    with fray.init(SPECS[backend]) as ctx:
        refs = [ctx.create_task(add_one, args=(i,)) for i in range(10_000)]
        assert ctx.get(refs, timeout=600) == [i + 1 for i in range(10_000)]
        actors = [ctx.create_actor(Keeper, args=(i,)) for i in range(ACTORS[backend])]
        assert ctx.get([a.who() for a in actors], timeout=600) == list(range(ACTORS[backend]))


@pytest.mark.parametrize("backend", ["in_memory", "monarch", "ray"])
def test_500_mb_values(backend: str) -> None:
    _installed(backend)
    n = 500 * 1024 * 1024
    want = n // 4096 * 3 + n
    with fray.init(SPECS[backend]) as ctx:
        made = ctx.create_task(big, args=(n,))
        assert ctx.get(ctx.create_task(checksum, args=(made,)), timeout=600) == want
        assert checksum(ctx.get(made, timeout=600)) == want
        del made
        put = ctx.put(big(n))
        assert ctx.get(ctx.create_task(checksum, args=(put,)), timeout=600) == want


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> int:
    return len(procfs.children_of(os.getpid()))


def _shm() -> set[str]:
    directory = f"/dev/shm/fray-{os.getuid()}"  # the monarch backend's store files
    return {n for n in os.listdir(directory) if n.startswith("fray")} if os.path.isdir(directory) else set()


def _temp_entries() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("fray")}


@pytest.mark.parametrize("backend", ["in_memory", "monarch", "ray"])
def test_init_shutdown_cycles_leave_no_growth(backend: str) -> None:
    _installed(backend)

    def cycle() -> None:
        ctx = fray.init(SPECS[backend])
        ctx.get([ctx.create_task(add_one, args=(i,)) for i in range(4)], timeout=120)
        ctx.get(ctx.create_actor(Keeper, args=(1,)).who(), timeout=120)
        ctx.get(ctx.put(np.ones(2 * 1024 * 1024)), timeout=120)
        fray.shutdown()

    cycle()  # the first one loads modules and starts process-wide helpers (e.g. the watchdog)
    time.sleep(1)
    before = (threading.active_count(), _fds(), _children(), _shm(), _temp_entries())
    for _ in range(CYCLES[backend]):
        cycle()
    deadline = time.monotonic() + 15
    while True:
        after = (threading.active_count(), _fds(), _children(), _shm(), _temp_entries())
        grown = {
            "threads": after[0] - before[0],
            "fds": after[1] - before[1],
            "child processes": after[2] - before[2],
            "shm": sorted(after[3] - before[3]),
            "temp entries": sorted(after[4] - before[4]),
        }
        clean = grown["threads"] <= 1 and grown["fds"] <= 2 and grown["child processes"] <= 0
        if clean and not grown["shm"] and not grown["temp entries"]:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{CYCLES[backend]} init/shutdown cycles of {backend} left: {grown}")
        time.sleep(0.5)
