"""Functions and classes the executor, map and actor-pool conformance tests run as tasks (importable by every
backend's workers, as fray.testing.workloads is)."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fray.testing.workloads import wait_for_file

__all__ = [
    "Doubler",
    "MyObject",
    "capture",
    "dies_on",
    "fail_at",
    "fail_at_six",
    "finished_futures",
    "make_dummy_object",
    "mul",
    "nap",
    "touch_then",
    "wait_and_raise",
    "wait_for_file",
]


def mul(x: int, y: int) -> int:
    return x * y


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()


def wait_and_raise(path: str) -> None:
    wait_for_file(path, 60)
    raise Exception("this is an exception")


def touch_then(path: str, value: Any = None) -> Any:
    """Leave a mark that this task ran."""
    Path(path).touch()
    return value


def fail_at(item: int, bad: int) -> int:
    if item == bad:
        raise ValueError(f"item {item} is bad")
    return item * 2


def fail_first_then_wait(item: int, gate: str) -> int:
    """Item 0 raises at once; the others return once `gate` exists."""
    if item == 0:
        raise ValueError("item 0 is bad")
    wait_for_file(gate, 60)
    return item


def fail_at_six(item: int) -> int:
    return fail_at(item, 6)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def dies_on(item: int, marker: str) -> int:
    """For an actor's method: kill this process the first time `item` 0 arrives (a file marks it done)."""
    if item == 0 and not os.path.exists(marker):
        Path(marker).touch()
        time.sleep(0.2)  # the other items are in flight on this member by now
        os._exit(1)
    return item * 2


class Doubler:
    """A pool member: state made once (the factor), used by every call."""

    def __init__(self, factor: int = 2, marker: str = "") -> None:
        self.factor = factor
        self.marker = marker
        self.calls = 0

    def double(self, x: int) -> int:
        self.calls += 1
        return x * self.factor

    def pid(self, _: Any = None) -> int:
        return os.getpid()

    def sleepy(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def maybe_die(self, item: int) -> int:
        return dies_on(item, self.marker) * self.factor // 2

    def fail_at(self, item: int, bad: int = 3) -> int:
        return fail_at(item, bad)


def finished_futures() -> dict[str, Future[Any]]:
    """Futures in each settled state, as CPython's test_concurrent_futures builds them by hand."""
    cancelled: Future[Any] = Future()
    cancelled.cancel()
    notified: Future[Any] = Future()
    notified.cancel()
    notified.set_running_or_notify_cancel()
    failed: Future[Any] = Future()
    failed.set_exception(OSError())
    successful: Future[Any] = Future()
    successful.set_result(42)
    return {"cancelled": cancelled, "cancelled_notified": notified, "exception": failed, "successful": successful}
