"""The layout of fray-core (lib/fray): rooms by audience. `fray/` itself holds the user API; below it, from the
top: the jobs room (fray.jobs), what backends run on (fray.runtime), what happened (fray.telemetry) and the
machine (fray.host). A room imports only the rooms below it; none of them imports the API or the view
(fray.dashboard), and the view reads the model, never the API. `fray.errors` and `fray.types` are leaves every
room may import. The import paths of before the rooms still work for one release, with a warning. Circles,
module sizes and underscores are checked for every distribution by test_import_graph.py."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _import_graph import import_graph

SRC = Path(__file__).resolve().parents[2] / "lib/fray/src"
ROOMS = ["fray.host", "fray.telemetry", "fray.runtime", "fray.jobs"]  # lowest first
LEAVES = {"fray.errors", "fray.types", "fray._moved", "fray._lazy"}  # _moved: old paths; _lazy: the faces' loader
# The job supervisor is a program: a job run as an SPMD group is a group of the job's own backend, made through
# the API (`fray.init()`), in the supervisor's process only.
PROGRAMS_OVER_THE_API = {("fray.jobs.supervisor", "fray")}
API_MODULES = {
    "fray",
    "fray._lazy",
    "fray._moved",
    "fray.actor_pool",
    "fray.backend",
    "fray.bounded_map",
    "fray.cluster_context",
    "fray.context",
    "fray.errors",
    "fray.executor",
    "fray.executor_map",
    "fray.joblib",
    "fray.registry",
    "fray.types",
}
PACKAGES = {"cli", "dashboard", "host", "in_memory", "jobs", "kit", "runtime", "telemetry", "testing"}


def _room(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(f"{room}.")), None)


def test_fray_itself_holds_the_api_and_the_rooms() -> None:
    top = SRC / "fray"
    modules = {f"fray.{p.stem}" for p in top.glob("*.py")} - {"fray.__init__"} | {"fray"}
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").exists()}
    assert modules == API_MODULES
    assert packages == PACKAGES


def test_a_room_imports_only_the_rooms_below_it() -> None:
    graph = import_graph(SRC, "fray")
    crossing: dict[str, list[str]] = {}
    for module, targets in graph.items():
        room = _room(module)
        if room is None:
            continue
        allowed = set(ROOMS[: ROOMS.index(room) + 1])
        bad = [
            t
            for t in sorted(targets)
            if t not in LEAVES and _room(t) not in allowed and (module, t) not in PROGRAMS_OVER_THE_API
        ]
        if bad:
            crossing[module] = bad
    assert len([m for m in graph if _room(m)]) > 50
    assert crossing == {}


def test_the_view_reads_the_model_and_nothing_below_points_at_it() -> None:
    graph = import_graph(SRC, "fray")
    view = {m for m in graph if m == "fray.dashboard" or m.startswith("fray.dashboard.")}
    assert len(view) > 5
    the_view_reaches = {m: sorted(t for t in graph[m] if t in API_MODULES - LEAVES) for m in view}
    assert {m: ts for m, ts in the_view_reaches.items() if ts} == {}
    pointing_at_the_view = {m: sorted(t for t in graph[m] if t in view) for m in graph if _room(m)}
    assert {m: ts for m, ts in pointing_at_the_view.items() if ts} == {}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("fray.serialization", "fray.runtime.serialization"),
        ("fray.procfs", "fray.host.procfs"),
        ("fray.state", "fray.host.state_dir"),
        ("fray.job_supervisor", "fray.jobs.supervisor"),
        ("fray.device_shares.memory", "fray.runtime.device_shares.memory"),
    ],
)
def test_an_old_path_is_the_same_module_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__ is not None and module.__spec__.name == new
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_the_old_local_runner_names_are_forwarded_with_a_warning() -> None:
    import fray.jobs
    from fray.jobs.local import LocalJobs

    with pytest.warns(DeprecationWarning, match=r"fray\.jobs\.local\.LocalJobs"):
        assert fray.jobs.LocalJobs is LocalJobs
    with pytest.raises(AttributeError, match="no_such_name"):
        fray.jobs.no_such_name  # noqa: B018


def test_python_dash_m_with_an_old_path_runs_the_new_module() -> None:
    """A job recorded before the rooms (`fray job retry` reruns its command) names `-m fray.job_supervisor`."""
    done = subprocess.run(
        [sys.executable, "-m", "fray.job_supervisor", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--replicas" in done.stdout


BACKENDS = [
    (SRC.parents[2] / "backends/ray/src", "fray_ray"),
    (SRC.parents[2] / "backends/monarch/src", "fray_monarch"),
    (SRC, "fray.in_memory"),
]
FACES = ("fray", "fray.errors", "fray.backend")


@pytest.mark.parametrize(("src", "package"), BACKENDS, ids=[package for _, package in BACKENDS])
def test_a_backend_imports_fray_core_through_its_faces(src: Path, package: str) -> None:
    """ray, monarch and in_memory import fray-core from `fray`, `fray.errors` and `fray.backend` only (in_memory
    also from `fray.kit`, the face of the kit it is built on): what is behind the faces can move without touching
    a backend."""
    from _import_graph import fray_imports

    faces = (*FACES, "fray.kit") if package == "fray.in_memory" else FACES
    own = f"{package}."
    deeper = {
        importer: sorted(t for t in targets if t not in faces and not t.startswith(own))
        for importer, targets in fray_imports(src, package).items()
    }
    assert len(deeper) > 5
    assert {importer: ts for importer, ts in deeper.items() if ts} == {}


def test_no_backend_parses_its_spec_options() -> None:
    """fray-core converts a spec's options by the backend's declared `options` (fray.registry.backend_options)
    before any backend entry point sees them: a backend that called parse_options again would be a second home
    for what its options mean."""
    import ast

    sources = [path for src, package in BACKENDS for path in (src / package.replace(".", "/")).rglob("*.py")]
    sources += [*(SRC.parents[2] / "examples").glob("*.py"), SRC.parents[2] / "tests/_process_actors_backend.py"]
    calling = sorted(
        str(path.relative_to(SRC.parents[2]))
        for path in sources
        if any(
            (isinstance(node, ast.Name) and node.id == "parse_options")
            or (isinstance(node, ast.Attribute) and node.attr == "parse_options")
            or (isinstance(node, ast.alias) and node.name.endswith("parse_options"))
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert len(sources) > 50
    assert calling == []


def test_the_job_context_does_not_load_the_jobs_room() -> None:
    """fray.context (JobContext) imports neither fray.cluster_context nor fray.jobs: a job context's module has no
    use for the jobs subsystem. `fray.context.ClusterContext` still resolves for one release, with a warning."""
    graph = import_graph(SRC, "fray")
    assert sorted(t for t in graph["fray.context"] if t == "fray.cluster_context" or _room(t) == "fray.jobs") == []
    import fray.context
    from fray.cluster_context import ClusterContext

    with pytest.warns(DeprecationWarning, match=r"fray\.cluster_context\.ClusterContext"):
        assert fray.context.ClusterContext is ClusterContext


# Each face fray._lazy serves, and the fewest names its TYPE_CHECKING block lists (a parse that found none fails).
LAZY_FACES = {"fray": 21, "fray.backend": 21, "fray.testing": 1}


def _type_checking_names(module: str) -> dict[str, str]:
    """name -> the module it is imported from, in the face's `if TYPE_CHECKING:` block (a module imported whole:
    its own path)."""
    import ast

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    path = Path(spec.origin)
    names: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module is not None
                for alias in imported.names:
                    package = hasattr(importlib.import_module(imported.module), "__path__")
                    whole = f"{imported.module}.{alias.name}"
                    names[alias.name] = whole if package and importlib.util.find_spec(whole) else imported.module
    return names


@pytest.mark.parametrize("face", LAZY_FACES)
def test_a_face_loads_each_name_from_the_module_type_checkers_are_told(face: str) -> None:
    """`fray`, `fray.backend` and `fray.testing` import their names when first asked for (fray._lazy); the same names
    are imported under TYPE_CHECKING for type checkers. The two lists must agree, `dir()` shows them, and every name
    of `__all__` must resolve."""
    module = importlib.import_module(face)
    declared = _type_checking_names(face)
    assert len(declared) >= LAZY_FACES[face]
    assert sorted(set(declared) - set(dir(module))) == []
    for name, home in declared.items():
        value = getattr(module, name)
        expected = importlib.import_module(home)
        assert value is (expected if home.endswith(f".{name}") else getattr(expected, name)), name
    assert sorted(set(module.__all__) - set(vars(module)) - set(declared)) == []
    for name in module.__all__:
        getattr(module, name)


@pytest.mark.parametrize(
    ("program", "not_loaded"),
    [
        ("fray", ["fray.context", "fray.cluster_context", "fray.jobs.local", "fray.runtime.serialization"]),
        ("fray.host.watchdog", ["fray.context", "fray.jobs.local", "fray.runtime.serialization", "fray.runtime.gpus"]),
        ("fray.jobs.supervisor", ["fray.context", "fray.cluster_context", "fray.runtime.serialization"]),
        ("fray.jobs.run_call", ["fray.context", "fray.cluster_context", "fray.runtime.serialization"]),
        ("fray.backend", ["fray.context", "fray.cluster_context", "fray.jobs.local", "fray.runtime.serialization"]),
        ("fray.testing.workloads", ["pytest", "fray.testing.plugin"]),
        ("fray.testing.group_workloads", ["pytest", "fray.testing.plugin"]),
    ],
)
def test_a_process_running_one_room_does_not_load_the_others(program: str, not_loaded: list[str]) -> None:
    """The watchdog, a job's supervisor and a job rank's callable are processes of their own, started many times:
    importing any module of fray runs `fray/__init__`, which must not import the API's modules behind it. The
    suite's workloads are imported by every engine process that runs one of their functions: not pytest."""
    code = f"import sys, {program}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(done.stdout.split())
    assert program in loaded
    assert sorted(set(not_loaded) & loaded) == []


def test_a_process_that_imported_any_module_of_fray_makes_its_default_context() -> None:
    """A Ray worker unpickling a function that refers to a context imports only the modules it names; with no
    context there, fray.runtime.current makes the default one through the registry, which importing `fray`
    (run for any of its modules) must have installed, however lazily the rest of the face loads."""
    code = (
        "import fray.runtime.current as current\n"
        "ctx = current.get_job_context()\n"
        "print(ctx.backend, ctx.get(ctx.create_task(pow, args=(2, 5))))\n"
        "ctx.shutdown()"
    )
    env = {k: v for k, v in os.environ.items() if k != "FRAY_BACKEND"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["in_memory", "32"]
