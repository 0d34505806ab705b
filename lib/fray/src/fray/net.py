"""Ports and addresses of this machine, for what fray starts (a Ray head's ports, an SPMD group's MASTER_PORT)."""

from __future__ import annotations

import ipaddress
import socket
from contextlib import ExitStack

__all__ = ["free_port", "free_ports", "is_loopback"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on this host now (for MASTER_PORT)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """count distinct TCP ports free on this host now. The sockets stay bound until all are chosen: ports picked
    and released one at a time may repeat (9 in a row held a duplicate about 1 time in 450 here)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(family, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def is_loopback(host: str) -> bool:
    """`host` is this machine's loopback (127.0.0.0/8, ::1, an IPv4-mapped loopback, or "localhost")."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
