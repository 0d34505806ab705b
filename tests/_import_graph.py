"""The import graph of a package, read from its source (every import: module level, under TYPE_CHECKING, and
inside functions), and the circles in it: issue 32 asks for none, type-only imports included. Also the imports
that break the rule for leading underscores (.agents/architecture.md, "Leading underscores")."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["fray_imports", "import_circles", "import_graph", "private_imports"]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, str | None, int]]:
    """Each import of the module `name` (at `path`): (the module it names, the name imported from it or None
    for the module itself, its line). `from pkg import module` imports the module."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate, None, node.lineno) if candidate in modules else (base, alias.name, node.lineno)


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (src: the directory that holds the package)."""
    modules = {_module_name(p, src): p for p in (src / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {target for target, _, _ in _imports(name, path, modules)}
        graph[name] = {_owner(t, modules) for t in targets if _owner(t, modules)} - {name}
    return graph


def fray_imports(src: Path, package: str) -> dict[str, set[str]]:
    """module of `package` (dotted: "fray.in_memory" is src/fray/in_memory) -> the fray-core modules it imports, as
    written (`from fray.backend import current` imports fray.backend; `from fray import errors`, fray.errors)."""
    core_src = Path(__file__).resolve().parents[1] / "lib/fray/src"
    core = {_module_name(p, core_src): p for p in (core_src / "fray").rglob("*.py")}
    found: dict[str, set[str]] = {}
    for path in (src / package.replace(".", "/")).rglob("*.py"):
        name = _module_name(path, src)
        targets = {t for t, _, _ in _imports(name, path, core) if t == "fray" or t.startswith("fray.")}
        found[name] = {_owner(t, core) or t for t in targets}
    return found


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(src: Path, package: str, others: Sequence[tuple[Path, str]] = ()) -> list[str]:
    """The imports in `package` that break the rule for leading underscores, as "importer:line: what": a module
    whose name starts with `_` imported from outside its package (subpackages are inside it), or a `_name`
    imported from another module. Imports of the packages in `others` ((src, package) pairs) are checked too;
    other imports (the standard library's, an engine's) are not."""
    modules = {_module_name(p, src): p for p in (src / package).rglob("*.py")}
    known = dict(modules)
    for other_src, other in others:
        known.update({_module_name(p, other_src): p for p in (other_src / other).rglob("*.py")})
    found: list[str] = []
    for name, path in sorted(modules.items()):
        home = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, imported, line in _imports(name, path, known):
            owner = _owner(target, known)
            if not owner or owner == name:
                continue
            parts = owner.split(".")
            for i, part in enumerate(parts):
                parent = ".".join(parts[:i])
                if _private(part) and not (home == parent or home.startswith(f"{parent}.")):
                    found.append(f"{name}:{line}: the module {'.'.join(parts[: i + 1])} of another package")
                    break
            if imported is not None and _private(imported):
                found.append(f"{name}:{line}: the name {imported} of {owner}")
    return found


def _owner(target: str, modules: dict[str, Path]) -> str:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def import_circles(src: Path, package: str, ignore_packages: bool = True) -> list[list[str]]:
    """The strongly connected components (more than one module) of the package's import graph. ignore_packages:
    leave out a package's `__init__` (which re-exports its modules: a circle through it is a name, not a
    dependency)."""
    graph = import_graph(src, package)
    if ignore_packages:
        inits = {_module_name(p, src) for p in (src / package).rglob("__init__.py")}
        graph = {m: {t for t in ts if t not in inits} for m, ts in graph.items() if m not in inits}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles
