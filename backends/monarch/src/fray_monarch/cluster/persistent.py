"""Starting and stopping the recorded monarch cluster (its head: head.py) for `fray cluster start|stop`."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from fray.backend import Identity, ip_address, state_dir
from fray.errors import FrayError
from fray_monarch import socket_guard
from fray_monarch.cluster.head_record import NAME, recorded

__all__ = ["start", "stop"]

START_TIMEOUT = 600.0  # seconds a head may take to launch its hosts (a Slurm queue, ssh logins) and attach
STOP_TIMEOUT = 60.0  # seconds a head may take to stop its jobs and end its hosts before it is killed


def _head_dir() -> str:
    return str(state_dir.state_subdir("monarch", "head"))


def start(listen: str, options: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Start a head for these spec options, converted by the backend's schema (or find the running one): (its
    record, whether it started now). The head reads them back as they are (spec.json): converted values are JSON
    (numbers, flags, text, host lists, resource tables), a Monarch job object is not."""
    current = recorded()
    if current is not None and current["running"]:
        return current, False
    if current is not None:
        state_dir.forget_cluster(NAME)
    if listen and listen not in ("127.0.0.1", "localhost", "::1"):
        options = {"bind": ip_address(listen), **options}  # else the address that routes to the hosts (network.py)
    try:
        text = json.dumps(options)
    except TypeError:
        raise ValueError("fray cluster start takes spec options (job=ssh|slurm|process|local), not objects") from None
    head_dir = _head_dir()
    spec = os.path.join(head_dir, "spec.json")
    fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    log = os.path.join(head_dir, "head.log")
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as errors:
        head = subprocess.Popen(
            [sys.executable, "-m", "fray_monarch.cluster.head", head_dir],
            env=None if options.get(socket_guard.OPT_OUT) else socket_guard.guarded_environ(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,  # not tied to this command: it outlives it until `fray cluster stop`
        )
    assert head.stdout is not None
    line = _first_line(head, START_TIMEOUT)
    head.stdout.close()
    if line.startswith("ready "):
        return {**json.loads(line[len("ready ") :]), "running": True}, True
    if head.poll() is None:
        head.kill()
    head.wait()
    why = json.loads(line[len("error ") :]) if line.startswith("error ") else "it printed nothing"
    with open(log, errors="replace") as f:
        tail = f.read()[-2000:].strip()
    raise FrayError(f"the monarch cluster did not start: {why}" + (f"\n{tail}" if tail else ""))


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], min(left, 1.0))[0]:
            if left <= 0 or proc.poll() is not None:
                break
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode(errors="replace")


def stop() -> dict[str, Any] | None:
    """Stop the recorded head (SIGTERM: it stops its jobs and ends the hosts it launched; SIGKILL if it has not
    ended in STOP_TIMEOUT seconds) and remove the record. The record, or None if there was none."""
    current = recorded()
    if current is None:
        return None
    leader = Identity.from_record(current.get("leader"))
    if leader is not None and leader.running():  # proven ours: same pid, start time and boot as recorded
        os.kill(leader.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while leader.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        if leader.running():
            os.kill(leader.pid, signal.SIGKILL)
    state_dir.forget_cluster(NAME)
    return current
