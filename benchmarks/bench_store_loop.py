"""Steady-state memory of a backend's object store: the same large value made again and again, in a loop (issue 21).

    python benchmarks/bench_store_loop.py [--backend monarch] [--size-mib 100] [--iterations 20] [--quick]

Loops, each a fresh value of the size every iteration (the previous one's ref dropped), numpy float32 and torch
float32:

- put: `ctx.put(value)` alone (what the caller waits for);
- put -> task: `put`, then a task in another process reads it (length and first element);
- task -> driver: a task makes the value, the driver gets it (the whole call: create, wait, get);
- actor -> driver: an actor method makes the value, the driver gets it.

Each loop runs one warm-up iteration, then `--iterations` timed ones; p50, p90 and the samples are printed beside
memcpy (np.copyto of the size into preallocated, pre-touched memory) sampled in the same run between loops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import memcpy_seconds, percentile, under_socket_guard

import fray

MiB = 1 << 20


def make(kind: str, n: int) -> Any:
    if kind == "torch":
        import torch

        return torch.full((n,), 1.5, dtype=torch.float32)
    return np.full(n, 1.5, dtype=np.float32)


def tiny(x: Any) -> tuple[int, float]:
    return int(x.shape[0]), float(x[0])


class Maker:
    def make(self, kind: str, n: int) -> Any:
        return make(kind, n)


def loop(fn: Callable[[], object], iterations: int) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def cases(ctx: Any, maker: Any, kind: str, n: int) -> dict[str, Callable[[], object]]:
    values = [make(kind, n) for _ in range(2)]  # made before the loop: the loop times the store, not the fill
    turn = iter(range(1 << 30))

    def value() -> Any:
        return values[next(turn) % 2]

    return {
        "put": lambda: ctx.put(value()),
        "put -> task": lambda: ctx.get(ctx.create_task(tiny, args=(ctx.put(value()),)), timeout=300),
        "task -> driver": lambda: ctx.get(ctx.create_task(make, args=(kind, n)), timeout=300),
        "actor -> driver": lambda: ctx.get(maker.make(kind, n), timeout=300),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="monarch", help="in_memory, ray or monarch (procs=2)")
    parser.add_argument("--size-mib", type=float, default=100)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--kinds", default="numpy,torch")
    parser.add_argument("--quick", action="store_true", help="2 MiB values, 3 iterations (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.iterations = 2, 3
    nbytes = int(args.size_mib * MiB)
    n = nbytes // 4
    spec = {"monarch": "monarch?procs=2"}.get(args.backend, args.backend)
    ctx = fray.init(spec)
    maker = ctx.create_actor(Maker)
    ctx.get(ctx.create_task(tiny, args=(np.zeros(4, dtype=np.float32),)), timeout=300)
    ctx.get(maker.make("numpy", 4), timeout=300)
    memcpy: list[float] = []
    rows: list[tuple[str, list[float]]] = []
    for kind in args.kinds.split(","):
        for case, fn in cases(ctx, maker, kind, n).items():
            memcpy += memcpy_seconds(nbytes, repeats=7)
            rows.append((f"{kind} {case}", loop(fn, args.iterations)))
    memcpy += memcpy_seconds(nbytes, repeats=7)
    copy = statistics.median(memcpy)
    print(f"\n{ctx.backend}: {args.size_mib:g} MiB values, {args.iterations} iterations after one warm-up")
    print(f"memcpy p50 {copy * 1e3:.1f} ms (range {min(memcpy) * 1e3:.1f}-{max(memcpy) * 1e3:.1f})")
    print(f"{'loop':24} {'p50 ms':>8} {'p90 ms':>8} {'p50/memcpy':>11} {'p90/memcpy':>11}  samples (ms)")
    for name, samples in rows:
        p50, p90 = percentile(samples, 50), percentile(samples, 90)
        shown = " ".join(f"{s * 1e3:.0f}" for s in samples)
        print(f"{name:24} {p50 * 1e3:8.1f} {p90 * 1e3:8.1f} {p50 / copy:11.1f} {p90 / copy:11.1f}  {shown}")
    fray.shutdown()


if __name__ == "__main__":
    under_socket_guard()
    main()
