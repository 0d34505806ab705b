"""Processes fray starts on other hosts end when their driver ends, however it ends.

On this machine fray's watchdog kills what a dead driver left (fray.watchdog); it cannot reach other machines,
and Monarch 0.7 leaves a client's processes running on attached hosts when the client is SIGKILLed (seen: still
there minutes later). So every process fray starts on an attached or launched host holds one TCP connection to
its driver's lifeline server: when the driver's process ends, the kernel closes that connection and the process
ends itself. A driver whose machine vanished without closing anything is noticed by TCP keepalive, within
KEEPALIVE_BOUND seconds.

A connection proves itself with the context's random token, then names its process (its key), before the server
keeps it; the server never reads anything else from it, never sends anything, and drops connections that do not
prove themselves in time. The same connections tell the driver at once when a process on another host ends, or its
host is lost (`on_closed`): Monarch's supervision took up to 30 s to report a host whose processes were killed.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["KEEPALIVE_BOUND", "LifelineServer", "end_process", "hold"]

log = logging.getLogger("fray_monarch")

TOKEN_BYTES = 32
PROVE_WITHIN = 10.0  # seconds a new connection has to send its token
MAX_UNPROVEN = 64  # connections that have not proven themselves yet; more are closed at once
CONNECT_FOR = 60.0  # seconds a process keeps trying to reach its driver before it gives up and ends
_IDLE, _INTERVAL, _COUNT = 5, 2, 3
KEEPALIVE_BOUND = _IDLE + _INTERVAL * _COUNT  # seconds until a silent peer counts as gone


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", _IDLE), ("TCP_KEEPINTVL", _INTERVAL), ("TCP_KEEPCNT", _COUNT)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class LifelineServer:
    """The driver's end: accepts the connections of its processes on other hosts and keeps them open."""

    def __init__(self, bind: str, on_closed: Callable[[str], None] | None = None) -> None:
        """on_closed(name) is called (on the server's thread) when the connection of a process that proved itself
        closes while the server runs: that process ended, or its host is gone."""
        self._on_closed = on_closed
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind, 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        port = self._listener.getsockname()[1]
        self.address = f"[{bind}]:{port}" if family == socket.AF_INET6 else f"{bind}:{port}"
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._unproven: dict[socket.socket, tuple[float, bytearray]] = {}
        self._held: dict[socket.socket, str] = {}  # proven connections -> the name of their process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fray-monarch-lifeline", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        """How many processes hold a lifeline now."""
        return len(self._held)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=1.0)
            except OSError:
                return
            for key, _ in events:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if key.data is None:
                    self._accept()
                else:
                    self._readable(sock)
            now = time.monotonic()
            for sock, (since, _) in list(self._unproven.items()):
                if now - since > PROVE_WITHIN:
                    self._drop(sock)

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        if len(self._unproven) >= MAX_UNPROVEN:
            conn.close()
            return
        conn.setblocking(False)
        _keepalive(conn)
        self._unproven[conn] = (time.monotonic(), bytearray())
        self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _readable(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(TOKEN_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the process at the other end ended (or never proved itself)
            self._drop(sock)
            return
        pending = self._unproven.get(sock)
        if pending is None:
            return  # a proven process sends nothing more; ignore anything it does
        got = pending[1]
        got.extend(data)
        if len(got) < TOKEN_BYTES + 1 or len(got) < TOKEN_BYTES + 1 + got[TOKEN_BYTES]:
            return  # (the token, then the length of the process's name, then the name)
        del self._unproven[sock]
        if hmac.compare_digest(bytes(got[:TOKEN_BYTES]), self.token):
            self._held[sock] = bytes(got[TOKEN_BYTES + 1 : TOKEN_BYTES + 1 + got[TOKEN_BYTES]]).decode(errors="replace")
        else:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._unproven.pop(sock, None)
        name = self._held.pop(sock, None)
        if name is not None and self._on_closed is not None and not self._stop.is_set():
            try:
                self._on_closed(name)
            except Exception:
                log.debug("fray: lifeline close of %s not handled", name, exc_info=True)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [*self._unproven, *self._held]:
            self._drop(sock)
        try:
            self._sel.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._sel.close()


def end_process(address: str) -> None:
    print(f"fray: this process's driver ({address}) is gone; ending it", file=sys.stderr, flush=True)
    os._exit(70)


def hold(address: str, token: bytes, on_lost: Callable[[str], None] = end_process, name: str = "") -> threading.Thread:
    """This process's end: connect to the driver's lifeline at `address` ("host:port"), as `name` (its key, at most
    255 bytes), and call on_lost(address) when the connection ends (or when the driver could not be reached for
    CONNECT_FOR seconds). By default that ends this process at once: its driver is gone, so nothing will ever
    collect its results."""
    label = name.encode()[:255]
    host, _, port = address.rpartition(":")

    def run() -> None:
        deadline = time.monotonic() + CONNECT_FOR
        sock: socket.socket | None = None
        while sock is None:
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            except OSError:
                if time.monotonic() > deadline:
                    on_lost(address)
                    return
                time.sleep(0.5)
        try:
            _keepalive(sock)
            sock.settimeout(None)
            sock.sendall(token + bytes([len(label)]) + label)
            while sock.recv(4096):
                pass
        except OSError:
            pass
        finally:
            sock.close()
        on_lost(address)

    thread = threading.Thread(target=run, name="fray-monarch-lifeline", daemon=True)
    thread.start()
    return thread
