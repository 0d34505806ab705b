"""`fray doctor`: what is installed, how much shared memory there is and how fast it is, and what each backend
reports about itself (Backend.diagnose).

    report(probes=True)  -> {"section": {"name": "value", ...}, ...}   structured, JSON-able
    main()               -> prints that report (exit code 0)

Every probe and every backend's diagnose runs under a time limit: doctor reports "timed out" and goes on, it
never hangs. The shared-memory probe's file is always removed.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from fray.backend import Backend
from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, available_backends, get_backend

__all__ = ["DISTRIBUTIONS", "Report", "format_report", "main", "report"]

Report = dict[str, dict[str, str]]

# The distributions whose versions doctor lists, in this order.
DISTRIBUTIONS = ("fray-core", "fray-ray", "fray-monarch", "ray", "torchmonarch", "torch", "numpy")

MiB = 1 << 20
PROBE_BYTES = 64 * MiB
PROBE_ROUNDS = 3
PROBE_TIMEOUT = 20.0  # seconds, per local probe
BACKEND_LOAD_TIMEOUT = 30.0  # importing every installed backend
DIAGNOSE_TIMEOUT = 60.0  # one backend's diagnose(); a backend bounds its own probes more tightly than this
SHM_DIR = "/dev/shm"

T = TypeVar("T")


def _bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """fn() on a daemon thread; TimeoutError if it has not returned within timeout seconds (it is then left
    running: a daemon thread does not keep the process alive)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"fray-doctor-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"timed out after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "too fast to time"


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# -- sections -------------------------------------------------------------------------------------------------


def _about() -> dict[str, str]:
    return {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "cpus": str(os.cpu_count() or "unknown"),
    }


def _packages() -> dict[str, str]:
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _load_backends() -> tuple[dict[str, str], dict[str, Backend]]:
    """(line per known backend, the installed ones)."""
    lines: dict[str, str] = {}
    loaded: dict[str, Backend] = {}
    for name, where in sorted(available_backends().items()):
        try:
            backend = get_backend(name)
        except BackendNotAvailableError:
            hint = FIRST_PARTY[name][1] if name in FIRST_PARTY else "not importable"
            lines[name] = f"not installed: {hint}"
            continue
        except Exception as exc:  # a broken third-party backend must not stop the report
            lines[name] = f"failed to load: {_error(exc)}"
            continue
        lines[name] = f"installed ({where})"
        loaded[name] = backend
    return lines, loaded


