"""Import graph of the fray, fray_ray and fray_monarch packages, with every cycle (strongly connected component).

Every ``import`` / ``from ... import`` anywhere in a module counts (top level, inside functions, under
``if TYPE_CHECKING:``), relative imports resolved; only modules inside the three packages are nodes.
``from pkg import name`` counts as an edge to ``pkg.name`` when that is a module, else to ``pkg``.

Two views:
- runtime edges: top-level imports and imports inside functions/methods (what can actually deadlock or half-
  initialise a module at import time). ``test_no_import_cycles`` fails on any cycle here.
- all edges: runtime edges plus ``if TYPE_CHECKING:`` imports (annotation-only). Reported; the strict check
  ``check_no_import_cycles_including_type_checking`` is opt-in (named so that pytest does not collect it).
Implicit parent-package edges (importing ``pkg.mod`` first runs ``pkg/__init__``) are not counted.

Run:  python tests/unit/test_import_cycles.py [--all-edges] [--no-type-checking]
(pytest runs test_no_import_cycles.)
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


def _find_repo() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "lib/fray/src/fray").is_dir():
            return parent
    raise RuntimeError(f"no fray checkout above {__file__}")


REPO = _find_repo()
ROOTS = {
    "fray": REPO / "lib/fray/src/fray",
    "fray_ray": REPO / "backends/ray/src/fray_ray",
    "fray_monarch": REPO / "backends/monarch/src/fray_monarch",
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int
    where: str  # "top-level", "TYPE_CHECKING", or "in <func>"


def discover() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for root in ROOTS.values():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def edges_of(mod: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: list[Edge] = []
    rel_file = str(path.relative_to(REPO))

    def resolve(node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else []))

    def add(target: str, node: ast.stmt, where: str) -> None:
        # walk up to the longest known module prefix
        parts = target.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts:
            dst = ".".join(parts)
            if dst != mod:
                out.append(Edge(mod, dst, rel_file, node.lineno, where))

    def visit_fn(fn: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(fn):
            visit_stmt(child, where)

    def visit_stmt(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, where)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node)
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                if full in modules:
                    add(full, node, where)
                else:
                    add(base, node, where)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = f"in {node.name}()" if where in ("top-level", "TYPE_CHECKING") else f"{where[:-2]}.{node.name}()"
            visit_fn(node, inner)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit_fn(sub, f"in {node.name}.{sub.name}()")
                else:
                    visit_stmt(sub, where)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for sub in node.body:
                visit_stmt(sub, "TYPE_CHECKING" if where == "top-level" else where)
            for sub in node.orelse:
                visit_stmt(sub, where)
        else:
            for child in ast.iter_child_nodes(node):
                visit_stmt(child, where)

    for stmt in tree.body:
        visit_stmt(stmt, "top-level")
    return out


def graph(skip_type_checking: bool = False) -> tuple[dict[str, set[str]], list[Edge]]:
    modules = discover()
    g: dict[str, set[str]] = {m: set() for m in modules}
    all_edges: list[Edge] = []
    for mod, path in modules.items():
        for e in edges_of(mod, path, modules):
            if skip_type_checking and e.where == "TYPE_CHECKING":
                continue
            g[mod].add(e.dst)
            all_edges.append(e)
    return g, all_edges


def sccs(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def report(skip_type_checking: bool = False, all_edges_flag: bool = False) -> int:
    g, edges = graph(skip_type_checking)
    comps = sccs(g)
    print(f"modules: {len(g)}  edges: {sum(len(v) for v in g.values())}  cycles (SCCs > 1): {len(comps)}")
    for i, comp in enumerate(comps, 1):
        members = set(comp)
        print(f"\nSCC {i} ({len(comp)} modules): {', '.join(comp)}")
        for e in sorted(set(edges), key=lambda e: (e.src, e.dst, e.line)):
            if e.src in members and e.dst in members:
                print(f"  {e.src} -> {e.dst}   {e.file}:{e.line}  [{e.where}]")
    if all_edges_flag:
        print("\nALL EDGES")
        for e in sorted(set(edges), key=lambda e: (e.src, e.line, e.dst)):
            print(f"  {e.src} -> {e.dst}   {e.file}:{e.line}  [{e.where}]")
    return 1 if comps else 0


def _describe(comps: list[list[str]], edges: list[Edge]) -> str:
    lines = []
    for comp in comps:
        members = set(comp)
        lines.append(" <-> ".join(comp))
        lines += [
            f"    {e.src} -> {e.dst}  {e.file}:{e.line} [{e.where}]"
            for e in sorted(set(edges), key=lambda e: (e.src, e.dst, e.line))
            if e.src in members and e.dst in members
        ]
    return "\n".join(lines)


def test_no_import_cycles() -> None:
    """Runtime imports (top level and inside functions) form no cycle among fray, fray_ray and fray_monarch."""
    g, edges = graph(skip_type_checking=True)
    comps = sccs(g)
    assert not comps, "import cycles:\n" + _describe(comps, edges)


def check_no_import_cycles_including_type_checking() -> None:  # opt-in (not collected by pytest)
    g, edges = graph(skip_type_checking=False)
    comps = sccs(g)
    assert not comps, "import cycles (TYPE_CHECKING included):\n" + _describe(comps, edges)


if __name__ == "__main__":
    sys.exit(report("--no-type-checking" in sys.argv, "--all-edges" in sys.argv))
