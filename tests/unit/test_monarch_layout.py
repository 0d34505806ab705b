"""The layout of fray_monarch (issue 32): subpackages by the process that runs them; the driver's modules import
nothing of the worker processes' (driver/ finds the actor classes it spawns by name: core/actor_classes.py).
Circles, module sizes and underscores are checked for every distribution by test_import_graph.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _import_graph import import_graph

SRC = Path(__file__).resolve().parents[2] / "backends/monarch/src"
PACKAGE = "fray_monarch"


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


def test_a_mesh_process_and_a_local_driver_load_no_monarch_job_module() -> None:
    """Monarch's job module loads its telemetry's web server and table libraries (flask, pyarrow, numpy): a
    quarter of a second of every process of a mesh, and of every driver on this machine, that none of them uses.
    Only job_launch.py imports it, when Monarch launches the hosts."""
    probe = (
        "import sys, fray_monarch, fray_monarch.workers.runtime, fray_monarch.driver.client;"
        "from fray_monarch.cluster import launchers, topology;"
        "launchers.launch({}, 1.0);"
        "print(sorted(m for m in sys.modules if m.startswith(('monarch._src.job', 'flask', 'pyarrow'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_mesh_process_loads_numpy_before_its_tasks() -> None:
    """A worker's threads race in a package's first import, and numpy's cannot be retried once it failed halfway
    (its C module loads once per process): a task whose arguments hold an array then failed to load them for
    good ("cannot load module more than once per process"). The worker's runtime loads numpy as it starts."""
    probe = "import sys, fray_monarch.workers.runtime; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
