"""The layout of fray_monarch (issue 32): subpackages by the process that runs them, no import circles (type-only
and function-local imports included), every module under 450 lines, and the driver's modules import nothing of
the worker processes' (driver/ finds the actor classes it spawns by name: core/actor_classes.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from _import_graph import import_circles, import_graph

SRC = Path(__file__).resolve().parents[2] / "backends/monarch/src"
PACKAGE = "fray_monarch"
MAX_LINES = 450


def test_no_import_circles() -> None:
    assert import_circles(SRC, PACKAGE) == []


def test_every_module_under_450_lines() -> None:
    modules = sorted((SRC / PACKAGE).rglob("*.py"))
    assert len(modules) > 40
    long = {str(p.relative_to(SRC)): n for p in modules if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert long == {}


def test_the_driver_imports_nothing_of_the_workers() -> None:
    graph = import_graph(SRC, PACKAGE)
    driver = {m for m in graph if m.startswith(f"{PACKAGE}.driver.") or m == f"{PACKAGE}.driver"}
    assert len(driver) > 10
    crossing = {m: sorted(t for t in graph[m] if t.startswith(f"{PACKAGE}.workers")) for m in driver}
    assert {m: ts for m, ts in crossing.items() if ts} == {}


def test_shared_modules_import_neither_wing() -> None:
    """core/, net/ and data/ serve the driver and the workers alike: they import neither wing."""
    graph = import_graph(SRC, PACKAGE)
    shared = [m for m in graph if m.split(".")[1:2] in (["core"], ["net"], ["data"])]
    assert len(shared) > 15
    wings = (f"{PACKAGE}.driver", f"{PACKAGE}.workers")
    crossing = {m: sorted(t for t in graph[m] if t.startswith(wings)) for m in shared}
    assert {m: ts for m, ts in crossing.items() if ts} == {}


def test_underscore_modules_are_private_to_their_package() -> None:
    """A module whose name starts with `_` is imported only by modules of its own package (issue 32)."""
    graph = import_graph(SRC, PACKAGE)
    private = {m for m in graph if m.rpartition(".")[2].startswith("_")}
    outside = {
        (m, t)
        for m, ts in graph.items()
        for t in ts
        if t in private and m.rpartition(".")[0] != t.rpartition(".")[0] and m != t.rpartition(".")[0]
    }
    assert outside == set()


def test_imported_names_carry_no_underscore() -> None:
    """A name another module of fray_monarch imports from it carries no leading underscore (issue 32)."""
    found = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE)):
                found += [f"{path.relative_to(SRC)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert found == []
