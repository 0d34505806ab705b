"""Ports and addresses of this machine, for what fray starts (a Ray head's ports, an SPMD group's MASTER_PORT)."""

from __future__ import annotations

import errno
import ipaddress
import secrets
import socket
from contextlib import ExitStack

__all__ = ["free_port", "free_ports", "is_loopback"]


# Ports handed to a listener that binds them later (a Ray head's, an SPMD group's MASTER_PORT) are picked at
# random below the kernel's ephemeral range: a port there is taken meanwhile only by another explicit bind, never
# by a connect or a bind to port 0, which every process does all the time (a gloo rendezvous failed with
# EADDRINUSE on a port the kernel had just handed to something else: CI). Above Ray's default worker
# ports (10002-19999), which its workers bind explicitly.
_PICK_FROM = 20000
_PICK_TRIES = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on this host now, outside the ephemeral range (for MASTER_PORT)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """count distinct TCP ports free on this host now, outside the ephemeral range where it leaves room (else
    any the kernel gives). The sockets stay bound until all are chosen: ports picked and released one at a time
    may repeat (9 in a row held a duplicate about 1 time in 450 here)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    below = _ephemeral_low()
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            ports.append(_bind_one(sock, host, below))
        return ports


def _bind_one(sock: socket.socket, host: str, below: int) -> int:
    """Bind sock to a random free port in [_PICK_FROM, below), or to one the kernel picks if none is found."""
    if below - _PICK_FROM >= 1000:
        for _ in range(_PICK_TRIES):
            port = secrets.randbelow(below - _PICK_FROM) + _PICK_FROM
            try:
                sock.bind((host, port))
                return port
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
    sock.bind((host, 0))
    return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of this network namespace's ephemeral range (Linux's default: 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
