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
limit under the same load. Repeats: 7 below 1 GiB, 3 at 1 GiB (`--repeats` sets all), after one warm-up
below 1 GiB. The table gives median and best; fray/raw where fray and the engine ran interleaved. Then the
project's targets at 100 MiB (or the largest size below 1 GiB given); fray-monarch against raw Ray and
memcpy compares medians from different phases (not interleaved).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

import fray

MiB = 1 << 20
GiB = 1 << 30
TIMEOUT = 900.0  # seconds for any one get / wait
RDMA_BUDGET = 60.0  # seconds for one RDMABuffer cell
RAY_STORE = 4 * GiB
BACKENDS = ("in_memory", "ray", "monarch", "rdma")
KINDS = ("numpy", "torch")
PUT_TASK, GET_ONLY, CREATE_GET, ACTOR_ARG = (
    "put -> task",
    "task -> get (get only)",
    "task -> get (create+get)",
    "actor arg",
)
RDMA_READ = "RDMABuffer read_into"
CASE_ORDER = (PUT_TASK, GET_ONLY, CREATE_GET, ACTOR_ARG, RDMA_READ, "np.copyto")
SYSTEM_ORDER = ("memcpy", "in_memory", "fray-ray", "raw-ray", "fray-monarch", "raw-monarch", "raw-rdma")
PAIRS = {"fray-ray": "raw-ray", "fray-monarch": "raw-monarch"}


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


# ---------------------------------------------------------------- results
class Results:
    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, str, int], list[float]] = {}
        self.notes: list[str] = []
        self.rss: list[dict[str, Any]] = []
        self.stats: dict[str, dict[str, dict[str, float]]] = {}

    def add(self, system: str, case: str, kind: str, size: int, seconds: float) -> None:
        self.samples.setdefault((system, case, kind, size), []).append(seconds)

    def note(self, text: str) -> None:
        self.notes.append(text)
        log(f"NOTE: {text}")

    def cell(self, system: str, case: str, kind: str, size: int) -> list[float] | None:
        return self.samples.get((system, case, kind, size))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def size_label(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} B"


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": MiB, "G": GiB}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 10:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def rss_kib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":")
            out[key] = int(value.split()[0])
    return out


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def settle_rss(limit: float = 10.0) -> None:
    """Wait (up to limit seconds) until the RSS moves by less than 1 MiB in 0.5 s."""
    deadline = time.monotonic() + limit
    last = rss_kib()["VmRSS"]
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_kib()["VmRSS"]
        if abs(now - last) < 1024:
            return
        last = now


def stats_snapshot(ctx: Any) -> dict[str, dict[str, float]]:
    return {
        path: {"count": ps.count, "bytes": ps.bytes, "seconds": ps.seconds} for path, ps in ctx.transfer_stats().items()
    }


def stats_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, int]:
    """Bytes moved per path between two snapshots."""
    return {
        path: int(v["bytes"] - before.get(path, {}).get("bytes", 0))
        for path, v in after.items()
        if v["bytes"] - before.get(path, {}).get("bytes", 0) > 0
    }


def values_for(n_bytes: int) -> dict[str, Any]:
    import torch

    n = n_bytes // 4
    return {"numpy": np.full(n, 1.5, dtype=np.float32), "torch": torch.full((n,), 1.5, dtype=torch.float32)}


def check(result: Any, n: int) -> None:
    if tuple(result) != (n, 1.5):
        raise AssertionError(f"reader returned {result!r}, expected ({n}, 1.5)")


# ---------------------------------------------------------------- sampling
def interleave(
    res: Results, kind: str, size: int, ops: list[tuple[str, Callable[[], dict[str, float]]]], repeats: int, warmup: int
) -> None:
    """Run each system's op once per round, alternating which goes first; record every round after the warm-up.
    An op returns {case: seconds} and drops its values before returning (stores do not fill up)."""
    for round_ in range(warmup + repeats):
        for system, op in ops if round_ % 2 == 0 else ops[::-1]:
            out = op()
            if round_ >= warmup:
                for case, seconds in out.items():
                    res.add(system, case, kind, size, seconds)
        gc.collect()


