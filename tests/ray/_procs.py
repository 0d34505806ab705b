"""Processes and their listening sockets, from /proc (no psutil): which addresses a set of processes listens on.
And the driver scripts that tests run in a subprocess of their own (Ray allows one connection per process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fray.host import procfs


def _listening_inodes() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every listening TCP socket (IPv4 and IPv6)."""
    found: dict[str, tuple[str, int]] = {}
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found[fields[9]] = (socket.inet_ntop(family, raw), int(port, 16))
    return found


def listening(pids: list[int]) -> dict[int, list[tuple[str, int]]]:
    """pid -> the (address, port) pairs it listens on, for each pid that listens at all."""
    inodes = _listening_inodes()
    out: dict[int, list[tuple[str, int]]] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                out.setdefault(pid, []).append(inodes[target[8:-1]])
    return out


def processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process."""
    table = {}
    for pid in procfs.pids():
        found = procfs.stat(pid)
        if found is not None:
            table[pid] = (found.ppid, found.pgid, found.state)
    return table


def group_and_descendants(pgid: int) -> list[int]:
    """The live processes of group pgid and all their descendants (Ray's workers are in groups of their own)."""
    table = {pid: row for pid, row in processes().items() if row[2] not in ("Z", "X")}
    found = {pid for pid, (_, group, _) in table.items() if group == pgid}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


def cmdline(pid: int) -> str:
    argv = procfs.cmdline(pid)
    return "?" if argv is None else " ".join(argv).strip()[:100]


def run_driver(script: Path, what: str, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run a driver script in a session of its own and return what it printed last as `RESULT <json>`. On a
    timeout exactly that driver's process group is killed (the cluster nodes it started too) and the test fails."""
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{what} timed out:\n{stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{what} failed ({proc.returncode}):\n{stderr[-3000:]}"
    out: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return out
