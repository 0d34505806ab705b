"""The `fray` pytest plugin: a backend-parametrized fixture, as anyio's backend fixture.

Which backends run: `--fray-backend=a,b`, else FRAY_BACKEND, else every installed backend. A test module may pin
its own with a module attribute `fray_backends = ["name"]` (a backend it registers itself: `register_backend`).
Each backend gets one session-wide JobContext and ClusterContext built from its `test_spec` (`cluster_test_spec`)
attribute.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from fray.capabilities import Capability
from fray.context import ClusterContext, JobContext
from fray.current import using
from fray.errors import BackendNotAvailableError
from fray.registry import ENV_VAR, available_backends, get_backend, parse_spec

requires_capability = pytest.mark.fray_capability


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fray")
    group.addoption(
        "--fray-backend",
        default=None,
        help="comma-separated fray backends to run the conformance suite on (default: FRAY_BACKEND, else all "
        "installed backends)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fray_capability(name): needs this backend capability; skipped, naming it, where missing"
    )


def selected_backends(config: pytest.Config) -> list[str]:
    raw = config.getoption("--fray-backend", None) or os.environ.get(ENV_VAR)
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


@pytest.fixture(scope="session")
def fray_session_ctx(fray_backend_name: str) -> Iterator[JobContext]:
    ctx = get_backend(fray_backend_name).job_context(**spec_options(fray_backend_name, "test_spec"))
    yield ctx
    ctx.shutdown()


@pytest.fixture(scope="session")
def fray_session_cluster(fray_backend_name: str) -> Iterator[ClusterContext]:
    cluster = get_backend(fray_backend_name).cluster_context(**spec_options(fray_backend_name, "cluster_test_spec"))
    yield cluster
    cluster.shutdown()


def _skip_missing(request: pytest.FixtureRequest, have: frozenset[Capability], backend: str) -> None:
    for marker in request.node.iter_markers("fray_capability"):
        for cap in marker.args:
            capability = cap if isinstance(cap, Capability) else Capability(cap)
            if capability not in have:
                pytest.skip(f"backend {backend!r} lacks capability {capability.value!r}")


@pytest.fixture
def fray_own_ctx(fray_backend_name: str) -> Iterator[JobContext]:
    """A JobContext of the backend for this test alone (for tests that shut it down)."""
    ctx = get_backend(fray_backend_name).job_context(**spec_options(fray_backend_name, "test_spec"))
    try:
        yield ctx
    finally:
        ctx.shutdown()


@pytest.fixture
def fray_ctx(request: pytest.FixtureRequest, fray_session_ctx: JobContext) -> Iterator[JobContext]:
    """The backend's JobContext, current for this test."""
    _skip_missing(request, fray_session_ctx.capabilities, fray_session_ctx.backend)
    with using(fray_session_ctx):
        yield fray_session_ctx


@pytest.fixture
def fray_cluster(request: pytest.FixtureRequest, fray_session_cluster: ClusterContext) -> Iterator[ClusterContext]:
    """The backend's ClusterContext."""
    _skip_missing(request, fray_session_cluster.capabilities, fray_session_cluster.backend)
    yield fray_session_cluster


def pytest_report_header(config: pytest.Config) -> Any:
    return f"fray backends: {', '.join(selected_backends(config)) or 'none'}"
