"""The lifeline that ends a driver's processes on other hosts when the driver ends, and the watchdog's cleanup
commands (how a killed driver's Slurm allocation is cancelled)."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray_monarch.net import lifeline

HOLDER = textwrap.dedent(
    """
    import sys, time
    from fray_monarch.net import lifeline
    lifeline.hold(sys.argv[1], bytes.fromhex(sys.argv[2]), name=sys.argv[3])
    print("holding", flush=True)
    time.sleep(600)
    """
)

DRIVER = textwrap.dedent(
    """
    import time
    from fray_monarch.net.lifeline import LifelineServer
    server = LifelineServer("127.0.0.1")
    print(server.address, server.key_for("proc-a").hex(), flush=True)
    time.sleep(600)
    """
)


_holders: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_holder_left() -> Iterator[None]:
    """A holder a failed test left behind would sleep on for ten minutes."""
    yield
    while _holders:
        proc = _holders.pop()
        proc.kill()
        proc.wait(timeout=30)


def _holder(address: str, key: bytes, name: str, refused: bool = False) -> subprocess.Popen[str]:
    """A process holding a lifeline; one the server refuses may end (exit 70) before it says it holds one: its
    verdict comes on the lifeline's own thread, after `hold` returned."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, address, key.hex(), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _holders.append(proc)
    if not refused:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def _until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_process_ends_when_its_drivers_process_is_killed() -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        address, key = driver.stdout.readline().split()
        holder = _holder(address, bytes.fromhex(key), "proc-a")
        time.sleep(0.5)
        assert holder.poll() is None  # held while the driver lives
        driver.send_signal(signal.SIGKILL)
        assert holder.wait(30) == 70
        assert holder.stderr is not None and "driver (127.0.0.1:" in holder.stderr.read()
    finally:
        driver.kill()
        driver.wait()


def test_only_a_process_with_its_own_key_is_held() -> None:
    closed: list[str] = []
    server = lifeline.LifelineServer("127.0.0.1", on_closed=closed.append)
    try:
        good = _holder(server.address, server.key_for("proc-a"), "proc-a")
        stranger = _holder(server.address, b"x" * lifeline.KEY_BYTES, "proc-b", refused=True)
        assert stranger.wait(30) == 70  # dropped at once: its connection closed
        # the key of one process does not prove another's name
        impostor = _holder(server.address, server.key_for("proc-a"), "proc-c", refused=True)
        assert impostor.wait(30) == 70
        # nor a second claim of a name that is held, with the right key (its close is no death of proc-a)
        twin = _holder(server.address, server.key_for("proc-a"), "proc-a", refused=True)
        assert twin.wait(30) == 70
        _until(lambda: server.held == 1)
        assert good.poll() is None and closed == []
        server.close()
        assert good.wait(30) == 70  # a clean close ends it too
    finally:
        server.close()


class _Recorder:
    """A TCP relay between a process and the lifeline server that keeps what the process sent: what a listener on
    the network sees."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = b""
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        inside, _ = self.listener.accept()
        outside = socket.create_connection(self.target, timeout=10)
        sel = selectors.DefaultSelector()
        sel.register(inside, selectors.EVENT_READ, outside)
        sel.register(outside, selectors.EVENT_READ, inside)
        while True:
            for key, _ in sel.select(timeout=60):
                data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                if not data:
                    return
                if key.fileobj is inside:
                    self.sent += data
                key.data.sendall(data)


def test_what_a_process_sent_cannot_be_replayed_to_declare_it_dead() -> None:
    """Before, a process sent the context's token in clear: whoever saw it could connect in any process's name
    and close, and the driver took that process (alive) for dead (on_closed)."""
    closed: list[str] = []
    server = lifeline.LifelineServer("127.0.0.1", on_closed=closed.append)
    try:
        wire = _Recorder(server.address)
        victim = _holder(wire.address, server.key_for("proc-a"), "proc-a")
        _until(lambda: server.held == 1 and len(wire.sent) > 0)
        time.sleep(0.2)  # all of it relayed
        host, _, port = server.address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as replay:
            replay.sendall(wire.sent)
            replay.settimeout(10)
            try:
                while replay.recv(4096):  # refused: the server closes it
                    pass
            except TimeoutError:
                pass  # (the old server kept a replay open: it was taken for the process)
        time.sleep(0.5)
        assert closed == [], f"a replayed lifeline connection made the driver declare {closed} dead"
        assert server.held == 1 and victim.poll() is None
    finally:
        server.close()


def test_a_connection_that_never_proves_itself_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifeline, "PROVE_WITHIN", 0.5)
    server = lifeline.LifelineServer("127.0.0.1")
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as silent:
            silent.settimeout(30)
            got = b""
            while chunk := silent.recv(4096):  # the challenge, then closed by the server, not by us
                got += chunk
        assert len(got) == lifeline.KEY_BYTES
        assert server.held == 0
    finally:
        server.close()


def _idle(address: str, source: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def test_unproven_connections_give_way_and_no_process_takes_them_for_its_drivers_end() -> None:
    """Before, MAX_UNPROVEN idle connections made the server close every new one at accept, and every process
    starting then read that close as its driver's end and exited (a kill switch for anyone who reaches the port)."""
    closed: list[str] = []
    server = lifeline.LifelineServer("127.0.0.1", on_closed=closed.append)
    idle: list[socket.socket] = []
    try:
        for i in range(lifeline.MAX_UNPROVEN + 16):  # from many addresses: a local user has all of 127/8
            idle.append(_idle(server.address, f"127.0.{i // 200 + 1}.{i % 200 + 2}"))
        time.sleep(0.3)
        start = time.monotonic()
        holder = _holder(server.address, server.key_for("proc-a"), "proc-a")
        _until(lambda: server.held == 1, timeout=5)
        assert time.monotonic() - start < 3
        time.sleep(0.5)
        assert holder.poll() is None and closed == []
        open_now = sum(not _closed(conn) for conn in idle)
        assert open_now <= lifeline.MAX_UNPROVEN, open_now
    finally:
        for conn in idle:
            conn.close()
        server.close()


