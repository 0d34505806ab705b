"""Errors keep their original type, message and remote traceback."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from fray.context import JobContext
from fray.errors import FrayError, InfeasibleResourcesError, SerializationError
from fray.testing import workloads as h
from fray.types import TaskOptions


def test_task_exception_keeps_type_message_and_traceback(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.raise_value_error, args=("boom 42",))
    with pytest.raises(ValueError, match="boom 42") as info:
        fray_ctx.get(ref, timeout=60)
    assert type(info.value) is ValueError or isinstance(info.value, ValueError)
    assert "raise_value_error" in getattr(info.value, "remote_traceback", "")
    with pytest.raises(ValueError, match="boom 42"):  # a failed ref can be read again
        fray_ctx.get(ref, timeout=60)


def test_user_defined_exception_type_survives(fray_ctx: JobContext) -> None:
    with pytest.raises(h.CustomError, match="custom 7"):
        fray_ctx.get(fray_ctx.create_task(h.raise_custom, args=("custom 7",)), timeout=60)


def test_exception_in_list_get(fray_ctx: JobContext) -> None:
    refs = [fray_ctx.create_task(h.add, args=(1, 1)), fray_ctx.create_task(h.raise_value_error, args=("second",))]
    with pytest.raises(ValueError, match="second"):
        fray_ctx.get(refs, timeout=60)


def test_actor_method_exception_keeps_type_and_actor_survives(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter)
    assert fray_ctx.get(counter.incr(), timeout=60) == 1
    with pytest.raises(ValueError, match="method failed") as info:
        fray_ctx.get(counter.fail("method failed"), timeout=60)
    assert "fail" in getattr(info.value, "remote_traceback", "")
    with pytest.raises(h.CustomError):
        fray_ctx.get(counter.fail_custom("x"), timeout=60)
    assert fray_ctx.get(counter.incr(), timeout=60) == 2


def test_a_value_that_cannot_be_unpickled_where_it_lands_is_a_serialization_error(fray_ctx: JobContext) -> None:
    with pytest.raises(SerializationError, match="deserializ") as info:
        fray_ctx.get(fray_ctx.create_task(h.make_unloadable), timeout=60)
    assert "kaboom" in str(info.value)
    actor = fray_ctx.create_actor(h.Store)
    with pytest.raises(SerializationError, match="deserializ"):
        fray_ctx.get(actor.set(h.BreaksOnLoad()), timeout=60)


def test_a_shut_down_context_refuses_every_call(fray_own_ctx: JobContext) -> None:
    ctx = fray_own_ctx
    ref = ctx.create_task(h.add, args=(1, 2))
    assert ctx.get(ref, timeout=60) == 3
    actor = ctx.create_actor(h.Counter)
    ctx.shutdown()
    ctx.shutdown()  # idempotent
    calls: dict[str, Callable[[], object]] = {
        "create_task": lambda: ctx.create_task(h.add, args=(1, 2)),
        "create_actor": lambda: ctx.create_actor(h.Counter),
        "an actor call": lambda: actor.incr(),
        "get": lambda: ctx.get(ref, timeout=5),
        "wait": lambda: ctx.wait([ref], timeout=0),
        "put": lambda: ctx.put(1),
        "get_actor": lambda: ctx.get_actor("nobody"),
        "kill": lambda: ctx.kill(actor),
        "cancel": lambda: ctx.cancel(ref),
    }
    for name, call in calls.items():
        start = time.monotonic()
        with pytest.raises(FrayError, match="shut down"):
            call()
        assert time.monotonic() - start < 5.0, f"{name} took too long to refuse"


def test_get_and_wait_of_a_list_name_the_item_that_is_not_a_ref(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.add, args=(1, 2))
    with pytest.raises(ValueError, match=r"item 1 of the list is int \(7\), not an ObjectRef"):
        fray_ctx.get([ref, 7], timeout=60)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"item 0 of the list is str \('x'\), not an ObjectRef"):
        fray_ctx.wait(["x", ref], timeout=60)  # type: ignore[list-item]
    assert fray_ctx.get(ref, timeout=60) == 3


def test_rays_remote_habit_on_an_actor_method_says_how_fray_calls_it(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(h.Counter)
    with pytest.raises(AttributeError, match=r"did you mean handle\.incr\(\.\.\.\)\? `\.remote\(\.\.\.\)` is Ray's"):
        actor.incr.remote()
    assert fray_ctx.get(actor.incr(), timeout=60) == 1


def test_an_infeasible_request_shows_memory_in_units(fray_ctx: JobContext) -> None:
    with pytest.raises(InfeasibleResourcesError) as info:
        fray_ctx.create_task(h.add, args=(1, 2), options=TaskOptions(resources={"memory": 2**50}))
    message = str(info.value)
    assert "memory: 1024.0 TiB" in message or "memory: 1.0 PiB" in message, message
    assert "e+" not in message and re.search(r"largest node: \{.*memory: \d+\.\d [KMGT]iB", message), message
