"""Reaching other machines: the address this driver listens on, Monarch's transport, and attaching to hosts.

A Monarch client listens on a Unix socket unless told otherwise before its runtime starts, and no other machine
can reach a Unix socket: an attach to workers on another machine then times out after a minute with nothing
said. Host workers on 127.0.0.1 of the same machine hide this (a Unix socket is reachable there). So whenever
processes on other machines take part (`hosts=`, `job=`), fray sets a network transport first, bound to one
address of this machine, the one that routes to the hosts (or `bind=`), never to every interface: TLS (tls.py)
unless the spec says `insecure=true`, then plain TCP.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from fray.backend import is_loopback
from fray.errors import FrayError
from fray_monarch.net import tls

__all__ = [
    "attach",
    "host_of",
    "is_loopback",
    "resolve",
    "route_address",
    "transport_started",
    "use_network",
]

PROBE_TIMEOUT = 3.0  # seconds a connect to a silent host worker is given when telling why an attach failed


def host_of(address: str) -> tuple[str, int]:
    """("host", port) of a worker address: `tls://host:port`, `tcp://[v6]:port`, or Monarch's `id@tls://...`."""
    tail = address.rsplit("@", 1)[-1]
    if "://" not in tail:
        raise ValueError(f"a host worker address looks like tls://HOST:PORT (or tcp://), got {address!r}")
    scheme, _, rest = tail.partition("://")
    host, sep, port = rest.rpartition(":")
    network = scheme in ("tcp", "tls")
    if scheme not in ("tcp", "tls", "ipc") or (network and (not sep or not port.isdigit() or not host)):
        raise ValueError(f"a host worker address looks like tls://HOST:PORT (or tcp://), got {address!r}")
    return host.strip("[]"), int(port) if port.isdigit() else 0


