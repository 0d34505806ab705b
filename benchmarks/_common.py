"""Shared benchmark helpers: medians and percentiles over repeats, the machine's memcpy, and a ratio table (fray /
engine used directly)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def percentile(samples: list[float], pct: float) -> float:
    """The pct-th percentile of samples (nearest rank: a value that was measured, never an interpolation)."""
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[min(int(rank), len(ordered)) - 1]


def memcpy_seconds(nbytes: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` copies of `nbytes` between two buffers already faulted in: the machine's
    limit for moving data in memory."""
    import numpy as np

    src = np.full(nbytes // 4, 1.5, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - start)
    return samples


def median_seconds(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def paired_medians(
    fray_fn: Callable[[], object], raw_fn: Callable[[], object], repeats: int = 7, warmup: int = 1
) -> tuple[float, float]:
    """Median seconds of each, measured interleaved (raw, fray, raw, fray...) so both see the same machine load."""
    for _ in range(warmup):
        raw_fn()
        fray_fn()
    fray_samples, raw_samples = [], []
    for _ in range(repeats):
        for fn, samples in ((raw_fn, raw_samples), (fray_fn, fray_samples)):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return statistics.median(fray_samples), statistics.median(raw_samples)


def report(title: str, rows: list[tuple[str, str, float, float]]) -> None:
    """rows: (name, unit, fray_value, raw_value) where unit is 'us' (lower is better) or '/s' (higher is better)."""
    print(f"\n{title}")
    print(f"{'benchmark':44} {'fray':>14} {'raw':>14} {'fray/raw':>9}")
    for name, unit, fray_value, raw_value in rows:
        ratio = fray_value / raw_value if raw_value else float("nan")
        print(f"{name:44} {fray_value:>12.1f}{unit:>2} {raw_value:>12.1f}{unit:>2} {ratio:>9.2f}")


def run_child(argv: list[str], env: dict[str, str] | None = None) -> Any:
    """Run `argv` (this benchmark in a fresh process of its own) with `--json PATH` added, PATH in a private
    temporary directory, and return the JSON it wrote there; None if it failed (its output says why)."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fray-bench-") as scratch:  # (0700: no other user's file is read)
        out = Path(scratch) / "result.json"
        if subprocess.run([*argv, "--json", str(out)], env=env, check=False).returncode != 0 or not out.exists():
            return None
        return json.loads(out.read_text())


def under_socket_guard() -> None:
    """A monarch driver starts under fray's socket guard (fray_monarch.socket_guard: other users of the machine
    are kept out of Monarch's sockets), and a benchmark is a driver: it starts again under the guard, before
    anything else has happened, where fray-monarch is installed."""
    import os
    import sys

    try:
        from fray_monarch import socket_guard
    except ImportError:
        return
    if not socket_guard.active():
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], socket_guard.guarded_environ())
