"""The lifeline that ends a driver's processes on other hosts when the driver ends, and the watchdog's cleanup
commands (how a killed driver's Slurm allocation is cancelled)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fray_monarch import lifeline

HOLDER = textwrap.dedent(
    """
    import sys, time
    from fray_monarch import lifeline
    lifeline.hold(sys.argv[1], bytes.fromhex(sys.argv[2]))
    print("holding", flush=True)
    time.sleep(600)
    """
)

DRIVER = textwrap.dedent(
    """
    import time
    from fray_monarch.lifeline import LifelineServer
    server = LifelineServer("127.0.0.1")
    print(server.address, server.token.hex(), flush=True)
    time.sleep(600)
    """
)


def _holder(address: str, token: bytes) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, address, token.hex()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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
        address, token = driver.stdout.readline().split()
        holder = _holder(address, bytes.fromhex(token))
        time.sleep(0.5)
        assert holder.poll() is None  # held while the driver lives
        driver.send_signal(signal.SIGKILL)
        assert holder.wait(30) == 70
        assert holder.stderr is not None and "driver (127.0.0.1:" in holder.stderr.read()
    finally:
        driver.kill()
        driver.wait()


def test_only_a_process_with_the_token_is_held() -> None:
    server = lifeline.LifelineServer("127.0.0.1")
    try:
        good = _holder(server.address, server.token)
        stranger = _holder(server.address, b"x" * lifeline.TOKEN_BYTES)
        assert stranger.wait(30) == 70  # dropped at once: its connection closed
        _until(lambda: server.held == 1)
        assert good.poll() is None
        server.close()
        assert good.wait(30) == 70  # a clean close ends it too
    finally:
        server.close()


def test_a_connection_that_never_proves_itself_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(lifeline, "PROVE_WITHIN", 0.5)
    server = lifeline.LifelineServer("127.0.0.1")
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as silent:
            assert silent.recv(1) == b""  # closed by the server, not by us
        assert server.held == 0
    finally:
        server.close()


def test_the_watchdog_runs_cleanup_commands_when_its_owner_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    owner = textwrap.dedent(
        f"""
        import time
        from fray import watchdog
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
