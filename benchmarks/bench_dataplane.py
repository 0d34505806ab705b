"""Large values through every backend's data plane, beside the engines used directly and one memcpy, in one run.

    python benchmarks/bench_dataplane.py [--sizes 1M,100M,1G] [--repeats N] [--backends ...] [--json PATH]

Run by hand (not in CI): the full run takes ~6 minutes on 2 cores and needs ~8 GiB of free memory at 1 GiB.

For numpy arrays and torch CPU tensors (float32) of each size:

- put -> task: `put` the value, a task in another process reads it and returns (length, first element);
- task -> get: a task makes the value and the driver gets it; "get only" is timed after `wait` said the task
  is done (the transfer alone), "create+get" is the whole create, wait and get;
- actor arg: the value passed by value to an actor method, which returns (length, first element).

Systems (`--backends`, comma separated; default all):

- in_memory: fray's in-process backend (threads; values serialized as on a cluster).
- ray: fray-ray and raw Ray (ray.put, @ray.remote tasks and actors) in the same private Ray cluster, samples
  interleaved (raw, fray, fray, raw, ...), so both see the same machine load.
- monarch: fray-monarch (`monarch?procs=2`) and raw Monarch endpoints (an actor mesh of one process spawned
  with `this_host().spawn_procs`, the value passed to / returned from `call_one`), interleaved; also the
  driver's RSS growth while the largest size moves from one fray task to another. Monarch has no put: no
  raw-monarch row for put -> task; its "task -> get" is a value returned from an endpoint (made and kept by
  the actor in a first call).
- rdma: Monarch's `RDMABuffer` read of the size (here its TCP fallback): a cell stops once its 60 s budget
  would be exceeded, and is skipped (with a note) if one read is predicted to take longer.
Between hosts (separate network namespaces, beside a plain TCP socket between them): benchmarks/bench_hosts.py.

memcpy (np.copyto of the size into preallocated, pre-touched memory) is sampled in every phase: the machine's
limit under the same load. Repeats: 15 back-to-back below 1 GiB, 3 at 1 GiB (`--repeats` sets all), after one
warm-up below 1 GiB. The table gives p50, p90 and best; fray/raw where fray and the engine ran interleaved; "task
-> get (create+get)" is the whole call (a task makes the value -> the driver has it). Then the
project's targets at 100 MiB (or the largest size below 1 GiB given); fray-monarch against raw Ray and
memcpy compares medians from different phases (not interleaved).

Modules: this one (what runs in the workers, the raw Monarch actor, main), _dataplane_common.py (constants,
results, sampling), _dataplane_phases.py (each system's operations and phases), _dataplane_report.py (table,
targets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _dataplane_phases
from _common import under_socket_guard
from _dataplane_common import BACKENDS, RAY_STORE, GiB, MiB, Results, log, memcpy_samples, parse_size, size_label
from _dataplane_phases import phase_in_memory, phase_monarch, phase_ray, phase_rdma
from _dataplane_report import print_table, print_targets, rows_of, targets, versions

import fray


# ---------------------------------------------------------------- what runs in the workers (sent by value)
def make(kind: str, n: int) -> Any:
    """n float32 values, freshly allocated."""
    if kind == "torch":
        import torch

        return torch.full((n,), 1.5, dtype=torch.float32)
    return np.full(n, 1.5, dtype=np.float32)


def tiny(x: Any) -> tuple[int, float]:
    """What a reader returns: the length and the first element (touches one page, so the result is not the cost)."""
    return int(x.shape[0]), float(x[0])


class Sink:
    """A fray actor that reads values and makes them."""

    def read(self, x: Any) -> tuple[int, float]:
        return tiny(x)

    def make(self, kind: str, n: int) -> Any:
        return make(kind, n)

    def host(self) -> int:
        """A first call, so that the actor's process is up before timing (was lost with the hosts phase)."""
        return os.getpid()


try:  # raw Monarch endpoints (module level: Monarch's processes import this module to find the class)
    from monarch.actor import Actor, endpoint

    from fray_monarch.core import runtime  # noqa: F401 - environment and fault hook before Monarch starts
except ImportError:  # no monarch: the monarch, rdma and hosts phases report the ImportError
    Actor, endpoint = object, None  # type: ignore[assignment,misc]

if endpoint is not None:

    class RawSink(Actor):  # type: ignore[misc,valid-type]
        """Raw Monarch endpoints: a value as argument, as return value, and an RDMABuffer over owned memory."""

        def __init__(self) -> None:
            self.kept: Any = None
            self.data: Any = None
            self.buffer: Any = None

        @endpoint  # type: ignore[misc]
        def read(self, x: Any) -> tuple[int, float]:
            return tiny(x)

        @endpoint  # type: ignore[misc]
        def keep(self, kind: str, n: int) -> None:
            self.kept = make(kind, n)

        @endpoint  # type: ignore[misc]
        def take(self) -> Any:
            value, self.kept = self.kept, None
            return value

        @endpoint  # type: ignore[misc]
        def rdma_hold(self, nbytes: int) -> Any:
            from monarch.rdma import RDMABuffer

            warnings.simplefilter("ignore")  # RDMATcpFallbackWarning
            self._drop()
            self.data = bytearray(b"\x07") * nbytes
            self.buffer = RDMABuffer(memoryview(self.data))
            return self.buffer

        @endpoint  # type: ignore[misc]
        def rdma_drop(self) -> None:
            self._drop()

        def _drop(self) -> None:
            if self.buffer is not None:
                try:
                    self.buffer.drop()
                except Exception:
                    pass
            self.buffer = self.data = None


