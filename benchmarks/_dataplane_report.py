"""bench_dataplane.py's report: the table of cells, the project's targets, versions."""

from __future__ import annotations

import os
import platform
import statistics
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from _common import percentile
from _dataplane_common import (
    ACTOR_ARG,
    CASE_ORDER,
    CREATE_GET,
    GET_ONLY,
    KINDS,
    PAIRS,
    PUT_TASK,
    SYSTEM_ORDER,
    GiB,
    MiB,
    Results,
    fmt_time,
    size_label,
)


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
            "p90_s": percentile(samples, 90),
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
    head = ("size", "case", "kind", "system", "n", "p50", "p90", "best", "GB/s p50", "fray/raw p50", "fray/raw best")
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
            fmt_time(r["p90_s"]),
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

    def p90(system: str, case: str, kind: str) -> tuple[float, float] | None:
        s = res.cell(system, case, kind, size)
        return (percentile(s, 90), min(s)) if s else None

    memcpy = med("memcpy", "np.copyto", "bytes")
    for kind in KINDS:
        for case in (PUT_TASK, GET_ONLY, CREATE_GET, ACTOR_ARG):
            fm = med("fray-monarch", case, kind)
            goal = 4 if case == CREATE_GET else 3  # the whole call (task makes it -> driver has it): issue 21
            add(f"fray-monarch {case} {kind} / memcpy", fm, memcpy, f"<= {goal}", lambda r, g=goal: r <= g)
            add(f"fray-monarch {case} {kind} / raw Ray", fm, med("raw-ray", case, kind), "< 1", lambda r: r < 1)
    add(  # issue 21: the steady state of a put loop, not only its median
        f"fray-monarch {PUT_TASK} numpy p90 / memcpy p50",
        p90("fray-monarch", PUT_TASK, "numpy"),
        memcpy,
        "<= 3",
        lambda r: r <= 3,
    )
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
    print(f"\nTargets at {size_label(rows[0]['size'])} (ratios of p50s or as named, and of bests; < 1: fray faster)")
    head = ("what", "ratio", "best", "target", "met")
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
