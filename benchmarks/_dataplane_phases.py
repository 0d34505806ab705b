"""bench_dataplane.py's phases: each system's operations and how they are sampled.

What runs in workers (make, tiny, Sink, the raw Monarch actor) stays in bench_dataplane.py, the __main__ module,
so that it travels by value to every engine's processes; it reaches this module through `use(...)`.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from _dataplane_common import (
    ACTOR_ARG,
    CREATE_GET,
    GET_ONLY,
    KINDS,
    PUT_TASK,
    RAY_STORE,
    RDMA_BUDGET,
    RDMA_READ,
    TIMEOUT,
    MiB,
    Results,
    check,
    interleave,
    log,
    memcpy_samples,
    reset_peak_rss,
    rss_kib,
    settle_rss,
    size_label,
    stats_delta,
    stats_snapshot,
    values_for,
    warmup_of,
)

import fray

W = SimpleNamespace()  # make, tiny, Sink, raw_monarch_actor: set by use()


def use(**workload: Any) -> None:
    W.__dict__.update(workload)


def fray_ops(
    system: str, ctx: Any, actor: Any, value: Any, kind: str, n: int
) -> dict[str, Callable[[], dict[str, float]]]:
    """put -> task, task -> get and actor arg through a fray context."""

    def put_task() -> dict[str, float]:
        start = time.perf_counter()
        check(ctx.get(ctx.create_task(W.tiny, args=(ctx.put(value),)), timeout=TIMEOUT), n)
        return {PUT_TASK: time.perf_counter() - start}

    def task_get() -> dict[str, float]:
        start = time.perf_counter()
        ref = ctx.create_task(W.make, args=(kind, n))
        done, _ = ctx.wait([ref], timeout=TIMEOUT)
        if not done:
            raise TimeoutError(f"{system}: task making {kind} did not finish in {TIMEOUT} s")
        waited = time.perf_counter()
        got = ctx.get(ref, timeout=TIMEOUT)
        end = time.perf_counter()
        check(W.tiny(got), n)
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
        check(W.tiny(got), n)
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
        check(W.tiny(got), n)
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
        actor = ctx.create_actor(W.Sink)
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
        raw_tiny, raw_make = ray.remote(W.tiny), ray.remote(W.make)
        raw_actor = ray.remote(W.Sink).options(num_cpus=0).remote()
        actor = ctx.create_actor(W.Sink)
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


def phase_monarch(res: Results, sizes: list[int], repeats_of: Callable[[int], int]) -> None:
    ctx = fray.init("monarch?procs=2")
    try:
        with W.raw_monarch_actor() as raw:
            actor = ctx.create_actor(W.Sink)
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

        ref = ctx.create_task(W.make, args=("numpy", n), options=TaskOptions(max_retries=0))
        result = ctx.get(ctx.create_task(W.tiny, args=(ref,)), timeout=TIMEOUT)
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
    with W.raw_monarch_actor() as raw:
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