def memcpy_samples(res: Results, size: int, repeats: int) -> None:
    src = np.full(size // 4, 1.5, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0)  # fault the pages in: one memcpy is the limit being measured, not page faults
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        res.add("memcpy", "np.copyto", "bytes", size, time.perf_counter() - start)
    del src, dst


def fray_ops(
    system: str, ctx: Any, actor: Any, value: Any, kind: str, n: int
) -> dict[str, Callable[[], dict[str, float]]]:
    """put -> task, task -> get and actor arg through a fray context."""

    def put_task() -> dict[str, float]:
        start = time.perf_counter()
        check(ctx.get(ctx.create_task(tiny, args=(ctx.put(value),)), timeout=TIMEOUT), n)
        return {PUT_TASK: time.perf_counter() - start}

    def task_get() -> dict[str, float]:
        start = time.perf_counter()
        ref = ctx.create_task(make, args=(kind, n))
        done, _ = ctx.wait([ref], timeout=TIMEOUT)
        if not done:
            raise TimeoutError(f"{system}: task making {kind} did not finish in {TIMEOUT} s")
        waited = time.perf_counter()
        got = ctx.get(ref, timeout=TIMEOUT)
        end = time.perf_counter()
        check(tiny(got), n)
        del got, ref
        return {GET_ONLY: end - waited, CREATE_GET: end - start}

    def actor_arg() -> dict[str, float]:
        start = time.perf_counter()
        check(ctx.get(actor.read(value), timeout=TIMEOUT), n)
        return {ACTOR_ARG: time.perf_counter() - start}

    return {PUT_TASK: put_task, "task -> get": task_get, ACTOR_ARG: actor_arg}


def raw_ray_ops(
    ray: Any, raw_tiny: Any, raw_make: Any, raw_actor: Any, value: Any, kind: str, n: int
) -> dict[str, Callable[[], dict[str, float]]]:
    """The same three cases with Ray used directly: ray.put, @ray.remote tasks, an actor method."""

    def put_task() -> dict[str, float]:
        start = time.perf_counter()
        check(ray.get(raw_tiny.remote(ray.put(value)), timeout=TIMEOUT), n)
        return {PUT_TASK: time.perf_counter() - start}

    def task_get() -> dict[str, float]:
        start = time.perf_counter()
        ref = raw_make.remote(kind, n)
        done, _ = ray.wait([ref], timeout=TIMEOUT)
        if not done:
            raise TimeoutError(f"raw Ray task making {kind} did not finish in {TIMEOUT} s")
        waited = time.perf_counter()
        got = ray.get(ref, timeout=TIMEOUT)
        end = time.perf_counter()
        check(tiny(got), n)
        del got, ref
        return {GET_ONLY: end - waited, CREATE_GET: end - start}

    def actor_arg() -> dict[str, float]:
        start = time.perf_counter()
        check(ray.get(raw_actor.read.remote(value), timeout=TIMEOUT), n)
        return {ACTOR_ARG: time.perf_counter() - start}

    return {PUT_TASK: put_task, "task -> get": task_get, ACTOR_ARG: actor_arg}


def raw_monarch_ops(raw: Any, value: Any, kind: str, n: int) -> dict[str, Callable[[], dict[str, float]]]:
    """Monarch endpoints used directly: the value returned from call_one (made and kept by the actor in a first
    call, so "get only" is the return alone) and passed to call_one. Monarch has no put."""

    def returned() -> dict[str, float]:
        start = time.perf_counter()
        raw.keep.call_one(kind, n).get(timeout=TIMEOUT)
        made = time.perf_counter()
        got = raw.take.call_one().get(timeout=TIMEOUT)
        end = time.perf_counter()
        check(tiny(got), n)
        del got
        return {GET_ONLY: end - made, CREATE_GET: end - start}

    def argument() -> dict[str, float]:
        start = time.perf_counter()
        check(raw.read.call_one(value).get(timeout=TIMEOUT), n)
        return {ACTOR_ARG: time.perf_counter() - start}

    return {"task -> get": returned, ACTOR_ARG: argument}


# ---------------------------------------------------------------- phases
def phase_in_memory(res: Results, sizes: list[int], repeats_of: Callable[[int], int]) -> None:
    ctx = fray.init("in_memory?cpus=2")
    try:
        actor = ctx.create_actor(Sink)
        for size in sizes:
            memcpy_samples(res, size, repeats_of(size))
            values = values_for(size)
            for kind in KINDS:
                ops = fray_ops("in_memory", ctx, actor, values[kind], kind, size // 4)
                for group, op in ops.items():
                    log(f"  in_memory {group} {kind} {size_label(size)}")
                    interleave(res, kind, size, [("in_memory", op)], repeats_of(size), warmup_of(size))
                del ops, op  # the closures hold the value
            del values
        res.stats["in_memory"] = stats_snapshot(ctx)
    finally:
        ctx.shutdown()


def phase_ray(res: Results, sizes: list[int], repeats_of: Callable[[int], int]) -> None:
    import ray

    ctx = fray.init(f"ray?num_cpus=4&object_store_memory={RAY_STORE}&log_to_driver=false")
    try:
        # raw Ray in the same driver uses the private cluster fray-ray started
        raw_tiny, raw_make = ray.remote(tiny), ray.remote(make)
        raw_actor = ray.remote(Sink).options(num_cpus=0).remote()
        actor = ctx.create_actor(Sink)
        ray.get(raw_actor.host.remote(), timeout=120)
        ctx.get(actor.host(), timeout=120)
        for size in sizes:
            memcpy_samples(res, size, repeats_of(size))
            values = values_for(size)
            n = size // 4
            for kind in KINDS:
                raw = raw_ray_ops(ray, raw_tiny, raw_make, raw_actor, values[kind], kind, n)
                for group, op in fray_ops("fray-ray", ctx, actor, values[kind], kind, n).items():
                    log(f"  ray {group} {kind} {size_label(size)}")
                    pair = [("raw-ray", raw[group]), ("fray-ray", op)]
                    interleave(res, kind, size, pair, repeats_of(size), warmup_of(size))
                del raw, op, pair  # the closures hold the value
            del values
        res.stats["fray-ray"] = stats_snapshot(ctx)
    finally:
        ctx.shutdown()


try:  # raw Monarch endpoints (module level: Monarch's processes import this module to find the class)
    from monarch.actor import Actor, endpoint

    from fray_monarch import _runtime  # noqa: F401 - environment and fault hook before Monarch starts
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


def phase_monarch(res: Results, sizes: list[int], repeats_of: Callable[[int], int]) -> None:
    ctx = fray.init("monarch?procs=2")
    try:
        with raw_monarch_actor() as raw:
            actor = ctx.create_actor(Sink)
            ctx.get(actor.host(), timeout=120)
            rss_move(res, ctx, "", MiB, tasks=True, record=False)  # warm-up: both workers started, code loaded
            rss_move(res, ctx, "fray-monarch, one host: a task makes it, another task reads it", max(sizes), tasks=True)
            for size in sizes:
                memcpy_samples(res, size, repeats_of(size))
                values = values_for(size)
                n = size // 4
                for kind in KINDS:
                    raw_ops = raw_monarch_ops(raw, values[kind], kind, n)
                    for group, op in fray_ops("fray-monarch", ctx, actor, values[kind], kind, n).items():
                        log(f"  monarch {group} {kind} {size_label(size)}")
                        pair = [("fray-monarch", op)]
                        if group in raw_ops:
                            pair.insert(0, ("raw-monarch", raw_ops[group]))
                        interleave(res, kind, size, pair, repeats_of(size), warmup_of(size))
                    del raw_ops, op, pair  # the closures hold the value
                del values
        res.stats["fray-monarch"] = stats_snapshot(ctx)
    finally:
        ctx.shutdown()


def rss_move(
    res: Results,
    ctx: Any,
    label: str,
    size: int,
    tasks: bool,
    actors: tuple[Any, Any] | None = None,
    record: bool = True,
) -> None:
    """The driver's RSS before and after (and its peak, VmHWM reset first) while `size` of numpy moves between
    two workers: task -> task on one host, or actor on host A -> actor on host B. Run before the driver holds
    large values of its own, once its RSS is steady (frees of earlier values would hide growth)."""
    n = size // 4
    gc.collect()
    settle_rss()
    before_stats = stats_snapshot(ctx)
    peak_ok = reset_peak_rss()
    before = rss_kib()
    if tasks:
        from fray import TaskOptions

        ref = ctx.create_task(make, args=("numpy", n), options=TaskOptions(max_retries=0))
        result = ctx.get(ctx.create_task(tiny, args=(ref,)), timeout=TIMEOUT)
    else:
        assert actors is not None
        ref = actors[0].make("numpy", n)
        result = ctx.get(actors[1].read(ref), timeout=TIMEOUT)
    after = rss_kib()
    check(result, n)
    del ref
    moved = stats_delta(before_stats, stats_snapshot(ctx))
    if not record:
        return
    entry = {
        "what": label,
        "size": size,
        "rss_before_mib": before["VmRSS"] / 1024,
        "rss_growth_mib": (after["VmRSS"] - before["VmRSS"]) / 1024,
        "peak_growth_mib": (after["VmHWM"] - before["VmRSS"]) / 1024 if peak_ok else None,
        "paths": moved,
    }
    res.rss.append(entry)
    log(f"  RSS {label} {size_label(size)}: {entry}")


def phase_rdma(res: Results, sizes: list[int], repeats_of: Callable[[int], int]) -> None:
    warnings.simplefilter("ignore")  # RDMATcpFallbackWarning, once per process
    from monarch.rdma import get_rdma_backend

    backend = get_rdma_backend()
    if backend == "none":
        res.note("rdma: skipped, Monarch has no RDMA backend here (no ibverbs, TCP fallback off)")
        return
    throughput = 0.0  # bytes/s seen at the previous size, to predict the next
    with raw_monarch_actor() as raw:
        for size in sizes:
            repeats, warmup = repeats_of(size), warmup_of(size)
            predicted = size / throughput if throughput else 0.0
            if predicted > RDMA_BUDGET:
                res.note(
                    f"rdma ({backend}) {size_label(size)}: skipped, one read would take ~{predicted:.0f} s at the "
                    f"{throughput / 1e6:.0f} MB/s seen at the previous size (budget {RDMA_BUDGET:.0f} s)"
                )
                continue
            log(f"  rdma {size_label(size)} ({backend})")
            memcpy_samples(res, size, repeats)
            buffer = raw.rdma_hold.call_one(size).get(timeout=TIMEOUT)
            dst = bytearray(size)
            spent, done, wanted = 0.0, 0, warmup + repeats
            if predicted * wanted > RDMA_BUDGET:
                warmup = 0
                wanted = repeats
            for round_ in range(wanted):
                if round_ and spent + spent / round_ > RDMA_BUDGET:
                    res.note(
                        f"rdma ({backend}) {size_label(size)}: capped at {done} of {repeats} reads "
                        f"({spent:.0f} s spent, budget {RDMA_BUDGET:.0f} s)"
                    )
                    break
                start = time.perf_counter()
                buffer.read_into(memoryview(dst), timeout=int(TIMEOUT)).get(timeout=TIMEOUT)
                seconds = time.perf_counter() - start
                spent += seconds
                if round_ >= wanted - repeats:
                    res.add("raw-rdma", RDMA_READ, "bytes", size, seconds)
                    done += 1
                throughput = max(throughput, size / seconds)
            if dst[:1] != b"\x07" or dst[-1:] != b"\x07":
                res.note(f"rdma {size_label(size)}: DATA MISMATCH in the bytes read")
            del dst, buffer
            raw.rdma_drop.call_one().get(timeout=60)


# ---------------------------------------------------------------- report
def warmup_of(size: int) -> int:
    return 1 if size < GiB else 0


def rows_of(res: Results) -> list[dict[str, Any]]:
    def order(key: tuple[str, str, str, int]) -> tuple[int, int, int, int]:
        system, case, kind, size = key
        kinds = ("bytes", *KINDS)
        return size, CASE_ORDER.index(case), kinds.index(kind), SYSTEM_ORDER.index(system)

    rows = []
    for key in sorted(res.samples, key=order):
        system, case, kind, size = key
        samples = res.samples[key]
        row = {
            "system": system,
            "case": case,
            "kind": kind,
            "size": size,
            "n": len(samples),
            "median_s": statistics.median(samples),
            "best_s": min(samples),
            "samples_s": samples,
        }
        row["gb_per_s"] = size / row["median_s"] / 1e9
        raw = res.cell(PAIRS.get(system, ""), case, kind, size)
        if raw:
            row["vs"] = PAIRS[system]
            row["ratio_median"] = row["median_s"] / statistics.median(raw)
            row["ratio_best"] = row["best_s"] / min(raw)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("size", "case", "kind", "system", "n", "median", "best", "GB/s med", "fray/raw med", "fray/raw best")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        ratio_m = f"{r['ratio_median']:.2f}" if "ratio_median" in r else ""
        ratio_b = f"{r['ratio_best']:.2f}" if "ratio_best" in r else ""
        cells = (
            size_label(r["size"]),
            r["case"],
            r["kind"],
            r["system"],
            str(r["n"]),
            fmt_time(r["median_s"]),
            fmt_time(r["best_s"]),
            f"{r['gb_per_s']:.2f}",
            ratio_m,
            ratio_b,
        )
        print("| " + " | ".join(cells) + " |")


def targets(res: Results, sizes: list[int]) -> list[dict[str, Any]]:
    below = [s for s in sizes if s < GiB]
    if not below:
        return []
    size = 100 * MiB if 100 * MiB in sizes else max(below)

    def med(system: str, case: str, kind: str) -> tuple[float, float] | None:
        s = res.cell(system, case, kind, size)
        return (statistics.median(s), min(s)) if s else None

    out: list[dict[str, Any]] = []

    def add(what: str, num: tuple[float, float] | None, den: tuple[float, float] | None, goal: str, ok: Any) -> None:
        if num is None or den is None:
            return
        ratio_m, ratio_b = num[0] / den[0], num[1] / den[1]
        out.append({"size": size, "what": what, "median": ratio_m, "best": ratio_b, "target": goal, "met": ok(ratio_m)})

    memcpy = med("memcpy", "np.copyto", "bytes")
    for kind in KINDS:
        for case in (PUT_TASK, GET_ONLY, ACTOR_ARG):
            fm = med("fray-monarch", case, kind)
            add(f"fray-monarch {case} {kind} / memcpy", fm, memcpy, "<= 3", lambda r: r <= 3)
            add(f"fray-monarch {case} {kind} / raw Ray", fm, med("raw-ray", case, kind), "< 1", lambda r: r < 1)
    for case in (PUT_TASK, GET_ONLY, ACTOR_ARG):
        add(
            f"fray-ray / raw Ray {case} numpy",
            med("fray-ray", case, "numpy"),
            med("raw-ray", case, "numpy"),
            "<= 1.1",
            lambda r: r <= 1.1,
        )
        add(
            f"fray-ray / raw Ray {case} torch",
            med("fray-ray", case, "torch"),
            med("raw-ray", case, "torch"),
            "<= 0.25 (4x faster)",
            lambda r: r <= 0.25,
        )
    return out


def print_targets(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print(f"\nTargets at {size_label(rows[0]['size'])} (ratios of medians and of bests; < 1 means fray is faster)")
    head = ("what", "median", "best", "target", "met (median)")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        met = "yes" if r["met"] else "NO"
        print(f"| {r['what']} | {r['median']:.2f} | {r['best']:.2f} | {r['target']} | {met} |")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "cpus": str(os.cpu_count())}
    for dist in ("numpy", "torch", "ray", "torchmonarch", "fray-core"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "-"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,100M,1G", help="comma separated, K/M/G = KiB/MiB/GiB")
    parser.add_argument("--repeats", type=int, default=None, help="samples per cell (default 7, 3 at >= 1 GiB)")
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
        return opts.repeats or (3 if size >= GiB else 7)

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
        for name in BACKENDS:
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
        f"\nData plane: float32 numpy / torch CPU, medians and best of n (interleaved where a fray/raw pair "
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
    main()
