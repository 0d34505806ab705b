"""What `fray doctor` shows for Monarch: RDMA state and a short RDMABuffer probe (MonarchBackend.diagnose).

- ibverbs available / rdma backend: `monarch.rdma.is_ibverbs_available()` / `get_rdma_backend()` ("ibverbs",
  "tcp" for Monarch's TCP fallback, or "none"); quiet, asked in this process.
- rdma devices: listed through pyverbs when it is importable (optional: `pip install 'fray-monarch[rdma]'`).
  `pyverbs.device.get_device_list()` raises PyverbsRDMAError when there is no device at all.
- rdma probe: a Monarch process holds a 16 MiB RDMABuffer; this side reads it 3 times (best time, data checked).
  It runs in a child Python process with its output captured (Monarch prints an "internal logs" line, the TCP
  fallback a warning and a libcuda message), in its own process group, killed whole after PROBE_TIMEOUT.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from typing import Any

from fray_monarch.core.monarch_api import Actor, endpoint

NO_DEVICE = "no RDMA device"
SYSFS_RDMA = "/sys/class/infiniband"  # the kernel's RDMA devices: listed there whether pyverbs is installed or not
# Only where the machine has RDMA devices: pyverbs (optional) is then worth installing; without devices it is not.
PYVERBS_MISSING = "(pyverbs, optional, would list them through ibverbs: pip install 'fray-monarch[rdma]')"
PROBE_BYTES = 16 << 20
PROBE_ROUNDS = 3
PROBE_TIMEOUT = 30.0  # seconds for the whole child: start, spawn one Monarch process, 3 reads, stop
_MARK = "fray-diagnose "  # prefix of the child's result lines on stdout

__all__ = ["diagnose", "rdma_devices", "rdma_probe", "rdma_state"]


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def rdma_state() -> dict[str, str]:
    try:
        from monarch.rdma import get_rdma_backend, is_ibverbs_available

        return {"ibverbs available": str(is_ibverbs_available()), "rdma backend": get_rdma_backend()}
    except Exception as exc:
        return {"rdma backend": f"unknown ({_error(exc)})"}


def rdma_devices() -> str:
    """The RDMA devices pyverbs sees ("mlx5_0, mlx5_1"), or NO_DEVICE. Without pyverbs: the kernel's list, with
    a word on pyverbs only where there are devices (a machine without RDMA has nothing to install)."""
    try:
        from pyverbs.device import get_device_list
        from pyverbs.pyverbs_error import PyverbsRDMAError
    except ImportError:
        try:
            found = sorted(os.listdir(SYSFS_RDMA))
        except OSError:
            found = []
        return f"{', '.join(found)} {PYVERBS_MISSING}" if found else NO_DEVICE
    try:
        devices = get_device_list()
    except PyverbsRDMAError:  # raised, rather than [] returned, when the machine has no RDMA device
        return NO_DEVICE
    except Exception as exc:
        return f"pyverbs could not list devices ({_error(exc)})"
    names = []
    for dev in devices:
        name = getattr(dev, "name", dev)
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return ", ".join(names) if names else NO_DEVICE


def rdma_probe(nbytes: int = PROBE_BYTES, timeout: float = PROBE_TIMEOUT) -> str:
    """Run the RDMABuffer probe in a child process; one line saying what it measured, or why it could not."""
    code = "import sys; from fray_monarch.diagnostics import probe_main; probe_main(int(sys.argv[1]))"
    from fray.errors import FrayError
    from fray_monarch import socket_guard

    try:  # the probe starts Monarch: its sockets closed to other users like any monarch context's
        env: dict[str, str] | None = socket_guard.guarded_environ()
    except FrayError:
        env = None  # no compiler: the probe's process lives for seconds, and the report says why
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(nbytes)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills Monarch's processes with it
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, err = proc.communicate()
    found: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith(_MARK):
            try:
                found.update(json.loads(line[len(_MARK) :]))
            except ValueError:
                pass
    size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} bytes"
    if "mb_per_s" in found:
        checked = "data verified" if found.get("verified") else "DATA MISMATCH"
        return (
            f"{size} RDMABuffer read from another Monarch process: {found['mb_per_s']:.0f} MB/s "
            f"({found.get('backend', '?')}, best of {PROBE_ROUNDS}, {checked})"
        )
    if "error" in found:
        return f"could not run: {found['error']}"
    if timed_out:
        return f"could not run: timed out after {timeout:g} s while {found.get('stage', 'starting')}"
    last = [line for line in err.splitlines() if line.strip()]
    why = last[-1].strip() if last else f"exit code {proc.returncode}"
    return f"could not run: {why} (while {found.get('stage', 'starting')})"


def socket_guard_state() -> str:
    """Whether this process runs under fray's socket guard, and whether the guard can be built here."""
    from fray.errors import FrayError
    from fray_monarch import socket_guard

    if socket_guard.active():
        return "active in this process"
    try:
        socket_guard.library()
    except FrayError as exc:
        return f"cannot be built here: {exc}"
    return (
        "built, not in this process: start monarch drivers under it (`fray run -- python script.py`, or "
        "`python -m fray_monarch.socket_guard CMD`); without it a monarch context is refused"
    )


def diagnose() -> dict[str, str]:
    out = {"socket guard": socket_guard_state()}
    out.update(rdma_state())
    out["rdma devices"] = rdma_devices()
    out["rdma probe"] = rdma_probe()
    return out


# -- the probe's child process --------------------------------------------------------------------------------


def _pattern(nbytes: int) -> bytes:
    return (bytes(range(256)) * (nbytes // 256 + 1))[:nbytes]


def _emit(**fields: Any) -> None:
    print(_MARK + json.dumps(fields), flush=True)


class _RdmaSource(Actor):
    """Owns the probe's buffer in a Monarch process of its own."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytearray(_pattern(nbytes))
        self.buffer: Any = None

    @endpoint
    def buffer_handle(self) -> Any:
        from monarch.rdma import RDMABuffer

        self.buffer = RDMABuffer(memoryview(self.data))
        return self.buffer


def probe_main(nbytes: int) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the TCP fallback's warning: the parent reports the backend itself
    from monarch.actor import this_host
    from monarch.rdma import get_rdma_backend

    backend = get_rdma_backend()
    if backend == "none":
        _emit(error="Monarch has no RDMA backend here (no ibverbs device and rdma_allow_tcp_fallback off)")
        return
    _emit(stage="spawning a Monarch process")
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="fray_doctor")
    try:
        procs.initialized.get(timeout=20)
        _emit(stage="creating the RDMABuffer")
        source = procs.spawn("fray_doctor_rdma", _RdmaSource, nbytes)
        buffer = source.buffer_handle.call_one().get(timeout=20)
        _emit(stage="reading the RDMABuffer")
        dst = bytearray(nbytes)
        best = math.inf
        for _ in range(PROBE_ROUNDS):
            t0 = time.perf_counter()
            buffer.read_into(memoryview(dst), timeout=10).get(timeout=15)
            best = min(best, time.perf_counter() - t0)
        _emit(mb_per_s=nbytes / best / 1e6, backend=backend, verified=bytes(dst) == _pattern(nbytes))
        _emit(stage="stopping the Monarch process")
    finally:
        procs.stop().get(timeout=10)
