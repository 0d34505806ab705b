"""Tests of the Monarch backend itself (real Monarch processes, no mocks). Skipped where it is not installed."""

from collections.abc import Iterator

import pytest

pytest.importorskip("fray_monarch")

from _netns import Host, namespaced_hosts, require_namespaced_hosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[Host]]:
    """Three namespaced hosts (their own address, hostname, loopback and /dev/shm) for a module's multi-host cases;
    skipped, saying why, where namespaces cannot be made."""
    require_namespaced_hosts()
    with namespaced_hosts(3) as made:
        yield made
