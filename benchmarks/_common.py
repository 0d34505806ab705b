"""Shared benchmark helpers: medians over repeats and a ratio table (fray / engine used directly)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def report(title: str, rows: list[tuple[str, str, float, float]]) -> None:
    """rows: (name, unit, fray_value, raw_value) where unit is 'us' (lower is better) or '/s' (higher is better)."""
    print(f"\n{title}")
    print(f"{'benchmark':44} {'fray':>14} {'raw':>14} {'fray/raw':>9}")
    for name, unit, fray_value, raw_value in rows:
        ratio = fray_value / raw_value if raw_value else float("nan")
        print(f"{name:44} {fray_value:>12.1f}{unit:>2} {raw_value:>12.1f}{unit:>2} {ratio:>9.2f}")
