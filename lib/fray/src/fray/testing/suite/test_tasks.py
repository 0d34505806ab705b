"""Tasks: results, ordering, arguments, serialization, concurrency, nesting."""

from __future__ import annotations

import threading
import time

import pytest

from fray import GetTimeoutError, SerializationError, TaskOptions
from fray.context import JobContext
from fray.testing import requires_capability
from fray.testing import workloads as h


def test_task_result(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 2)), timeout=60) == 3


def test_task_kwargs(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1,), kwargs={"b": 5}), timeout=60) == 6


def test_get_list_keeps_order(fray_ctx: JobContext) -> None:
    refs = [fray_ctx.create_task(h.sleep_then, args=(0.05 * (9 - i), i)) for i in range(10)]
    assert fray_ctx.get(refs, timeout=60) == list(range(10))


def test_ref_can_be_read_again(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.identity, args=({"a": [1, 2]},))
    assert fray_ctx.get(ref, timeout=60) == {"a": [1, 2]}
    assert fray_ctx.get(ref, timeout=60) == {"a": [1, 2]}


def test_get_timeout_raises_after_about_timeout(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.sleep_then, args=(5, "late"))
    start = time.monotonic()
    with pytest.raises(GetTimeoutError) as info:
        fray_ctx.get(ref, timeout=0.5)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert 0.4 <= elapsed < 4.5, elapsed  # the timeout, not the task's 5 s
    with pytest.raises(GetTimeoutError):
        fray_ctx.get([ref], timeout=0)


def test_get_of_empty_list(fray_ctx: JobContext) -> None:
    assert fray_ctx.get([]) == []


def test_locally_defined_function_and_closure(fray_ctx: JobContext) -> None:
    offset = 100

    def local_fn(x: int) -> int:
        return x + offset

    assert fray_ctx.get(fray_ctx.create_task(local_fn, args=(1,)), timeout=60) == 101
    assert fray_ctx.get(fray_ctx.create_task(lambda: "lambda ran"), timeout=60) == "lambda ran"


def test_100_concurrent_tasks(fray_ctx: JobContext) -> None:
    refs = [fray_ctx.create_task(h.add, args=(i, i)) for i in range(100)]
    assert fray_ctx.get(refs, timeout=120) == [2 * i for i in range(100)]


def test_top_level_ref_arrives_as_value_nested_ref_as_ref(fray_ctx: JobContext) -> None:
    upstream = fray_ctx.create_task(h.add, args=(20, 22))
    assert fray_ctx.get(fray_ctx.create_task(h.identity, args=(upstream,)), timeout=60) == 42
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1,), kwargs={"b": upstream}), timeout=60) == 43
    is_ref, value = fray_ctx.get(fray_ctx.create_task(h.first_is_ref_then_value, args=([upstream],)), timeout=60)
    assert is_ref is True
    assert value == 42


def test_failed_dependency_fails_the_dependent_task(fray_ctx: JobContext) -> None:
    bad = fray_ctx.create_task(h.raise_value_error, args=("upstream broke",))
    dependent = fray_ctx.create_task(h.identity, args=(bad,))
    with pytest.raises(ValueError, match="upstream broke"):
        fray_ctx.get(dependent, timeout=60)


def test_unserializable_argument_is_refused_at_submission_naming_it(fray_ctx: JobContext) -> None:
    with pytest.raises(SerializationError, match="argument 1"):
        fray_ctx.create_task(h.add, args=(1, threading.Lock()))
    with pytest.raises(SerializationError, match="'b'"):
        fray_ctx.create_task(h.add, args=(1,), kwargs={"b": threading.Lock()})


def test_function_closing_over_unserializable_state_is_refused(fray_ctx: JobContext) -> None:
    lock = threading.Lock()

    def uses_lock() -> bool:
        with lock:
            return True

    class UsesLock:
        def locked(self) -> bool:
            with lock:
                return True

    hint = "uses_lock cannot be serialized to run remotely: .* It probably captures an unpicklable object"
    with pytest.raises(SerializationError, match=hint):
        fray_ctx.get(fray_ctx.create_task(uses_lock), timeout=60)
    hint = "UsesLock cannot be serialized to run remotely: .* It probably captures an unpicklable object"
    with pytest.raises(SerializationError, match=hint):
        fray_ctx.get(fray_ctx.create_actor(UsesLock).locked(), timeout=60)


def test_bad_input_is_a_clear_error(fray_ctx: JobContext) -> None:
    with pytest.raises(TypeError, match="callable"):
        fray_ctx.create_task(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="args"):
        fray_ctx.create_task(h.identity, args=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TaskOptions"):
        fray_ctx.create_task(h.identity, args=(1,), options={"resources": {}})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        fray_ctx.get(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 1)), timeout=-1)


def test_task_options_are_accepted(fray_ctx: JobContext) -> None:
    options = TaskOptions(resources={"CPU": 1}, name="named-task", max_retries=0)
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(2, 2), options=options), timeout=60) == 4


@requires_capability("task_max_calls", "process_isolation")
def test_max_calls_replaces_the_worker_process(fray_ctx: JobContext) -> None:
    options = TaskOptions(max_calls=1)
    first = fray_ctx.get(fray_ctx.create_task(h.pid_of_worker, options=options), timeout=120)
    second = fray_ctx.get(fray_ctx.create_task(h.pid_of_worker, options=options), timeout=120)
    assert first != second, "a worker process ran a second call of a max_calls=1 function"


@requires_capability("task_max_calls")
def test_max_calls_tasks_run_and_return(fray_ctx: JobContext) -> None:
    """Accepted where declared, with or without worker processes (in_memory has none to replace)."""
    refs = [fray_ctx.create_task(h.add, args=(i, 1), options=TaskOptions(max_calls=1)) for i in range(3)]
    assert fray_ctx.get(refs, timeout=120) == [1, 2, 3]


def test_nested_submission_10_deep(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.nested_depth, args=(10,)), timeout=240) == 10


def test_nested_fan_out_from_a_task(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.fan_out, args=(8,)), timeout=120) == list(range(8))


def test_task_runs_with_the_same_backend(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.backend_name), timeout=60) == fray_ctx.backend


def test_a_context_passed_to_a_task_arrives_as_the_context_there(fray_ctx: JobContext) -> None:
    assert fray_ctx.get(fray_ctx.create_task(h.use_passed_context, args=(fray_ctx,)), timeout=120) == 42


def test_shutdown_inside_a_task_or_actor_leaves_the_context_working(fray_ctx: JobContext) -> None:
    """A task or actor sees its driver's context; shutting it down from there does nothing (it is not theirs)."""
    assert fray_ctx.get(fray_ctx.create_task(h.shutdown_inside), timeout=60) == "still here"
    actor = fray_ctx.create_actor(h.ShutsDown)
    assert fray_ctx.get([actor.call(), actor.call()], timeout=60) == ["still here"] * 2  # the same process, twice
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 2)), timeout=60) == 3
    fray_ctx.kill(actor)
