"""ctx.executor(): the standard library's executor contract, on every backend.

The cases are CPython's Lib/test/test_concurrent_futures (executor.py, test_shutdown.py, test_wait.py,
test_as_completed.py) that are about an executor as such, rewritten for pytest, each named after its CPython case
(`test_executor_<case>`); `threading.Event`s became files, since a task may run in another process. The cases
left out, and why, are listed in docs/executors.md ("What the standard library's tests cover").
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest

from fray.context import JobContext
from fray.testing import executor_workloads as w
from fray.testing import group_workloads as g
from fray.testing import workloads as h

TIMEOUT = 120.0


# ----------------------------------------------------------------- ExecutorTest (executor.py)
def test_executor_submit(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        future = executor.submit(pow, 2, 8)
        assert isinstance(future, futures.Future)
        assert future.result(TIMEOUT) == 256


def test_executor_submit_keyword(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        assert executor.submit(w.mul, 2, y=8).result(TIMEOUT) == 16
        assert executor.submit(w.capture, 1, self=2, fn=3).result(TIMEOUT) == ((1,), {"self": 2, "fn": 3})
        with pytest.raises(TypeError):
            executor.submit(fn=w.capture, arg=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            executor.submit(arg=1)  # type: ignore[call-arg]


def test_executor_map(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        expected = list(map(pow, range(10), range(10)))
        assert list(executor.map(pow, range(10), range(10), timeout=TIMEOUT)) == expected
        assert list(executor.map(pow, range(10), range(10), chunksize=3, timeout=TIMEOUT)) == expected


def test_executor_map_exception(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        results = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5], timeout=TIMEOUT)
        assert next(results) == (0, 1)
        assert next(results) == (0, 1)
        with pytest.raises(ZeroDivisionError):
            next(results)


def test_executor_map_gives_every_value_before_a_failed_item_among_many(fray_ctx: JobContext) -> None:
    """(Values are read many items at a time where they are ready: a failure among them still comes in order.)"""
    divisors = [1] * 150 + [0] + [1] * 49
    with fray_ctx.executor() as executor:
        results = executor.map(divmod, range(200), divisors, timeout=TIMEOUT)
        assert [next(results) for _ in range(150)] == [(i, 0) for i in range(150)]
        with pytest.raises(ZeroDivisionError):
            next(results)


def test_executor_map_exception_in_a_chunk_after_its_earlier_items(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        results = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5], chunksize=4, timeout=TIMEOUT)
        assert [next(results), next(results)] == [(0, 1), (0, 1)]  # the chunk's items before the failed one
        with pytest.raises(ZeroDivisionError):
            next(results)


def test_executor_map_timeout(fray_ctx: JobContext, tmp_path: Path) -> None:
    # CPython's third item sleeps 8 s; here it waits for a gate opened once the timeout was seen, so that leaving
    # the executor (which waits for its work) does not wait out those 8 s too.
    ready, gate = tmp_path / "ready", tmp_path / "gate"
    ready.touch()
    with fray_ctx.executor() as executor:
        executor.submit(int).result(TIMEOUT)  # warm: the timeout below is about the wait, not a cold start
        results = []
        try:
            with pytest.raises(futures.TimeoutError):
                for value in executor.map(g.wait_then, [str(ready), str(ready), str(gate)], [0, 1, 2], timeout=3):
                    results.append(value)
        finally:
            gate.touch()
        assert results == [0, 1]
        executor.shutdown(wait=False)


def test_executor_map_buffersize_reads_lazily(fray_ctx: JobContext) -> None:
    read = []

    def items() -> Iterator[int]:
        for i in range(100):
            read.append(i)
            yield i

    with fray_ctx.executor() as executor:
        results = executor.map(abs, items(), buffersize=3, timeout=TIMEOUT)
        assert len(read) == 3  # Python 3.14's buffersize: only that many submitted ahead
        assert [next(results) for _ in range(5)] == [0, 1, 2, 3, 4]
        assert len(read) <= 8
        with pytest.raises(ValueError, match="buffersize"):
            executor.map(abs, [1], buffersize=0)
        with pytest.raises(ValueError, match="chunksize"):
            executor.map(abs, [1], chunksize=0)


def test_executor_map_items_still_queued_are_cancelled_by_shutdown(fray_ctx: JobContext) -> None:
    """As a ThreadPoolExecutor's: the item on the backend finishes, the queued ones raise CancelledError."""
    executor = fray_ctx.executor(max_workers=1)
    results = executor.map(time.sleep, [0.5] + [0] * 20, timeout=TIMEOUT)
    executor.shutdown(wait=False, cancel_futures=True)
    assert next(results) is None
    with pytest.raises(futures.CancelledError):
        next(results)


