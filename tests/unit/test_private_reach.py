"""No reach into another object's private attributes in the kit, in fray_monarch's data plane and driver, and in
its cluster context and the job recovery it owns: a collaborator is handed what it needs (the kit's actor table
gets its context's ledger, checked-functions memo and hooks when it is made; the recovery, the context's hooks)
instead of reading `ctx._ledger`. `self._x`, `cls._x` and `super()._x` are an object's
own; anything else named `X._y` is a reach (.agents/architecture.md, "Leading underscores")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = [
    REPO / "lib/fray/src/fray/kit",
    REPO / "backends/monarch/src/fray_monarch/data",
    REPO / "backends/monarch/src/fray_monarch/driver",
    # The cluster context and the recovery of its jobs that it owns (the rest of cluster/ wraps Monarch's job
    # objects, whose state Monarch has no public names for).
    REPO / "backends/monarch/src/fray_monarch/cluster/context.py",
    REPO / "backends/monarch/src/fray_monarch/cluster/job_recovery.py",
    REPO / "backends/monarch/src/fray_monarch/cluster/host_recovery.py",
]
# Private names of other modules that are their documented API, each with why it is needed.
ALLOWED = {
    "os._exit": "a process that must end now, without running exit handlers or flushing inherited buffers",
}


def private_reaches(source: str, where: str) -> list[str]:
    """Each `X._name` in `source` where X is not self, cls or super() and `X._name` is not in ALLOWED."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if ast.unparse(node) in ALLOWED:
            continue
        found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("folder", CHECKED, ids=[str(f.relative_to(REPO)) for f in CHECKED])
def test_no_reach_into_another_objects_private_attributes(folder: Path) -> None:
    modules = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder] if folder.is_file() else []
    assert modules, f"{folder} has no modules: fix CHECKED"
    reaches = [r for p in modules for r in private_reaches(p.read_text(), str(p.relative_to(REPO)))]
    assert reaches == [], (
        "private attributes of another object (hand the collaborator what it needs, or give the name a public "
        "one):\n" + "\n".join(reaches)
    )


def test_the_check_sees_a_reach() -> None:
    source = """
class Table:
    def __init__(self, ctx, ledger):
        self._own = ctx._ledger
        self.ledger = ledger
        super()._init()
        with self.ctx._lock, cls._count:
            os._exit(1)
"""
    assert private_reaches(source, "m") == ["m:4: ctx._ledger", "m:7: self.ctx._lock"]