def _meminfo() -> dict[str, int]:
    """MemTotal / MemAvailable in bytes (Linux /proc/meminfo; elsewhere the total from sysconf only)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if "MemTotal" not in out:
        try:
            out["MemTotal"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    return out


def _shm_free(directory: str = SHM_DIR) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _gpus() -> dict[str, str]:
    """The GPUs fray finds here, without initializing CUDA (fray.runtime.gpus)."""
    from fray.runtime.gpus import discover

    found = discover()
    if not found.ids:
        return {"gpus": "none found (work that asks for a GPU needs gpus=N declared, or a GPU machine)"}
    return {"gpus": f"{len(found)}: ids {list(found.ids)} (from {found.source})"}


def _memory() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        st = os.statvfs(SHM_DIR)
        out[f"{SHM_DIR} size"] = _gib(st.f_blocks * st.f_frsize)
        out[f"{SHM_DIR} free"] = _gib(st.f_bavail * st.f_frsize)
    except OSError as exc:
        out[SHM_DIR] = f"not available ({_error(exc)})"
    mem = _meminfo()
    out["memory total"] = _gib(mem["MemTotal"]) if "MemTotal" in mem else "unknown"
    out["memory available"] = _gib(mem["MemAvailable"]) if "MemAvailable" in mem else "unknown"
    return out


# -- bandwidth probes -----------------------------------------------------------------------------------------


def _copier() -> tuple[str, Callable[[int], Any], Callable[[Any, Any], None]]:
    """(how, allocate(n) -> buffer, copy(dst, src)): numpy copyto when numpy is installed, else memoryview slices
    over bytearrays (one memcpy, no intermediate copy)."""
    try:
        import numpy as np
    except ImportError:

        def copy_bytes(dst: Any, src: Any) -> None:
            with memoryview(dst) as d, memoryview(src) as s:
                d[:] = s

        return "bytearray slice copy", bytearray, copy_bytes

    def alloc(n: int) -> Any:
        return np.ones(n, dtype=np.uint8)  # written once, so the pages exist before anything is timed

    def copy_numpy(dst: Any, src: Any) -> None:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))

    return "numpy copyto", alloc, copy_numpy


def memcpy_bandwidth(nbytes: int = PROBE_BYTES, rounds: int = PROBE_ROUNDS) -> tuple[float, str]:
    """Best seconds of `rounds` copies of nbytes between two preallocated buffers, and how it copied."""
    how, alloc, copy = _copier()
    src, dst = alloc(nbytes), alloc(nbytes)
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        copy(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best, how


def shm_bandwidth(
    nbytes: int = PROBE_BYTES, rounds: int = PROBE_ROUNDS, directory: str = SHM_DIR
) -> tuple[float, float]:
    """Best (write seconds, read seconds) of `rounds`: each round writes nbytes into a new file in `directory`
    through mmap (page allocation included, as for a new shared-memory object), unmaps it, maps it again and
    reads it into preallocated memory (as a consumer process would). The file is removed in every case."""
    _, alloc, copy = _copier()
    src, dst = alloc(nbytes), alloc(nbytes)
    best_write = best_read = math.inf
    for _ in range(rounds):
        fd, path = tempfile.mkstemp(prefix="fray-doctor-", dir=directory)
        try:
            os.ftruncate(fd, nbytes)
            t0 = time.perf_counter()
            with mmap.mmap(fd, nbytes) as mm:
                copy(mm, src)
            t1 = time.perf_counter()
            with mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ) as mm:
                copy(dst, mm)
            t2 = time.perf_counter()
        finally:
            os.close(fd)
            os.unlink(path)
        best_write, best_read = min(best_write, t1 - t0), min(best_read, t2 - t1)
    return best_write, best_read


def _bandwidth(nbytes: int = PROBE_BYTES) -> dict[str, str]:
    out = {"probe": f"{nbytes // MiB} MiB, best of {PROBE_ROUNDS}"}
    free = _shm_free()
    if free is None:
        out["shm"] = f"not measured: no {SHM_DIR} here"
    elif free < 2 * nbytes:
        out["shm"] = f"not measured: only {_gib(free)} free in {SHM_DIR}"
    else:
        try:
            write, read = _bounded(lambda: shm_bandwidth(nbytes), PROBE_TIMEOUT, "shm")
            out["shm write"] = _rate(nbytes, write)
            out["shm read"] = _rate(nbytes, read)
        except Exception as exc:
            out["shm"] = f"not measured: {_error(exc)}"
    try:
        seconds, how = _bounded(lambda: memcpy_bandwidth(nbytes), PROBE_TIMEOUT, "memcpy")
        out["memcpy"] = f"{_rate(nbytes, seconds)} ({how})"
    except Exception as exc:
        out["memcpy"] = f"not measured: {_error(exc)}"
    return out


def _diagnose(backend: Backend) -> dict[str, str]:
    try:
        lines = _bounded(backend.diagnose, DIAGNOSE_TIMEOUT, f"diagnose-{backend.name}")
    except Exception as exc:
        return {"diagnose": f"failed: {_error(exc)}"}
    if not isinstance(lines, dict):
        return {"diagnose": f"failed: returned {type(lines).__name__}, not a dict"}
    return {str(k): str(v) for k, v in lines.items()}


# -- the report -----------------------------------------------------------------------------------------------


def report(*, probes: bool = True, backends: Sequence[str] | None = None) -> Report:
    """The doctor's findings: section -> {name: value}, all strings, in print order.

    Sections: "fray", "packages", "backends", "shared memory", "gpus", "bandwidth" (only with probes=True: 64
    MiB, best of 3), then "<name> backend" for each installed backend whose diagnose() has something to say,
    and last the "verdict": each backend ready or not and why, and what to do about what is not.
    `backends` limits which installed backends are asked to diagnose (default: all of them).
    """
    out: Report = {"fray": _about(), "packages": _packages()}
    try:
        lines, loaded = _bounded(_load_backends, BACKEND_LOAD_TIMEOUT, "backends")
    except Exception as exc:
        lines, loaded = {"backends": f"could not be listed: {_error(exc)}"}, {}
    out["backends"] = lines
    out["shared memory"] = _memory()
    out["gpus"] = _gpus()
    if probes:
        out["bandwidth"] = _bandwidth()
    for name, backend in loaded.items():
        if backends is not None and name not in backends:
            continue
        found = _diagnose(backend)
        if found:
            out[f"{name} backend"] = found
    out["verdict"] = verdict(out)
    return out


SMALL_SHM = 1 << 30  # below this much free shared memory, large values will not fit (Ray's and monarch's stores)


def verdict(found: Report) -> dict[str, str]:
    """What the report means: each known backend ready, or what stops it and what to do; then anything else that
    needs attention; and one line saying whether there is anything to do at all."""
    out: dict[str, str] = {}
    todo = 0
    for name, line in found.get("backends", {}).items():
        failed = [f"{k}: {v}" for k, v in found.get(f"{name} backend", {}).items() if v.startswith("failed")]
        if line.startswith("installed") and not failed:
            out[name] = "ready"
        elif line.startswith("installed"):
            out[name] = f"installed, but {failed[0]}"
            todo += 1
        else:
            out[name] = line  # "not installed: <how to install it>" or "failed to load: <why>"
    free = _shm_free()
    if free is not None and free < SMALL_SHM:
        out["shared memory"] = (
            f"only {_gib(free)} free in {SHM_DIR}: values larger than that cannot be stored by ray or monarch; "
            "give the machine (or container: --shm-size) more"
        )
        todo += 1
    ready = [name for name, line in out.items() if line == "ready"]
    summary = f"ready for {', '.join(ready)}" if ready else "no backend is ready"
    out["summary"] = f"{summary}; {todo} thing(s) to fix above" if todo else f"{summary}; nothing to fix"
    return out


def format_report(found: Report) -> str:
    lines = []
    for section, entries in found.items():
        lines.append(section)
        width = max((len(k) for k in entries), default=0) + 1
        for key, value in entries.items():
            lines.append(f"  {key + ':':<{width}} {value}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(*, json_output: bool = False, probes: bool = True) -> int:
    """Print the report (text, or JSON with json_output=True). Always 0: doctor reports problems, it does not
    fail on them."""
    found = report(probes=probes)
    if json_output:
        print(json.dumps(found, indent=2))
    else:
        sys.stdout.write(format_report(found))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
