"""Fixtures of the Ray backend's own tests (real Ray, no mocks). Skipped where fray-ray is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

import fray
from fray.registry import job_context_from, parse_spec
from fray_ray import RayBackend, RayJobContext

HERE = Path(__file__).parent
_kept: list[RayJobContext] = []  # the context of `ctx`, while the tests that follow one another ask for it


@pytest.fixture
def ctx() -> Iterator[RayJobContext]:
    """A private Ray context of the backend's test spec, current for the test. One serves a module's tests and
    the next module's too where that one's first test asks for it (a Ray start is seconds); it is shut down
    before a test of another module that does not, and at the end."""
    if not _kept:
        _kept.append(job_context_from(RayBackend(), parse_spec(RayBackend.test_spec)[1]))
    with fray.using(_kept[0]):
        yield _kept[0]


def _keeps_ctx(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    if nextitem is None or HERE not in nextitem.path.parents:
        return False
    return nextitem.path == item.path or "ctx" in getattr(nextitem, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # (after the test's own fixtures are torn down)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _kept and not _keeps_ctx(item, nextitem):
        _kept.pop().shutdown()
