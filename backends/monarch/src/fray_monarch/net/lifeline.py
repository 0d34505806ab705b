"""Processes fray starts on other hosts end when their driver ends, however it ends.

On this machine fray's watchdog kills what a dead driver left (fray.host.watchdog); it cannot reach other machines,
and Monarch 0.7 leaves a client's processes running on attached hosts when the client is SIGKILLed (seen: still
there minutes later). So every process fray starts on an attached or launched host holds one TCP connection to
its driver's lifeline server: when the driver's process ends, the kernel closes that connection and the process
ends itself. A driver whose machine vanished without closing anything is noticed by TCP keepalive, within
KEEPALIVE_BOUND seconds.

Each process gets a key of its own, bound to its name (its process key): an HMAC of the name under a secret of
the server's that never leaves the driver (`LifelineServer.key_for`), handed to the process over the control
plane. On the lifeline's plain TCP the key itself never travels: the server sends each connection a fresh random
challenge, and the process answers with its name and an HMAC of challenge and name under its key, checked in
constant time. So a process can only speak for itself, and what a listener on the network sees cannot be replayed
(the next challenge differs). A name is held by one connection once: a second claim of it, while it is held or
after its connection closed, is refused, and refused connections never count as a process ending. Beyond the
challenge and one byte of verdict (HELD, or REFUSED before it closes a connection whose proof failed) the server
sends nothing, reads nothing once a connection has proved itself, and unpickles nothing.

Anyone who can reach the server's port can open connections that never prove themselves, so those give way: at
most MAX_UNPROVEN wait at once, at most MAX_UNPROVEN_PER_PEER of one peer address, a new one over either bound takes
the place of the oldest unproven one (of that address, else of any), and each is dropped PROVE_WITHIN seconds after
its accept. A process takes only the end of a connection the server said HELD for its driver's end; one closed
before that (its place taken, or the driver busy) is tried again until CONNECT_FOR runs out, and a REFUSED proof
ends the process at once (its key is not the driver's: nothing will change that). The same connections tell the
driver at once when a process on another host ends, or its host is lost (`on_closed`): Monarch's supervision took
up to 30 s to report a host whose processes were killed.
"""

from __future__ import annotations

import errno
import hashlib
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

