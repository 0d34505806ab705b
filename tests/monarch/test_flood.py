"""A flood of idle connections from another local user (nobody) against every server a driver may run: the live
page, the lifeline and the transfer server, 1,000 connections each, at once. The driver's own work goes on (it can
still open files and run tasks, with a file descriptor limit far below the flood's size) and each server answers a
peer that proves itself within a second. Real servers and real sockets on loopback (tests/_flood.py)."""

from __future__ import annotations

import http.client
import resource
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import numpy as np
import pytest
from _flood import as_root, idle_connections, open_fds, page_state_took

import fray
from fray.runtime.serialization import dumps
from fray.testing import workloads as h
from fray_monarch.data import transfer
from fray_monarch.data.store import ObjectStore
from fray_monarch.net import lifeline

MiB = 1024 * 1024


@pytest.fixture()
def servers() -> Iterator[tuple[fray.JobContext, lifeline.LifelineServer, ObjectStore]]:
    ctx = fray.init("in_memory?cpus=2&events=on")
    server = lifeline.LifelineServer("127.0.0.1")
    store = ObjectStore("zzflood", "h1", "proc-h1", 64 * MiB, "127.0.0.1", lambda oid: None, MiB, "tcp", True)
    try:
        yield ctx, server, store
    finally:
        store.close()
        server.close()
        ctx.shutdown()


@as_root
def test_a_flood_of_idle_connections_against_every_server_leaves_the_driver_working(
    servers: tuple[fray.JobContext, lifeline.LifelineServer, ObjectStore],
) -> None:
    ctx, server, store = servers
    where = urlsplit(ctx.dashboard())
    assert where.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", where.port, timeout=10)
    conn.request("GET", f"/?{where.query}")
    headers = conn.getresponse().headers
    cookie, page = headers["Set-Cookie"].split(";")[0], headers["Location"]
    conn.close()
    value = store.put(dumps(np.arange(2 * MiB, dtype=np.uint8)), "zzflood-l.1")
    assert store.server is not None
    targets = [f"127.0.0.1:{where.port}", server.address, store.server.address]

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = open_fds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + 400, hard))  # far below the flood's 3,000
    lost: list[str] = []
    conns = transfer.Connections()
    try:
        with idle_connections(targets, 1000) as connected:
            assert connected >= 2700, connected
            time.sleep(0.5)
            assert open_fds() - before < 250, "the servers hold a bounded number of connections"
            with tempfile.TemporaryFile() as f:
                f.write(b"the driver's own work")
            assert ctx.get([ctx.create_task(h.add, args=(i, 1)) for i in range(20)], timeout=30) == list(range(1, 21))

            assert max(page_state_took(where.port, cookie, page) for _ in range(3)) < 1.0

            start = time.monotonic()
            lifeline.hold(server.address, server.key_for("proc-a"), on_lost=lost.append, name="proc-a")
            while server.held < 1:
                assert time.monotonic() - start < 1.0, "a process was not held within 1 s"
                time.sleep(0.01)

            start = time.monotonic()
            target = memoryview(bytearray(value.length))
            transfer.fetch(conns, value, 0, value.length, target)
            assert time.monotonic() - start < 1.0
            piece = value.buffers[0]
            assert (
                bytes(target[piece.offset : piece.offset + piece.length])
                == np.arange(2 * MiB, dtype=np.uint8).tobytes()
            )
        assert lost == [], "no process took the flood for its driver's end"
    finally:
        conns.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
