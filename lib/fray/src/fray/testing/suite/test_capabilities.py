"""Every capability a backend lacks is refused with UnsupportedFeatureError naming it when used."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fray import ActorOptions, Capability, Lifetime, Resource, RuntimeEnv, TaskOptions, UnsupportedFeatureError
from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import workloads as h
from fray.testing.plugin import REFUSED, refusal_check


def test_capabilities_are_declared(fray_ctx: JobContext, fray_cluster: ClusterContext) -> None:
    assert all(isinstance(c, Capability) for c in fray_ctx.capabilities)
    assert all(isinstance(c, Capability) for c in fray_cluster.capabilities)


def _use(capability: Capability, ctx: JobContext, cluster: ClusterContext, tmp_path: Path) -> None:
    if capability is Capability.DETACHED_ACTORS:
        options = ActorOptions(name=f"d-{uuid.uuid4().hex[:6]}", lifetime=Lifetime.DETACHED)
        ctx.create_actor(h.Counter, options=options)
    elif capability is Capability.TASK_ENV_VARS:
        ctx.create_task(h.getenv, args=("X",), options=TaskOptions(runtime_env=RuntimeEnv(env={"X": "1"})))
    elif capability is Capability.TASK_PACKAGES:
        env = RuntimeEnv(package_requirements=["six"])
        ctx.create_task(h.getenv, args=("X",), options=TaskOptions(runtime_env=env))
    elif capability is Capability.JOB_PACKAGES:
        cluster.create_job("true", env=RuntimeEnv(package_requirements=["six"]))
    elif capability is Capability.JOB_RESOURCES:
        cluster.create_job("true", env=RuntimeEnv(minimum_resources=[Resource("CPU", 1)]))
    elif capability is Capability.PERSISTENT_JOBS:
        cluster.create_job("true", detached=True)
    elif capability is Capability.TASK_MAX_CALLS:
        ctx.create_task(h.add, args=(1, 1), options=TaskOptions(max_calls=1))
    elif capability is Capability.CANCEL_RUNNING:
        marker = str(tmp_path / "started")
        ref = ctx.create_task(h.spin, args=(marker, 5))  # (ends by itself where the cancel is refused)
        h.wait_for_file(marker, 60)
        try:
            ctx.cancel(ref)
        finally:
            ctx.get(ref, timeout=60)
    elif capability is Capability.SPMD_GANG_RESTART:
        ctx.create_actor_group(g.Member, 2, distributed=True, options=ActorOptions(max_restarts=1))
    elif capability is Capability.SPMD_GROUPS:
        ctx.create_actor_group(g.Member, 2, distributed=True)
    elif capability is Capability.STREAMING:
        ctx.create_task(g.count_up, args=(2,), options=TaskOptions(streaming=True))
    elif capability is Capability.ASYNC_ACTORS:
        ctx.create_actor(g.AsyncActor)
    else:
        raise AssertionError(f"no way to use {capability}")


def test_every_capability_with_an_api_has_a_use_here() -> None:
    """A new capability gets its branch in `_use` (else the test below could not check that it is refused)."""
    import inspect

    source = inspect.getsource(_use)
    missing = [c for c in Capability if c.has_api and f"Capability.{c.name}:" not in source]
    assert missing == [], f"_use has no branch for {missing}"


@refusal_check
def test_missing_capabilities_are_refused_by_name(
    fray_ctx: JobContext, fray_cluster: ClusterContext, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    have = fray_ctx.capabilities | fray_cluster.capabilities
    for capability in Capability:
        if not capability.has_api or capability in have:
            continue
        if capability is Capability.SPMD_GANG_RESTART and Capability.SPMD_GROUPS not in have:
            continue  # (it restarts SPMD groups: without them, spmd_groups is the one refused)
        with pytest.raises(UnsupportedFeatureError, match=capability.value) as info:
            _use(capability, fray_ctx, fray_cluster, tmp_path)
        assert info.value.capability is capability
        request.node.user_properties.append((REFUSED, capability.value))  # (the capabilities table's evidence)