KEY_BYTES = 32  # a process's key, the server's challenge and a process's answer (HMAC-SHA256) are this long
PROVE_WITHIN = 10.0  # seconds a new connection has to prove itself
MAX_UNPROVEN = 64  # connections that have not proven themselves yet; a new one beyond takes the oldest's place
MAX_UNPROVEN_PER_PEER = 8  # of them from one peer address
HELD, REFUSED = b"\x01", b"\x00"  # the server's verdict on a process's proof
RETRY_AFTER = 0.2  # seconds a process waits before it connects again after a close before HELD
ACCEPT_PAUSE_MAX = 1.0  # seconds accepting pauses at most after a failed accept (no file descriptor left)
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
        self._secret = secrets.token_bytes(KEY_BYTES)  # never leaves this process: keys are derived from it
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        # -> since, peer address, challenge, received; in the order they were accepted: the oldest first
        self._unproven: dict[socket.socket, tuple[float, str, bytes, bytearray]] = {}
        self._accept_pause = 0.0  # seconds accepting pauses after a failed accept (doubling), 0: accepting
        self._accept_again = 0.0  # time.monotonic() when a paused server accepts again
        self._held: dict[socket.socket, str] = {}  # proven connections -> the name of their process
        self._claimed: set[str] = set()  # every name proven so far: none is held twice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fray-monarch-lifeline", daemon=True)
        self._thread.start()

    def key_for(self, name: str) -> bytes:
        """The key of the process called `name` (its process key, at most 255 bytes encoded): it proves that name
        and no other. Hand it to that process only, over an authenticated channel."""
        return _key(self._secret, _label(name))

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
            for sock, (since, _, _, _) in list(self._unproven.items()):
                if now - since > PROVE_WITHIN:
                    self._drop(sock)
            if self._accept_again and now >= self._accept_again:
                self._accept_again = 0.0
                self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _accept(self) -> None:
        try:
            conn, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # the listening socket stays ready: pause rather than spin on it
                self._accept_pause = min(max(self._accept_pause * 2, 0.01), ACCEPT_PAUSE_MAX)
                self._accept_again = time.monotonic() + self._accept_pause
                self._sel.unregister(self._listener)
            return
        self._accept_pause = 0.0
        peer = str(address[0])
        same_peer = [sock for sock, pending in self._unproven.items() if pending[1] == peer]
        if len(same_peer) >= MAX_UNPROVEN_PER_PEER:
            self._drop(same_peer[0])
        elif len(self._unproven) >= MAX_UNPROVEN:
            self._drop(next(iter(self._unproven)))
        challenge = secrets.token_bytes(KEY_BYTES)
        try:
            conn.send(challenge)  # (blocking: 32 bytes always fit a new connection's empty send buffer)
        except OSError:
            conn.close()
            return
        conn.setblocking(False)
        _keepalive(conn)
        self._unproven[conn] = (time.monotonic(), peer, challenge, bytearray())
        self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _readable(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
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
        _, _, challenge, got = pending
        got.extend(data)
        if len(got) < 1 + got[0] + KEY_BYTES:
            return  # (the length of the process's name, the name, then its answer to the challenge)
        del self._unproven[sock]
        label, answer = bytes(got[1 : 1 + got[0]]), bytes(got[1 + got[0] : 1 + got[0] + KEY_BYTES])
        name = label.decode(errors="replace")
        expected = _answer(_key(self._secret, label), challenge, label)
        if hmac.compare_digest(answer, expected) and len(got) == 1 + got[0] + KEY_BYTES and name not in self._claimed:
            self._claimed.add(name)
            self._held[sock] = name
            self._verdict(sock, HELD)
        else:  # a wrong key, a replayed answer, a name claimed before, or more than the protocol sends
            self._verdict(sock, REFUSED)
            self._drop(sock)

    def _verdict(self, sock: socket.socket, verdict: bytes) -> None:
        try:
            sock.send(verdict)  # one byte: a proven connection's send buffer is empty
        except OSError:
            pass  # gone already: its end is read next

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


def _label(name: str) -> bytes:
    return name.encode()[:255]


def _key(secret: bytes, label: bytes) -> bytes:
    return hmac.new(secret, b"fray-lifeline-key\0" + label, hashlib.sha256).digest()


def _answer(key: bytes, challenge: bytes, label: bytes) -> bytes:
    return hmac.new(key, challenge + label, hashlib.sha256).digest()


def _receive(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes (fewer only if the connection ended first)."""
    got = b""
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        if not chunk:
            break
        got += chunk
    return got


def _held_until_closed(host: str, port: int, key: bytes, label: bytes) -> bool | None:
    """One connection to the lifeline, proved with `key`: None if it ended before the server's verdict (try
    again), False if the server refused the proof, True once a connection the server held has ended."""
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError:
        return None
    held = False
    try:
        _keepalive(sock)
        sock.settimeout(PROVE_WITHIN)  # the challenge and the verdict come at once from a live server
        challenge = _receive(sock, KEY_BYTES)
        if len(challenge) < KEY_BYTES:
            return None
        sock.sendall(bytes([len(label)]) + label + _answer(key, challenge, label))
        verdict = _receive(sock, 1)
        if verdict != HELD:
            return False if verdict == REFUSED else None
        held = True
        sock.settimeout(None)  # from here on the connection only waits for its end (keepalive bounds it)
        while sock.recv(4096):
            pass
    except OSError:
        pass
    finally:
        sock.close()
    return True if held else None


def hold(address: str, key: bytes, on_lost: Callable[[str], None] = end_process, name: str = "") -> threading.Thread:
    """This process's end: connect to the driver's lifeline at `address` ("host:port") as `name` (its process key,
    at most 255 bytes), proving it with `key` (the server's key_for(name)), and call on_lost(address) when the
    connection the server said it holds ends, when the server refuses the proof, or when the driver could not be
    reached and held for CONNECT_FOR seconds. By default that ends this process at once: its driver is gone, so
    nothing will ever collect its results."""
    label = _label(name)
    host, _, port = address.rpartition(":")

    def run() -> None:
        deadline = time.monotonic() + CONNECT_FOR
        while _held_until_closed(host.strip("[]"), int(port), key, label) is None:
            if time.monotonic() > deadline:
                break
            time.sleep(RETRY_AFTER)  # not held (yet): the driver's server was busy, or had no place for us
        on_lost(address)

    thread = threading.Thread(target=run, name="fray-monarch-lifeline", daemon=True)
    thread.start()
    return thread
