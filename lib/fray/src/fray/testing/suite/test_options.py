"""Options are honoured or refused: infeasible resources, retries, env vars, detached actors."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from fray import ActorOptions, InfeasibleResourcesError, Lifetime, Resource, RuntimeEnv, TaskOptions
from fray.context import JobContext
from fray.testing import requires_capability
from fray.testing import workloads as h


def test_infeasible_task_is_refused_at_submission(fray_ctx: JobContext) -> None:
    start = time.monotonic()
    with pytest.raises(InfeasibleResourcesError, match="CPU"):
        fray_ctx.create_task(h.add, args=(1, 1), options=TaskOptions(resources={"CPU": 100_000}))
    with pytest.raises(InfeasibleResourcesError, match="no_such_resource"):
        fray_ctx.create_task(h.add, args=(1, 1), options=TaskOptions(resources={"no_such_resource": 1}))
    assert time.monotonic() - start < 10


def test_infeasible_actor_is_refused_at_creation(fray_ctx: JobContext) -> None:
    with pytest.raises(InfeasibleResourcesError):
        fray_ctx.create_actor(h.Counter, options=ActorOptions(resources={"CPU": 100_000}))


def test_resources_limit_concurrency(fray_ctx: JobContext) -> None:
    """A task may hold every CPU of the largest node; it still runs (feasible), just alone."""
    cpus = max(node.get("CPU", 0) for node in fray_ctx.node_resources())
    ref = fray_ctx.create_task(h.add, args=(1, 2), options=TaskOptions(resources={"CPU": cpus}))
    assert fray_ctx.get(ref, timeout=120) == 3


def test_retry_exceptions(fray_ctx: JobContext, tmp_path: Path) -> None:
    counter = str(tmp_path / "retry-count")
    options = TaskOptions(max_retries=3, retry_exceptions=True)
    assert fray_ctx.get(fray_ctx.create_task(h.fail_first, args=(counter, 2), options=options), timeout=120) == 3
    once = str(tmp_path / "no-retry-count")
    with pytest.raises(ValueError, match="planned failure 1"):
        fray_ctx.get(fray_ctx.create_task(h.fail_first, args=(once, 2), options=TaskOptions()), timeout=60)
    listed = str(tmp_path / "listed-count")
    options = TaskOptions(max_retries=3, retry_exceptions=[KeyError])
    with pytest.raises(ValueError):
        fray_ctx.get(fray_ctx.create_task(h.fail_first, args=(listed, 1), options=options), timeout=60)
    assert Path(listed).read_text() == "1"


@requires_capability("task_env_vars")
def test_runtime_env_vars_reach_the_task(fray_ctx: JobContext) -> None:
    value = f"v-{uuid.uuid4().hex[:6]}"
    options = TaskOptions(runtime_env=RuntimeEnv(env={"FRAY_CONFORMANCE_VAR": value}))
    assert (
        fray_ctx.get(fray_ctx.create_task(h.getenv, args=("FRAY_CONFORMANCE_VAR",), options=options), timeout=120)
        == value
    )
    assert os.environ.get("FRAY_CONFORMANCE_VAR") is None
    assert fray_ctx.get(fray_ctx.create_task(h.getenv, args=("FRAY_CONFORMANCE_VAR",)), timeout=60) is None


@requires_capability("detached_actors")
def test_detached_actor_is_found_by_name(fray_ctx: JobContext) -> None:
    name = f"detached-{uuid.uuid4().hex[:8]}"
    actor = fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name, lifetime=Lifetime.DETACHED))
    fray_ctx.get(actor.incr(3), timeout=60)
    assert fray_ctx.get(fray_ctx.get_actor(name).get(), timeout=60) == 3
    fray_ctx.kill(actor)


def test_runtime_env_resource_bounds_apply_to_tasks(fray_ctx: JobContext) -> None:
    """minimum_resources raises a task's request (so an impossible minimum is infeasible); a request above
    maximum_resources is refused at submission."""
    at_least = TaskOptions(runtime_env=RuntimeEnv(minimum_resources=[Resource("CPU", 100_000)]))
    with pytest.raises(InfeasibleResourcesError):
        fray_ctx.create_task(h.add, args=(1, 1), options=at_least)
    at_most = TaskOptions(resources={"CPU": 2}, runtime_env=RuntimeEnv(maximum_resources=[Resource("CPU", 1)]))
    with pytest.raises(ValueError, match="maximum"):
        fray_ctx.create_task(h.add, args=(1, 1), options=at_most)
    fits = TaskOptions(runtime_env=RuntimeEnv(minimum_resources=[Resource("CPU", 1)]))
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 1), options=fits), timeout=60) == 2


def test_option_validation() -> None:
    with pytest.raises(ValueError):
        ActorOptions(lifetime=Lifetime.DETACHED)  # a detached actor needs a name
    with pytest.raises(ValueError):
        ActorOptions(get_if_exists=True)
    with pytest.raises(ValueError):
        TaskOptions(resources={"CPU": -1})
    with pytest.raises(ValueError):
        ActorOptions(max_concurrency=0)


def test_memory_is_a_resource_on_every_backend(fray_ctx: JobContext) -> None:
    nodes = fray_ctx.node_resources()
    assert all(node.get("memory", 0) > 0 for node in nodes), nodes
    options = TaskOptions(resources={"CPU": 1, "memory": 1024})
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 2), options=options), timeout=60) == 3
    actor = fray_ctx.create_actor(h.Counter, options=ActorOptions(resources={"memory": 1024}))
    assert fray_ctx.get(actor.incr(), timeout=60) == 1
    too_much = max(node["memory"] for node in nodes) * 2
    with pytest.raises(InfeasibleResourcesError, match="memory"):
        fray_ctx.create_task(h.add, args=(1, 2), options=TaskOptions(resources={"CPU": 1, "memory": too_much}))
