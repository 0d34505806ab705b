"""Several fray hosts on this machine, for the monarch tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def host_workers(count: int) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    """`count` fray hosts on this machine (`python -m fray_monarch.worker` on loopback): their addresses and
    processes, killed on exit."""
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(count)]
    workers = [
        subprocess.Popen([sys.executable, "-m", "fray_monarch.worker", "--address", addr], start_new_session=True)
        for addr in addresses
    ]
    try:
        time.sleep(2)
        yield addresses, workers
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
