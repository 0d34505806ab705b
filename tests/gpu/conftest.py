"""CUDA tests: they need a GPU, and are skipped, saying so, on a machine without one (CI's). Run them on the lent
GPU machine: `python3 -m pytest -p fray.testing.plugin tests/gpu` (../shared/gpu/README.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fray.context import JobContext
from fray.errors import BackendNotAvailableError
from fray.registry import get_backend


def _cuda() -> str | None:
    """Why CUDA tests cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False): run tests/gpu on a GPU machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _cuda()
    if why is None:
        return
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=why))


SPECS = {"in_memory": "in_memory", "ray": "ray?num_cpus=4", "monarch": "monarch?procs=2&cpus=4"}


@pytest.fixture(scope="module", params=sorted(SPECS))
def gpu_backend_ctx(request: pytest.FixtureRequest) -> Iterator[JobContext]:
    """A context of each installed backend on this machine's GPUs (found, not declared)."""
    if _cuda() is not None:
        pytest.skip(str(_cuda()))
    name = str(request.param)
    try:
        backend = get_backend(name)
    except BackendNotAvailableError as exc:
        pytest.skip(f"backend {name!r} is not installed: {exc}")
    from fray.registry import job_context_from, parse_spec

    ctx = job_context_from(backend, parse_spec(SPECS[name])[1])
    try:
        yield ctx
    finally:
        ctx.shutdown()
