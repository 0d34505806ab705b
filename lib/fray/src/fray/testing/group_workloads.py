"""Classes and functions the group, streaming and async conformance tests send to workers. They synchronize
through files (flags), never through sleeps, so the tests hold on a loaded machine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fray
from fray.testing.workloads import wait_for_file


class Member:
    """A group member that reports who it is."""

    def __init__(self, base: int = 0) -> None:
        me = fray.current_actor()
        self.rank_at_init = me.rank
        self.base = base

    def whoami(self) -> dict[str, Any]:
        me = fray.current_actor()
        return {"rank": me.rank, "size": me.size, "name": me.name, "init_rank": self.rank_at_init}

    def scaled(self, x: int) -> int:
        return self.base + x * (fray.current_actor().rank + 1)

    def handles(self) -> str:  # a method whose name a group attribute takes: called with group.call("handles")
        return f"rank {fray.current_actor().rank}"

    def pid(self) -> int:
        return os.getpid()

    def crash(self) -> None:
        os._exit(1)

    def fail_or_wait(self, flag: str) -> int:
        """Rank 0 raises at once; the others return only when the flag exists."""
        rank = fray.current_actor().rank
        if rank == 0:
            raise ValueError("rank 0 fails")
        wait_for_file(flag, timeout=120)
        return rank

    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}


class MemberHoldingItsInterpreter(Member):
    """A group member whose __init__ keeps its process's interpreter for `seconds` whole seconds, as a slow C
    extension may (libc's sleep called holding the GIL): no thread of its process runs meanwhile, nor answers."""

    def __init__(self, seconds: int) -> None:
        import ctypes

        super().__init__()
        ctypes.PyDLL(None).sleep(seconds)


class GlooMember:
    """An SPMD member: torch.distributed initialized in __init__ from the environment fray set."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
        self.rank = dist.get_rank()

    def all_reduce(self, value: float) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return [float(x) for x in t]

    def world(self) -> tuple[int, int, str | None, str | None]:
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size(), os.environ.get("LOCAL_RANK"), os.environ.get("MASTER_ADDR")

    def master_addr(self) -> str:
        return os.environ["MASTER_ADDR"]

    def rendezvous_listeners(self) -> list[str]:
        """The addresses on which something on this host listens on MASTER_PORT (the group's rendezvous store,
        served in rank 0's process): from /proc/net/tcp and tcp6."""
        return listening_addresses(int(os.environ["MASTER_PORT"]))

    def all_reduce_noting(self, value: float, flag: str) -> list[float]:
        """all_reduce, writing `flag` first: the test knows this rank is inside the collective."""
        Path(flag).write_text("in")
        return self.all_reduce(value)

    def crash_now(self) -> None:
        os._exit(1)

    def facts(self) -> dict[str, Any]:
        """This member's process, restart count and rendezvous port."""
        me = fray.current_actor()
        return {"pid": os.getpid(), "restarts": me.restarts, "rank": me.rank, "port": os.environ.get("MASTER_PORT")}


class GlooMemberRestartingSlowly(GlooMember):
    """A GlooMember whose __init__ takes `delay` seconds more when its group restarts (before the rendezvous)."""

    def __init__(self, delay: float) -> None:
        if fray.current_actor().restarts:
            time.sleep(delay)
        super().__init__()


def use_group(group: Any, x: int) -> list[int]:
    """A group passed into a task is used there like a handle."""
    ctx = fray.get_job_context()
    return list(ctx.get(group.scaled(x), timeout=60))


def count_up(n: int) -> Iterator[int]:
    yield from range(n)


def first_then_wait(flag: str, timeout: float = 60.0) -> Iterator[str]:
    """Yields "first", then waits for the consumer's flag before yielding "second": if items only arrived when the
    generator finished, the consumer would never see "first" in time and write the flag."""
    yield "first"
    try:
        wait_for_file(flag, timeout)
        yield "second"
    except TimeoutError:
        yield "second came late: the first item was not streamed"


def fail_after(n: int) -> Iterator[int]:
    yield from range(n)
    raise ValueError(f"failed after {n} items")


def endless(progress: str) -> Iterator[int]:
    """Yields forever, recording how far it got: a stream closed early must stop it."""
    i = 0
    while True:
        Path(progress).write_text(str(i))
        yield i
        i += 1
        time.sleep(0.01)


def large_items(n: int, size: int) -> Iterator[bytes]:
    for i in range(n):
        yield bytes([i % 256]) * size


class Streamer:
    def __init__(self) -> None:
        self.calls = 0

    def numbers(self, n: int) -> Iterator[int]:
        self.calls += 1
        for i in range(n):
            yield i * 10

    def first_then_wait(self, flag: str) -> Iterator[str]:
        yield from first_then_wait(flag)

    def endless(self, progress: str) -> Iterator[int]:
        yield from endless(progress)

    def fail_after(self, n: int) -> Iterator[int]:
        yield from fail_after(n)

    def count(self) -> int:
        return self.calls


def wait_then(flag: str, value: Any, timeout: float = 60.0) -> Any:
    wait_for_file(flag, timeout)
    return value


class AsyncActor:
    """async methods on the actor's event loop: `meet` returns only once `n` calls are inside it at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.peak = 0
        self.arrived: asyncio.Event | None = None

    async def meet(self, n: int, timeout: float = 30.0) -> int:
        if self.arrived is None:
            self.arrived = asyncio.Event()
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        if self.inside >= n:
            self.arrived.set()
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return -1
        finally:
            self.inside -= 1
        return self.peak

    async def add(self, a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    async def fail(self, message: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(message)

    async def whoami(self) -> str | None:
        return fray.current_actor().name

    def sync_peak(self) -> int:
        return self.peak


def listening_addresses(port: int) -> list[str]:
    """The local addresses of the TCP sockets listening on `port` in this network namespace."""
    import ipaddress
    import socket
    import struct

    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            words = [int(address[i : i + 8], 16) for i in range(0, len(address), 8)]  # host-order 32-bit words
            packed = b"".join(struct.pack("=I", w) for w in words)
            found.append(str(ipaddress.ip_address(packed if family == socket.AF_INET6 else packed[:4])))
    return sorted(found)