def test_one_address_holds_few_unproven_connections() -> None:
    server = lifeline.LifelineServer("127.0.0.1")
    idle: list[socket.socket] = []
    try:
        idle = [_idle(server.address, "127.0.0.9") for _ in range(lifeline.MAX_UNPROVEN_PER_PEER + 12)]
        time.sleep(0.3)
        open_now = sum(not _closed(conn) for conn in idle)
        assert open_now == lifeline.MAX_UNPROVEN_PER_PEER, open_now
        assert [_closed(conn) for conn in idle[-lifeline.MAX_UNPROVEN_PER_PEER :]] == [False] * 8  # the newest stay
    finally:
        for conn in idle:
            conn.close()
        server.close()


def test_a_process_whose_connection_closes_before_it_is_held_connects_again() -> None:
    """Only the end of a connection the server held means the driver's end: one closed before that (as when its
    place was taken by a newer connection) is tried again."""
    lost: list[str] = []
    server = lifeline.LifelineServer("127.0.0.1")
    try:
        wire = _Stall(server.address)  # the first connection goes nowhere, the next ones through
        lifeline.hold(wire.address, server.key_for("proc-a"), on_lost=lost.append, name="proc-a")
        _until(lambda: server.held == 1, timeout=10)
        assert lost == []
        server.close()
        _until(lambda: lost == [wire.address], timeout=10)
    finally:
        server.close()


def _closed(conn: socket.socket) -> bool:
    """The server closed `conn` (what it sent before, the challenge, read and dropped)."""
    conn.settimeout(0.05)
    try:
        while chunk := conn.recv(4096):
            del chunk
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


class _Stall:
    """A TCP relay that closes its first connection after reading a little of it, and relays the later ones."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        first = True
        while True:
            inside, _ = self.listener.accept()
            if first:
                first = False
                inside.close()  # what an evicted connection sees: closed before any challenge
                continue
            threading.Thread(target=self._relay, args=(inside,), daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        outside = socket.create_connection(self.target, timeout=10)
        sel = selectors.DefaultSelector()
        sel.register(inside, selectors.EVENT_READ, outside)
        sel.register(outside, selectors.EVENT_READ, inside)
        while True:
            for key, _ in sel.select(timeout=60):
                data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                if not data:
                    key.data.close()
                    return
                key.data.sendall(data)


def test_the_watchdog_runs_cleanup_commands_when_its_owner_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    owner = textwrap.dedent(
        f"""
        import time
        from fray.host import watchdog
        watchdog.watch_command(["sh", "-c", "echo $WHAT > {marker}"], {{"WHAT": "scancel 42"}})
        watchdog.watch_command(["sh", "-c", "echo forgotten > {marker}.2"])
        watchdog.forget_command(["sh", "-c", "echo forgotten > {marker}.2"])
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert not marker.exists()
        os.kill(proc.pid, signal.SIGKILL)
        _until(marker.exists)
        _until(lambda: marker.read_text() == "scancel 42\n")
        assert not Path(f"{marker}.2").exists()
    finally:
        proc.kill()
        proc.wait()