def resolve(host: str) -> str:
    """The IP address of a host name (or the address itself)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:
        raise FrayError(f"the host name {host!r} does not resolve on this machine ({exc})") from None


def route_address(hosts: Sequence[str]) -> str | None:
    """The address of this machine that routes to the first of `hosts` that is not loopback (None: all are)."""
    for host in hosts:
        if is_loopback(host):
            continue
        ip = resolve(host)
        if ipaddress.ip_address(ip).is_loopback:
            continue
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # no packet is sent: the kernel picks a route
            try:
                probe.connect((ip, 9))
            except OSError as exc:
                raise FrayError(f"this machine has no route to host {host} ({ip}): {exc}") from None
            return str(probe.getsockname()[0])
    return None


def _monarch_transport() -> tuple[bool, str | None]:
    """(has this process's Monarch runtime started, the transport enabled or None for Monarch's default Unix)."""
    from monarch._src.actor import actor_mesh  # Monarch 0.7's own record of both (no public query exists)

    current = getattr(actor_mesh, "_transport", None)
    return actor_mesh._context.get() is not None, None if current is None else str(current)


def transport_started() -> bool:
    return _monarch_transport()[0]


def scheme_of(address: str) -> str:
    """ "tls", "tcp" or "ipc": the channel of a worker address (Monarch's `id@` prefix aside)."""
    return address.rsplit("@", 1)[-1].partition("://")[0]


def use_network(bind: str, secure: bool) -> str:
    """Make this process's Monarch transport TLS (secure, with an identity for `bind` and this machine's names
    from the user's authority) or TCP on `bind` (a port the kernel picks), before its runtime starts. Returns
    the transport in use: a network transport enabled earlier (by the user, or a Monarch job object) is kept.
    Raises FrayError if the runtime already started on Unix sockets (Monarch fixes a process's transport for its
    whole life), or started on TCP where TLS is asked for."""
    from monarch.actor import enable_transport

    started, current = _monarch_transport()
    if current is not None and current.startswith(("tcp", "Tcp", "metatls", "tls", "Tls")):
        if secure and current.lower().startswith("tcp"):
            raise FrayError(
                f"this process's Monarch transport is plain TCP ({current}) and cannot change: hosts over TLS need "
                "a new process, or insecure=true with workers started with --insecure (on a trusted network)"
            )
        return current
    if started:
        raise FrayError(
            "this process's Monarch runtime already started on Unix sockets (an earlier fray monarch context "
            "without hosts=/job=, or your own Monarch code), and other machines cannot reach a Unix socket; Monarch "
            "cannot change a process's transport once it started. Fix: run the multi-host context in a new process, "
            "or make this program's first Monarch use a multi-host one: fray.init with hosts= or job= (or bind=ADDR "
            'on a local context), or monarch.actor.enable_transport("tcp") before anything else uses Monarch.'
        )
    scheme = "tls" if secure else "tcp"
    if secure:
        tls.install(tls.issue(tls.own_names(bind)))
    spec = f"{scheme}://[{bind}]:0" if ":" in bind else f"{scheme}://{bind}:0"
    enable_transport(spec)
    return spec


def why_silent(address: str) -> str | None:
    """Why nothing answers at a host worker's address, or None if something accepts connections there."""
    host, port = host_of(address)
    if scheme_of(address) == "ipc":
        return None
    try:
        ip = resolve(host)
    except FrayError as exc:
        return str(exc)
    try:
        with socket.create_connection((ip, port), timeout=PROBE_TIMEOUT):
            return None
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except TimeoutError:
        return f"no answer within {PROBE_TIMEOUT:g} s: unreachable or filtered"
    except OSError as exc:
        return str(exc)


def attach(
    addresses: list[str],
    timeout: float,
    bind: str | None,
    failed: Callable[[], str] = lambda: "",
    name: str = "fray_hosts",
) -> Any:
    """One Monarch host mesh (dimension "hosts") over the host workers at `addresses`, once every one answered;
    FrayError naming the hosts that did not, and how long this waited, if they have not within `timeout` (at once
    if `failed()` says why they never will: a launch that ended)."""
    from monarch.actor import attach_to_workers

    start = time.monotonic()
    mesh = attach_to_workers(workers=addresses, ca="trust_all_connections", name=name)
    try:
        while True:  # a timed-out get leaves the future as it was: ask again after checking the launch
            try:
                mesh.initialized.get(timeout=min(1.0, max(0.01, start + timeout - time.monotonic())))
                break
            except TimeoutError:
                launch = failed()
                if launch:
                    raise FrayError(f"the hosts' launch failed:{launch}") from None
                if time.monotonic() - start >= timeout:
                    raise
    except FrayError:
        raise
    except Exception as exc:
        waited = time.monotonic() - start
        silent = {a: reason for a in addresses if (reason := why_silent(a)) is not None}
        if silent:
            listed = "; ".join(f"{a}: {reason}" for a, reason in silent.items())
            raise FrayError(
                f"attaching to {len(addresses)} host(s) failed after {waited:.0f} s: {len(silent)} did not answer "
                f"({listed}). Start a host worker there (`python -m fray_monarch.worker --address ADDRESS`) or "
                "correct the address."
            ) from exc
        where = f"this driver's address {bind}" if bind else "this driver"
        secure = any(scheme_of(a) == "tls" for a in addresses)
        mismatch = (
            f" Over TLS, a worker with a certificate from another authority (each host's {tls.TLS_DIR_ENV} or "
            "~/.fray/tls must hold the same one: copy the driver's) or a worker serving plain TCP (started "
            "with --insecure) looks the same: its log says which."
            if secure
            else " A worker serving TLS (started without --insecure) looks the same: attach with tls://."
        )
        raise FrayError(
            f"attaching to the host workers at {', '.join(addresses)} failed after {waited:.0f} s: they accept "
            f"connections but did not finish attaching ({type(exc).__name__}: {exc}). Monarch's hosts connect back "
            f"to {where}: check that they can reach it (a firewall, or the wrong interface on a machine with "
            f"several: set bind=ADDRESS to one they can reach).{mismatch}"
        ) from exc
    return mesh
