"""What connections to a live page may cost its driver (docs/security.md): a bounded number held, an idle or
trickling one closed at a deadline, a failed accept waited out rather than spun on, and under a flood of idle
connections from another local user the driver's own work goes on and the page's browser is answered at once.
Real in_memory servers, real sockets; the flood comes from user nobody (tests/_flood.py)."""

from __future__ import annotations

import http.client
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from _flood import as_root, idle_connections, open_fds, page_state_took
from _sockets import closed_within

import fray
from fray.context import JobContext
from fray.dashboard import admission
from fray.testing import workloads as h


def _signed_in(ctx: JobContext) -> tuple[int, str, str]:
    """The page's port, the cookie its browser sends back and the page's own path."""
    where = urlsplit(ctx.dashboard())
    assert where.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", where.port, timeout=10)
    conn.request("GET", f"/?{where.query}")
    answer = conn.getresponse()
    assert answer.status == 303
    conn.close()
    return where.port, answer.headers["Set-Cookie"].split(";")[0], answer.headers["Location"]


@pytest.fixture()
def ctx() -> Iterator[JobContext]:
    context = fray.init("in_memory?cpus=2&events=on")
    try:
        yield context
    finally:
        context.shutdown()


def test_a_connection_that_does_not_prove_itself_is_closed_at_its_deadline(
    ctx: JobContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "PROVE_WITHIN", 1.0)
    port, _, _ = _signed_in(ctx)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
    start = time.monotonic()
    closed = False
    trickle.sendall(b"GET / HTTP/1.0\r\n")
    while not closed and time.monotonic() - start < 4:  # a header line every 0.25 s: each read well in time
        try:
            trickle.sendall(b"X-A: b\r\n")
        except OSError:
            break
        closed = closed_within(trickle, 0.25)
    took = time.monotonic() - start
    assert closed or time.monotonic() - start < 4, "a trickling request must not hold its connection"
    assert 0.8 < took < 2.5, took
    assert closed_within(idle, 1.0), "an idle connection must be closed at the same deadline"
    idle.close()
    trickle.close()


def test_one_address_holds_few_unproven_connections_and_the_browser_still_gets_in(ctx: JobContext) -> None:
    port, cookie, page = _signed_in(ctx)
    before = open_fds()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
    try:
        time.sleep(0.3)
        assert page_state_took(port, cookie, page) < 1.0
        closed = sum(closed_within(conn, 0.02) for conn in idle)
        assert closed >= 100 - admission.MAX_UNPROVEN_PER_PEER, closed
        # the server's own file descriptors: only the few it holds (the test's 100 are counted here too)
        assert open_fds() - before <= 100 + admission.MAX_UNPROVEN_PER_PEER + 8
    finally:
        for conn in idle:
            conn.close()


def test_a_failed_accept_is_waited_out_not_spun_on(ctx: JobContext) -> None:
    port, cookie, page = _signed_in(ctx)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    knocker = subprocess.Popen(  # another process: it keeps connecting while this one has no descriptor left
        [sys.executable, "-c", KNOCKER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert knocker.stdout is not None and knocker.stdout.readline().strip() == "knocking"
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + 16, hard))
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass  # every descriptor taken: the server's accept fails with EMFILE from here on
        start_cpu, start = sum(os.times()[:2]), time.monotonic()
        time.sleep(1.5)
        busy = (sum(os.times()[:2]) - start_cpu) / (time.monotonic() - start)
        for fd in fillers:
            os.close(fd)
        fillers.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert busy < 0.3, f"the server spun on its listening socket: {busy:.0%} of a core"
        time.sleep(1.2)  # the longest pause
        assert page_state_took(port, cookie, page) < 1.0  # and it accepts again once descriptors are free
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        knocker.kill()
        knocker.wait(timeout=30)


KNOCKER = """
import socket, sys, time
print("knocking", flush=True)
held = []
while True:
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1))
    except OSError:
        pass
    held = held[-200:]
    time.sleep(0.01)
"""


@as_root
def test_a_flood_of_idle_connections_leaves_the_driver_working_and_the_page_answering(ctx: JobContext) -> None:
    port, cookie, page = _signed_in(ctx)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = open_fds()
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + 200, hard))  # far fewer than the flood's connections
    try:
        with idle_connections([f"127.0.0.1:{port}"], 1000) as connected:
            assert connected >= 900, connected
            time.sleep(0.5)
            assert open_fds() - before <= admission.MAX_CONNECTIONS + 8
            with tempfile.TemporaryFile() as f:
                f.write(b"the driver's own work")
            assert ctx.get([ctx.create_task(h.add, args=(i, 1)) for i in range(20)], timeout=30) == list(range(1, 21))
            assert max(page_state_took(port, cookie, page) for _ in range(5)) < 1.0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
