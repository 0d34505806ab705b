"""Fixtures of the Ray backend's own tests (real Ray, no mocks). Skipped where fray-ray is not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fray_ray")

import fray
from fray.registry import parse_spec
from fray_ray import RayBackend, RayJobContext


@pytest.fixture(scope="module")
def ctx() -> Iterator[RayJobContext]:
    """A private Ray context of the backend's test spec, current for the module's tests."""
    context = RayBackend().job_context(**parse_spec(RayBackend.test_spec)[1])
    with fray.using(context):
        yield context
    context.shutdown()
