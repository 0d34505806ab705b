"""Idle connections from another local user (nobody, through setpriv; needs root): what anyone who can reach a
loopback port can open against a server of the driver's."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from _sockets import unguarded_env

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root (setpriv)")

# As nobody: open COUNT connections to each "host:port" in argv[2:], ten at a time (non-blocking: a server that does
# not accept fast leaves them waiting in its backlog), from source addresses spread over 127/8 (every local user
# has all of them), the first of every four from 127.0.0.1; wait until they are connected (or 20 s), say how many
# are (a connect that failed is not counted), then hold them, sending nothing, until stdin closes.
FLOODER = r"""
import resource, selectors, socket, sys, time
count, targets = int(sys.argv[1]), sys.argv[2:]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
sel = selectors.DefaultSelector()
held = []
for target in targets:
    host, _, port = target.rpartition(":")
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind(("127.0.0.1" if i % 4 == 0 else f"127.0.{i // 200 + 1}.{i % 200 + 2}", 0))
        s.connect_ex((host, int(port)))
        sel.register(s, selectors.EVENT_WRITE)
        held.append(s)
        if i % 10 == 9:
            time.sleep(0.002)  # paced: a burst beyond the listen backlog would meet the kernel's SYN cookies
deadline, connected = time.monotonic() + 20, 0
while connected < len(held) and time.monotonic() < deadline:
    for key, _ in sel.select(1):
        sel.unregister(key.fileobj)
        connected += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
print("ready", connected, flush=True)
sys.stdin.read()
"""


@contextmanager
def idle_connections(targets: list[str], count: int = 1000) -> Iterator[int]:
    """`count` idle connections from user nobody to each target ("host:port") while the block runs; yields how
    many connected."""
    env = unguarded_env()  # root's guard: nobody cannot read it
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    proc = subprocess.Popen(
        [*as_nobody, sys.executable, "-c", FLOODER, str(count), *targets],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            proc.kill()
            pytest.fail(f"the flood did not start: {line} {proc.communicate(timeout=30)[1][-2000:]}")
        yield int(line[1])
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def page_state_took(port: int, cookie: str, page: str) -> float:
    """Seconds the live page at `page` (its own path) on `port` took to answer a signed-in state request."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"{page}api/state?since=0", headers={"Cookie": cookie})
        answer = conn.getresponse()
        assert answer.status == 200 and answer.read().startswith(b"{")
    finally:
        conn.close()
    return time.monotonic() - start