def test_executor_shutdown_race_issue12456(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor(max_workers=2)
    executor.map(str, [2] * 3)
    executor.shutdown()


def test_executor_no_stale_references(fray_ctx: JobContext) -> None:
    my_object = w.MyObject()
    collected = threading.Event()
    my_object_callback = weakref.ref(my_object, lambda _: collected.set())  # noqa: F841
    with fray_ctx.executor() as executor:
        executor.submit(my_object.my_method)  # the future is deliberately dropped
        del my_object
        for _ in range(60):
            gc.collect()
            if collected.wait(1.0):
                break
        assert collected.is_set(), "the executor held on to the submitted callable after its task ran"


def test_executor_max_workers_negative(fray_ctx: JobContext) -> None:
    for number in (0, -1):
        with pytest.raises(ValueError, match="max_workers must be greater than 0"):
            fray_ctx.executor(max_workers=number)


def test_executor_free_reference(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        for obj in executor.map(w.make_dummy_object, range(10), timeout=TIMEOUT):
            ref = weakref.ref(obj)
            del obj
            gc.collect()
            assert ref() is None, "map's iterator kept a result the caller had dropped"


# ----------------------------------------------------------------- ExecutorShutdownTest (test_shutdown.py)
def test_executor_run_after_shutdown(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor()
    executor.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        executor.submit(pow, 2, 5)


def test_executor_hang_issue12364(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor()
    submitted = [executor.submit(time.sleep, 0.1) for _ in range(50)]
    executor.shutdown()
    for future in submitted:
        assert future.done()  # shutdown(wait=True) returned after every one settled
        future.result()


def test_executor_cancel_futures(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor(max_workers=2)
    submitted = [executor.submit(time.sleep, 0.1) for _ in range(50)]
    executor.shutdown(cancel_futures=True)
    cancelled = [f for f in submitted if f.cancelled()]
    assert len(cancelled) > 20
    others = [f for f in submitted if not f.cancelled()]
    for future in others:
        assert future.done()
        assert future.exception() is None
    assert others


def test_executor_hang_gh94440(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor(max_workers=1)
    executor.submit(int).result(TIMEOUT)
    executor.submit(int).cancel()
    finished = threading.Event()

    def shut_down() -> None:
        executor.shutdown(wait=True)
        finished.set()

    threading.Thread(target=shut_down, daemon=True).start()
    assert finished.wait(30), "shutdown(wait=True) hung after a future was cancelled"


def test_executor_context_manager_shutdown(fray_ctx: JobContext) -> None:
    with fray_ctx.executor(max_workers=5) as executor:
        assert list(executor.map(abs, range(-5, 5), timeout=TIMEOUT)) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError):
        executor.submit(abs, 1)


def test_executor_shutdown_no_wait(fray_ctx: JobContext) -> None:
    executor = fray_ctx.executor(max_workers=5)
    results = executor.map(abs, range(-5, 5), timeout=TIMEOUT)
    executor.shutdown(wait=False)
    assert all(r == abs(v) for r, v in zip(results, range(-5, 5), strict=True))  # computed all the same


def _shutdown_waits_for(executor: futures.Executor, gate: Path) -> None:
    """shutdown(wait=True) returns only once the tasks behind `gate` have ended (they wait for it)."""
    waiter = threading.Thread(target=executor.shutdown, kwargs={"wait": True}, daemon=True)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), "shutdown(wait=True) returned while the map's tasks were still running"
    gate.touch()
    waiter.join(TIMEOUT)
    assert not waiter.is_alive()


def test_executor_shutdown_waits_for_the_items_of_a_map_not_read_yet(fray_ctx: JobContext, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    executor = fray_ctx.executor()  # (no max_workers: a map's items are on the backend at once, with no slot)
    results = executor.map(g.wait_then, [str(gate)] * 3, [0, 1, 2])
    _shutdown_waits_for(executor, gate)
    assert list(results) == [0, 1, 2]  # (read after shutdown, as a thread pool's map allows)


def test_executor_shutdown_waits_for_a_map_dropped_unread(fray_ctx: JobContext, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    executor = fray_ctx.executor()
    results = executor.map(g.wait_then, [str(gate)] * 3, [0, 1, 2])
    del results
    gc.collect()
    _shutdown_waits_for(executor, gate)


def test_executor_shutdown_waits_for_the_items_a_failed_map_left(fray_ctx: JobContext, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    executor = fray_ctx.executor()
    results = executor.map(w.fail_first_then_wait, [0, 1, 2, 3], [str(gate)] * 4)
    with pytest.raises(ValueError, match="item 0"):
        next(results)  # (the map ends here, its other items still running)
    _shutdown_waits_for(executor, gate)


# ----------------------------------------------------------------- Future.cancel and other callers' use
def test_executor_cancel_takes_a_queued_task_out(fray_ctx: JobContext, tmp_path: Path) -> None:
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    with fray_ctx.executor(max_workers=1) as executor:
        first = executor.submit(h.wait_for_file, str(gate), 60)
        queued = executor.submit(w.touch_then, str(ran))
        assert queued.cancel() and queued.cancelled()
        assert not first.cancel()  # its task is on the backend: running, as a thread pool's would be
        gate.touch()
        first.result(TIMEOUT)
    assert not ran.exists(), "a cancelled queued future's task ran"


def test_executor_futures_work_with_asyncio_and_callbacks(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        seen: list[int] = []
        future = executor.submit(w.mul, 6, 7)
        future.add_done_callback(lambda f: seen.append(f.result()))

        async def both() -> list[int]:
            return list(
                await asyncio.gather(asyncio.wrap_future(future), asyncio.wrap_future(executor.submit(abs, -3)))
            )

        assert asyncio.run(both()) == [42, 3]
        assert seen == [42]
        failed = executor.submit(h.raise_value_error, "boom")
        assert isinstance(failed.exception(TIMEOUT), ValueError)


# ----------------------------------------------------------------- WaitTests (test_wait.py)
def test_executor_wait_20369(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        future = executor.submit(w.mul, 1, 2)
        done, not_done = futures.wait([future, future], timeout=TIMEOUT, return_when=futures.ALL_COMPLETED)
        assert done == {future} and not_done == set()


def test_executor_wait_first_completed(fray_ctx: JobContext, tmp_path: Path) -> None:
    fixed = w.finished_futures()
    gate = tmp_path / "gate"
    with fray_ctx.executor() as executor:
        future1 = executor.submit(w.mul, 21, 2)
        future2 = executor.submit(h.wait_for_file, str(gate), 60)
        try:
            done, not_done = futures.wait(
                [fixed["cancelled"], future1, future2], timeout=TIMEOUT, return_when=futures.FIRST_COMPLETED
            )
            assert done == {future1}
            assert not_done == {fixed["cancelled"], future2}
        finally:
            gate.touch()
        future2.result(TIMEOUT)


def test_executor_wait_first_completed_some_already_completed(fray_ctx: JobContext, tmp_path: Path) -> None:
    fixed = w.finished_futures()
    gate = tmp_path / "gate"
    with fray_ctx.executor() as executor:
        future1 = executor.submit(h.wait_for_file, str(gate), 60)
        try:
            finished, pending = futures.wait(
                [fixed["cancelled_notified"], fixed["successful"], future1], return_when=futures.FIRST_COMPLETED
            )
            assert finished == {fixed["cancelled_notified"], fixed["successful"]}
            assert pending == {future1}
        finally:
            gate.touch()
        future1.result(TIMEOUT)


def test_executor_wait_first_exception(fray_ctx: JobContext, tmp_path: Path) -> None:
    gate1, gate2 = tmp_path / "gate1", tmp_path / "gate2"
    with fray_ctx.executor() as executor:
        try:
            future1 = executor.submit(w.mul, 2, 21)
            future2 = executor.submit(w.wait_and_raise, str(gate1))
            future3 = executor.submit(h.wait_for_file, str(gate2), 60)
            future1.add_done_callback(lambda _: gate1.touch())  # future1 completes before future2 fails
            finished, pending = futures.wait(
                [future1, future2, future3], timeout=TIMEOUT, return_when=futures.FIRST_EXCEPTION
            )
            assert finished == {future1, future2}
            assert pending == {future3}
        finally:
            gate1.touch()
            gate2.touch()
        future3.result(TIMEOUT)


def test_executor_wait_first_exception_some_already_complete(fray_ctx: JobContext, tmp_path: Path) -> None:
    fixed = w.finished_futures()
    gate = tmp_path / "gate"
    with fray_ctx.executor() as executor:
        future1 = executor.submit(divmod, 21, 0)
        future2 = executor.submit(h.wait_for_file, str(gate), 60)
        try:
            finished, pending = futures.wait(
                [fixed["successful"], fixed["cancelled"], fixed["cancelled_notified"], future1, future2],
                timeout=TIMEOUT,
                return_when=futures.FIRST_EXCEPTION,
            )
            assert finished == {fixed["successful"], fixed["cancelled_notified"], future1}
            assert pending == {fixed["cancelled"], future2}
        finally:
            gate.touch()
        future2.result(TIMEOUT)


def test_executor_wait_first_exception_one_already_failed(fray_ctx: JobContext, tmp_path: Path) -> None:
    fixed = w.finished_futures()
    gate = tmp_path / "gate"
    with fray_ctx.executor() as executor:
        future1 = executor.submit(h.wait_for_file, str(gate), 60)
        try:
            finished, pending = futures.wait([fixed["exception"], future1], return_when=futures.FIRST_EXCEPTION)
            assert finished == {fixed["exception"]} and pending == {future1}
        finally:
            gate.touch()
        future1.result(TIMEOUT)


def test_executor_wait_all_completed(fray_ctx: JobContext) -> None:
    fixed = w.finished_futures()
    with fray_ctx.executor() as executor:
        future1 = executor.submit(divmod, 2, 0)
        future2 = executor.submit(w.mul, 2, 21)
        every = [fixed["successful"], fixed["cancelled_notified"], fixed["exception"], future1, future2]
        finished, pending = futures.wait(every, timeout=TIMEOUT, return_when=futures.ALL_COMPLETED)
        assert finished == set(every) and pending == set()


def test_executor_wait_timeout(fray_ctx: JobContext, tmp_path: Path) -> None:
    fixed = w.finished_futures()
    gate = tmp_path / "gate"
    with fray_ctx.executor() as executor:
        future = executor.submit(h.wait_for_file, str(gate), 60)
        try:
            finished, pending = futures.wait(
                [fixed["cancelled_notified"], fixed["exception"], fixed["successful"], future],
                timeout=0.05,
                return_when=futures.ALL_COMPLETED,
            )
            assert finished == {fixed["cancelled_notified"], fixed["exception"], fixed["successful"]}
            assert pending == {future}
        finally:
            gate.touch()
        future.result(TIMEOUT)


# ----------------------------------------------------------------- AsCompletedTests (test_as_completed.py)
def test_executor_as_completed_no_timeout(fray_ctx: JobContext) -> None:
    fixed = w.finished_futures()
    with fray_ctx.executor() as executor:
        every = {fixed["cancelled_notified"], fixed["exception"], fixed["successful"]}
        every |= {executor.submit(w.mul, 2, 21), executor.submit(w.mul, 7, 6)}
        assert set(futures.as_completed(every, timeout=TIMEOUT)) == every


def test_executor_as_completed_future_times_out(fray_ctx: JobContext) -> None:
    fixed = w.finished_futures()
    already = {fixed["cancelled_notified"], fixed["exception"], fixed["successful"]}
    with fray_ctx.executor() as executor:
        for timeout in (0, 0.1):
            future = executor.submit(time.sleep, 1.0)
            seen = set()
            with pytest.raises(futures.TimeoutError):
                for f in futures.as_completed(already | {future}, timeout):
                    seen.add(f)
            assert seen == already


def test_executor_as_completed_duplicate_futures(fray_ctx: JobContext) -> None:
    with fray_ctx.executor() as executor:
        future = executor.submit(time.sleep, 0.5)
        assert len(list(futures.as_completed([future] * 3, timeout=TIMEOUT))) == 1
