"""Several fray hosts on this machine, for the monarch tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from fray.groups import free_ports


@contextmanager
def host_workers(count: int) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    """`count` fray hosts on this machine (`python -m fray_monarch.worker` on loopback): their addresses and
    processes, killed on exit."""
    addresses = [f"tcp://127.0.0.1:{port}" for port in free_ports(count)]
    workers = [
        subprocess.Popen([sys.executable, "-m", "fray_monarch.worker", "--address", addr], start_new_session=True)
        for addr in addresses
    ]
    try:
        yield addresses, workers  # no wait for them to listen: Monarch's attach retries until they do
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
