"""The `fray` pytest plugin: a backend-parametrized fixture, as anyio's backend fixture.

Which backends run: `--fray-backend=a,b`, else FRAY_BACKEND, else every installed backend. A test module may pin
its own with a module attribute `fray_backends = ["name"]` (a backend it registers itself: `register_backend`).
Each backend gets one session-wide JobContext and ClusterContext built from its `test_spec` (`cluster_test_spec`)
attribute, started by the first test that asks for it and shut down after the last one that does: an engine's
context costs CPU while it waits, and the suite's job and cluster cases come last.

It also records what the run showed of each backend's capabilities (`fray.testing.capability_table`): written as JSON
with
`--fray-capability-results=FILE`, and compared with a documented capability table when the ini option
`fray_capabilities_doc` names a markdown file (a disagreement fails the run, naming the cell).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.errors import BackendNotAvailableError
from fray.host import settings
from fray.registry import available_backends, cluster_context_from, get_backend, job_context_from, parse_spec
from fray.runtime.capabilities import Capability
from fray.runtime.current import using
from fray.testing.capability_table import CapabilityResults, disagreements, documented_table
from fray.testing.failure_events import events_during
from fray.testing.wheels import probe_wheel

requires_capability: pytest.MarkDecorator = pytest.mark.fray_capability
# A case that checks every capability the backend lacks is refused; it names each one it saw refused in its
# report's user_properties as ("fray_refused", value).
refusal_check = pytest.mark.fray_refusals
REFUSED = "fray_refused"
_LACKING = pytest.StashKey[Capability]()
_RESULTS = pytest.StashKey[CapabilityResults]()
_PROBLEMS = pytest.StashKey[list[str]]()
_CTX_SINCE = pytest.StashKey[tuple[JobContext, int]]()  # a test's context, and when the test began using it
SESSION_CONTEXTS = ("fray_session_ctx", "fray_session_cluster")
_Use = tuple[str, str]  # a session context's fixture name and its backend
_LAST_USES = pytest.StashKey[dict[str, list[_Use]]]()  # a test's nodeid -> the session contexts no later test uses
_OPEN = pytest.StashKey[dict[_Use, Callable[[], None]]]()  # each session context started: its (idempotent) shutdown


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fray")
    group.addoption(
        "--fray-backend",
        default=None,
        help="comma-separated fray backends to run the conformance suite on (default: FRAY_BACKEND, else all "
        "installed backends)",
    )
    group.addoption(
        "--fray-capability-results",
        default=None,
        metavar="FILE",
        help="write what this run showed of each backend's capabilities to FILE (JSON; `fray capabilities "
        "--results FILE` makes the table from it)",
    )
    parser.addini(
        "fray_capabilities_doc",
        "a markdown file whose capabilities table must agree with what the conformance suite shows (cells this run "
        "touched); relative to the rootdir",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fray_capability(name): needs this backend capability; skipped, naming it, where missing"
    )
    config.addinivalue_line("markers", "fray_refusals: checks that each capability a backend lacks is refused")
    config.stash[_RESULTS] = CapabilityResults()
    config.stash[_LAST_USES] = {}
    config.stash[_OPEN] = {}


def selected_backends(config: pytest.Config) -> list[str]:
    raw = config.getoption("--fray-backend", None) or settings.BACKEND.raw()
    if raw:
        return [parse_spec(name)[0] for name in raw.split(",") if name.strip()]
    installed = []
    for name in sorted(available_backends(registered=False)):
        try:
            get_backend(name)
        except BackendNotAvailableError:
            continue
        installed.append(name)
    return installed


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fray_backend_name" in metafunc.fixturenames:
        pinned = getattr(metafunc.module, "fray_backends", None)
        names = list(pinned) if pinned is not None else selected_backends(metafunc.config)
        metafunc.parametrize("fray_backend_name", names, scope="session")


def spec_options(name: str, attr: str) -> dict[str, str]:
    """The options of backend `name`'s test spec (attr "test_spec") or cluster test spec ("cluster_test_spec")."""
    backend = get_backend(name)
    spec = (backend.cluster_test_spec if attr == "cluster_test_spec" else None) or backend.test_spec or name
    return parse_spec(spec)[1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note the last test that uses each backend's session contexts. Not under xdist: a worker runs its own share
    of the tests in its own order, so it keeps its contexts to the end of its session."""
    last: dict[_Use, pytest.Item] = {}
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("fray_backend_name") if callspec is not None else None
        for name in SESSION_CONTEXTS:
            if backend is not None and name in getattr(item, "fixturenames", ()):
                last[(name, str(backend))] = item
    uses: dict[str, list[_Use]] = {}
    for use, item in last.items():
        if not _held_by_a_wider_fixture(item, use[0]):
            uses.setdefault(item.nodeid, []).append(use)
    session.config.stash[_LAST_USES] = {} if hasattr(session.config, "workerinput") else uses


def _held_by_a_wider_fixture(item: pytest.Item, name: str) -> bool:
    """Does a fixture of this test with a scope wider than the function's (torn down after later tests, perhaps)
    use session context `name`, directly or through another fixture? Where pytest does not say, assume so."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None)
    if not isinstance(defs, dict):
        return True

    def uses(fixture: str, seen: set[str]) -> bool:
        if fixture == name:
            return True
        if fixture in seen or not defs.get(fixture):
            return False
        seen.add(fixture)
        return any(uses(arg, seen) for arg in getattr(defs[fixture][-1], "argnames", ()))

    wider = [f for f, d in defs.items() if f not in SESSION_CONTEXTS and d and d[-1].scope != "function"]
    return any(uses(fixture, set()) for fixture in wider)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses a session context (its own fixtures are torn down by now), shut it down."""
    opened = item.config.stash[_OPEN]
    for use in item.config.stash[_LAST_USES].get(item.nodeid, ()):
        shutdown = opened.pop(use, None)
        if shutdown is not None:
            shutdown()


@pytest.fixture(scope="session")
def fray_session_ctx(request: pytest.FixtureRequest, fray_backend_name: str) -> Iterator[JobContext]:
    ctx = job_context_from(get_backend(fray_backend_name), spec_options(fray_backend_name, "test_spec"))
    request.config.stash[_OPEN][("fray_session_ctx", fray_backend_name)] = ctx.shutdown
    yield ctx
    ctx.shutdown()  # (idempotent: a no-op where its last test's teardown shut it down)


@pytest.fixture(scope="session")
def fray_session_cluster(request: pytest.FixtureRequest, fray_backend_name: str) -> Iterator[ClusterContext]:
    backend = get_backend(fray_backend_name)
    cluster = cluster_context_from(backend, spec_options(fray_backend_name, "cluster_test_spec"))
    request.config.stash[_OPEN][("fray_session_cluster", fray_backend_name)] = cluster.shutdown
    yield cluster
    cluster.shutdown()  # (idempotent, as above)


def _skip_missing(request: pytest.FixtureRequest, have: frozenset[Capability], backend: str) -> None:
    for marker in request.node.iter_markers("fray_capability"):
        for cap in marker.args:
            capability = cap if isinstance(cap, Capability) else Capability(cap)
            if capability not in have:
                request.node.stash[_LACKING] = capability
                pytest.skip(f"backend {backend!r} lacks capability {capability.value!r}")


@pytest.fixture(scope="session")
def probe_ok_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel for the session's jobs that install a package: an engine that keeps environments (Ray's
    virtualenv for a requirement list) builds it once."""
    return probe_wheel(tmp_path_factory.mktemp("wheels"), "probe-ok")


@pytest.fixture
def fray_own_ctx(fray_backend_name: str) -> Iterator[JobContext]:
    """A JobContext of the backend for this test alone (for tests that shut it down)."""
    ctx = job_context_from(get_backend(fray_backend_name), spec_options(fray_backend_name, "test_spec"))
    try:
        yield ctx
    finally:
        ctx.shutdown()


@pytest.fixture
def fray_ctx(request: pytest.FixtureRequest, fray_session_ctx: JobContext) -> Iterator[JobContext]:
    """The backend's JobContext, current for this test."""
    _skip_missing(request, fray_session_ctx.capabilities, fray_session_ctx.backend)
    request.node.stash[_CTX_SINCE] = (fray_session_ctx, time.time_ns())
    with using(fray_session_ctx):
        yield fray_session_ctx


@pytest.fixture
def fray_cluster(request: pytest.FixtureRequest, fray_session_cluster: ClusterContext) -> Iterator[ClusterContext]:
    """The backend's ClusterContext."""
    _skip_missing(request, fray_session_cluster.capabilities, fray_session_cluster.backend)
    yield fray_session_cluster


def pytest_report_header(config: pytest.Config) -> Any:
    return f"fray backends: {', '.join(selected_backends(config)) or 'none'}"


def _case_id(function: Any) -> str:
    return f"{function.__module__}::{function.__name__}"


def suite_capability_cases() -> frozenset[str]:
    """The conformance suite's cases that show a capability ("module::function"): marked with one, or the refusal
    check."""
    import importlib
    import pkgutil

    import fray.testing.suite as suite

    cases = set()
    for info in pkgutil.iter_modules(suite.__path__):
        module = importlib.import_module(f"{suite.__name__}.{info.name}")
        for name, value in vars(module).items():
            marks = getattr(value, "pytestmark", ()) if name.startswith("test_") else ()
            if getattr(value, "__module__", None) == module.__name__ and any(
                m.name in ("fray_capability", "fray_refusals") for m in marks
            ):
                cases.add(_case_id(value))
    return frozenset(cases)


def _capabilities_of(item: pytest.Item) -> list[Capability]:
    return [
        cap if isinstance(cap, Capability) else Capability(cap)
        for marker in item.iter_markers("fray_capability")
        for cap in marker.args
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.failed and _CTX_SINCE in item.stash:
        report.sections.append(("fray events during this test", events_during(*item.stash[_CTX_SINCE])))
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("fray_backend_name") if callspec is not None else None
    refusals = item.get_closest_marker("fray_refusals") is not None
    capabilities = _capabilities_of(item)
    if backend is None or not (capabilities or refusals):
        return
    results = item.config.stash[_RESULTS]
    function = getattr(item, "function", None)
    if function is not None and (report.when == "call" or report.skipped or report.failed):
        results.mark_ran(backend, _case_id(function))
    if report.failed:
        results.record(backend, report.nodeid, "failed", capabilities)
    elif report.skipped and report.when == "setup" and _LACKING in item.stash:
        results.record(backend, report.nodeid, "lacking", [item.stash[_LACKING]])
    elif report.passed and report.when == "call":
        results.record(backend, report.nodeid, "passed", capabilities)
        refused = [Capability(value) for key, value in report.user_properties if key == REFUSED]
        for capability in refused:
            results.record(backend, report.nodeid, "refused", [capability])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    results = config.stash.get(_RESULTS, None)
    if results is None or not results.backends():
        return
    results.expected = suite_capability_cases()
    target = config.getoption("--fray-capability-results", None)
    if target:
        results.write(Path(target))
    doc = config.getini("fray_capabilities_doc")
    if not doc:
        return
    path = Path(doc) if Path(doc).is_absolute() else config.rootpath / doc
    declared = {}
    for name in results.backends():
        try:
            declared[name] = get_backend(name).capabilities
        except BackendNotAvailableError:  # (one a test registered and dropped: not a column of the docs anyway)
            continue
    problems = disagreements(documented_table(path.read_text()), results, declared)
    if problems:
        config.stash[_PROBLEMS] = [f"{path}: {p}" for p in problems]
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    problems = config.stash.get(_PROBLEMS, None)
    if problems:
        terminalreporter.section("fray capabilities table disagrees with the conformance suite", red=True)
        for problem in problems:
            terminalreporter.line(problem, red=True)
        terminalreporter.line(
            "regenerate it: pytest tests/test_conformance.py -m 'fray_capability or fray_refusals' "
            "--fray-capability-results=FILE, then `fray capabilities --results FILE`, and paste the table"
        )
