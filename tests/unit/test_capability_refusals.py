"""The core refuses every capability a backend lacks, before any hook runs, and `fray.register_backend` makes a
backend of this process's own: here in_memory declaring none of its capabilities with an API (but
cancel_running, which only a hook can refuse: it knows whether the task runs), refused by the conformance
suite's own `_use` of each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fray
from fray import Capability, UnsupportedFeatureError
from fray.backend import Backend
from fray.in_memory import InMemoryBackend, InMemoryClusterContext, InMemoryJobContext
from fray.registry import available_backends, get_backend
from fray.testing.suite.test_capabilities import _use

KEPT = frozenset({Capability.CANCEL_RUNNING})


class BareJobContext(InMemoryJobContext):
    capabilities = KEPT


class BareButGroupsJobContext(InMemoryJobContext):
    capabilities = KEPT | {Capability.SPMD_GROUPS}  # (a gang restart is refused only where SPMD groups exist)


class BareClusterContext(InMemoryClusterContext):
    capabilities = frozenset()


class BareBackend(InMemoryBackend):
    name = "in_memory_bare"

    @property
    def capabilities(self) -> frozenset[Capability]:
        return KEPT

    def job_context(self, **options: str) -> InMemoryJobContext:
        ctx = super().job_context(**options)
        ctx.__class__ = BareJobContext  # (the same engine, declaring less)
        return ctx

    def cluster_context(self, **options: str) -> Any:
        cluster = super().cluster_context(**options)
        cluster.__class__ = BareClusterContext
        return cluster


@pytest.fixture(scope="module")
def bare() -> Iterator[tuple[fray.JobContext, fray.ClusterContext]]:
    fray.register_backend("in_memory_bare", BareBackend, replace=True)
    ctx, cluster = fray.init("in_memory_bare"), fray.cluster("in_memory_bare")
    yield ctx, cluster
    cluster.shutdown()
    ctx.shutdown()


@pytest.mark.parametrize("capability", [c for c in Capability if c.has_api and c not in KEPT], ids=str)
def test_each_missing_capability_is_refused_by_the_core(
    bare: tuple[fray.JobContext, fray.ClusterContext], capability: Capability, tmp_path: Path
) -> None:
    ctx, cluster = bare
    if capability is Capability.SPMD_GANG_RESTART:
        ctx.__class__ = BareButGroupsJobContext
    try:
        with pytest.raises(UnsupportedFeatureError, match=capability.value) as info:
            _use(capability, ctx, cluster, tmp_path)
    finally:
        ctx.__class__ = BareJobContext
    assert info.value.capability is capability


def test_a_registered_backend_is_known_and_its_name_guarded(bare: tuple[fray.JobContext, fray.ClusterContext]) -> None:
    assert isinstance(get_backend("in_memory_bare"), BareBackend)
    assert "registered in this process" in available_backends()["in_memory_bare"]
    with pytest.raises(ValueError, match="exists already"):
        fray.register_backend("in_memory", BareBackend)
    with pytest.raises(ValueError, match="letters, digits"):
        fray.register_backend("bad?name", BareBackend)
    with pytest.raises(TypeError, match="Backend subclass or instance"):
        fray.register_backend("not_a_backend", object)  # type: ignore[arg-type]
    assert isinstance(BareBackend(), Backend)