@contextmanager
def raw_monarch_actor() -> Iterator[Any]:
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        procs.initialized.get(timeout=120)
        mesh = procs.spawn("bench_dataplane_raw", RawSink)
        yield mesh
    finally:
        try:
            procs.stop().get(timeout=60)
        except Exception as exc:
            log(f"raw Monarch procs did not stop cleanly: {exc!r}")


def main() -> None:
    _dataplane_phases.use(make=make, tiny=tiny, Sink=Sink, raw_monarch_actor=raw_monarch_actor)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,100M,1G", help="comma separated, K/M/G = KiB/MiB/GiB")
    parser.add_argument("--repeats", type=int, default=None, help="samples per cell (default 15, 3 at >= 1 GiB)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"any of {','.join(BACKENDS)}")
    parser.add_argument("--json", default=None, help="also write the results here")
    opts = parser.parse_args()
    sizes = sorted({parse_size(s) for s in opts.sizes.split(",") if s.strip()})
    if any(s < 4 or s % 4 for s in sizes):
        parser.error("sizes must be positive multiples of 4 bytes (float32)")
    chosen = [b.strip() for b in opts.backends.split(",") if b.strip()]
    unknown = set(chosen) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")

    def repeats_of(size: int) -> int:
        return opts.repeats or (3 if size >= GiB else 15)

    res = Results()
    load_start = os.getloadavg()
    started = time.perf_counter()
    phases = {
        "in_memory": phase_in_memory,
        "ray": phase_ray,
        "monarch": phase_monarch,
        "rdma": phase_rdma,
    }
    try:
        # rdma before monarch: raw Monarch processes spawned after a fray-monarch context has shut down fail to
        # start ("failed to configure process", exit code 1), a fray-monarch context after them works
        for name in ("in_memory", "ray", "rdma", "monarch"):
            if name in chosen:
                log(f"== {name}")
                t0 = time.perf_counter()
                try:
                    phases[name](res, sizes, repeats_of)
                except Exception as exc:  # report what was measured; name the phase that failed
                    res.note(f"{name}: FAILED with {type(exc).__name__}: {exc}")
                    import traceback

                    traceback.print_exc()
                log(f"== {name} done in {time.perf_counter() - t0:.0f} s")
        if not chosen:
            for size in sizes:
                memcpy_samples(res, size, repeats_of(size))
    finally:
        fray.shutdown()

    rows = rows_of(res)
    goals = targets(res, sizes)
    meta = {
        **versions(),
        "sizes": sizes,
        "backends": chosen,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "ray_object_store_memory": RAY_STORE,
    }
    print(
        f"\nData plane: float32 numpy / torch CPU, p50, p90 and best of n (interleaved where a fray/raw pair "
        f"exists); {meta['cpus']} CPUs, load avg {load_start[0]:.1f} -> {meta['load_avg_end'][0]:.1f}, "
        f"{meta['wall_s']:.0f} s\n"
    )
    print_table(rows)
    print_targets(goals)
    if res.rss:
        print("\nDriver RSS while values move between two workers (numpy)")
        for r in res.rss:
            peak = f"{r['peak_growth_mib']:.1f} MiB" if r["peak_growth_mib"] is not None else "n/a"
            paths = ", ".join(f"{p} {b / MiB:.0f} MiB" for p, b in r["paths"].items()) or "none"
            print(
                f"- {r['what']}, {size_label(r['size'])}: RSS grew {r['rss_growth_mib']:.1f} MiB, peak "
                f"{peak} (from {r['rss_before_mib']:.0f} MiB); paths: {paths}"
            )
    if res.stats:
        print("\ntransfer_stats at the end of each phase (all processes of the context)")
        for system, paths in res.stats.items():
            parts = []
            for p, v in paths.items():
                gbps = v["bytes"] / v["seconds"] / 1e9 if v["seconds"] else 0.0
                parts.append(f"{p} {v['count']:.0f}x {v['bytes'] / MiB:.0f} MiB {gbps:.2f} GB/s")
            print(f"- {system}: " + "; ".join(parts))
    if res.notes:
        print("\nNotes")
        for n in res.notes:
            print(f"- {n}")
    if opts.json:
        payload = {
            "meta": meta,
            "cells": rows,
            "targets": goals,
            "rss": res.rss,
            "transfer_stats": res.stats,
            "notes": res.notes,
        }
        Path(opts.json).write_text(json.dumps(payload, indent=2, default=str))
        print(f"\nwrote {opts.json}")


if __name__ == "__main__":
    under_socket_guard()
    main()
