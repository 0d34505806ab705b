"""Workloads the conformance suite sends to workers: module-level functions and classes every backend can import by
name. Public, so that a backend's own tests and the repository's matrix reuse them instead of copying them."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fray.context import JobContext, get_job_context
from fray.errors import UnsupportedFeatureError
from fray.host import procfs
from fray.runtime.refs import ObjectRef


def add(a: int, b: int) -> int:
    return a + b


def identity(x: Any) -> Any:
    return x


def sleep_then(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def drop(ctx: JobContext, ref: ObjectRef) -> None:
    """Let go of a task a test no longer needs: cancelled, where the backend can cancel it even if it runs; else
    left to end by itself (the suite's slow tasks sleep a few seconds)."""
    try:
        ctx.cancel(ref)
    except UnsupportedFeatureError:  # running, and the backend lacks cancel_running
        pass


def spin(marker: str, seconds: float = 60.0) -> str:
    """Busy in Python bytecode (so it can be interrupted), after announcing it has started."""
    Path(marker).write_text("running")
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.01)
    return "finished"


def is_ref(x: Any) -> bool:
    return isinstance(x, ObjectRef)


def first_is_ref_then_value(items: list[Any]) -> tuple[bool, Any]:
    return isinstance(items[0], ObjectRef), get_job_context().get(items[0], timeout=30)


def use_passed_context(ctx: Any) -> int:
    """ctx was the caller's JobContext: it must arrive as a usable context here."""
    inner = ctx.create_task(add, args=(40, 1))

    def closure() -> int:
        return int(ctx.get(ctx.put(1)))  # a context captured by a closure travels too

    return int(ctx.get(inner, timeout=60)) + int(ctx.get(ctx.create_task(closure), timeout=60))


def array_sum(a: Any) -> float:
    return float(a.sum())


def nested_depth(n: int) -> int:
    if n == 0:
        return 0
    ctx = get_job_context()
    return 1 + int(ctx.get(ctx.create_task(nested_depth, args=(n - 1,)), timeout=120))


def fan_out(n: int) -> list[int]:
    ctx = get_job_context()
    return list(ctx.get([ctx.create_task(add, args=(i, 0)) for i in range(n)], timeout=120))


def backend_name() -> str:
    return get_job_context().backend


def getenv(name: str) -> str | None:
    return os.environ.get(name)


def fail_first(counter_path: str, failures: int) -> int:
    """Raise ValueError on the first `failures` calls (counted in a file), then return the call count."""
    path = Path(counter_path)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    if count <= failures:
        raise ValueError(f"planned failure {count}")
    return count


def pid_of_worker() -> int:
    return os.getpid()


def crash() -> None:
    os._exit(1)


def crash_first(counter_path: str) -> str:
    """Kill this worker process on the first call (counted in a file), succeed after."""
    path = Path(counter_path)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    if count == 1:
        os._exit(1)
    return f"ok after {count - 1} crash"


def raise_value_error(message: str) -> None:
    raise ValueError(message)


class CustomError(Exception):
    """A user-defined exception type, to check types survive the trip back."""


def raise_custom(message: str) -> None:
    raise CustomError(message)


def named_counter_incr(name: str) -> int:
    """Get-or-create the named Counter from inside a worker, then increment it."""
    from fray.types import ActorOptions

    ctx = get_job_context()
    counter = ctx.create_actor(Counter, options=ActorOptions(name=name, get_if_exists=True))
    return int(ctx.get(counter.incr(), timeout=60))


def call_actor(handle: Any, value: int) -> int:
    return int(get_job_context().get(handle.incr(value), timeout=60))


# One condition for every Counter in a process (an actor's own would not pickle); each waiter checks its own count.
_MEETING = threading.Condition()


def shutdown_inside() -> str:
    """A task that shuts its context down (a no-op there: the context belongs to the driver)."""
    import fray

    fray.shutdown()
    fray.get_job_context().shutdown()
    return "still here"


class ShutsDown:
    def call(self) -> str:
        return shutdown_inside()


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.log: list[int] = []

    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    def get(self) -> int:
        return self.value

    def append(self, item: int) -> None:
        self.log.append(item)

    def items(self) -> list[int]:
        return self.log

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_custom(self, message: str) -> None:
        raise CustomError(message)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def meet(self, n: int, timeout: float = 30.0) -> bool:
        """True once n calls have arrived while this one waits (they overlap); False if none came in time."""
        with _MEETING:
            self.arrived = getattr(self, "arrived", 0) + 1
            _MEETING.notify_all()
            return _MEETING.wait_for(lambda: self.arrived >= n, timeout)

    def submit_task(self, a: int, b: int) -> int:
        ctx = get_job_context()
        return int(ctx.get(ctx.create_task(add, args=(a, b)), timeout=60))

    def crash(self) -> None:
        os._exit(1)

    def pid(self) -> int:
        return os.getpid()


def _explode() -> None:
    raise RuntimeError("kaboom")


class BreaksOnLoad:
    """Pickles fine, cannot be unpickled (as a class whose module is missing where it lands)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_explode, ())


def make_unloadable() -> BreaksOnLoad:
    return BreaksOnLoad()


class Store:
    """Keeps one value."""

    def __init__(self) -> None:
        self.value: Any = None

    def set(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class SlowInit:
    """An actor whose __init__ takes a while, as one loading a model's weights does."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)
        self.model = {"ready": True}

    def check(self) -> bool:
        return bool(self.model["ready"])


class RefKeeper:
    """Keeps refs across calls: refs handed to it inside structures, and refs of values it put itself."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    def keep(self, key: str, holder: Any) -> None:
        self.kept[key] = holder

    def put_and_keep(self, key: str, value: Any) -> None:
        self.kept[key] = get_job_context().put(value)

    def task_and_keep(self, key: str, a: int, b: int) -> None:
        self.kept[key] = get_job_context().create_task(add, args=(a, b))

    def read(self, key: str) -> Any:
        """The values behind what is kept under key: a ref, or a list or dict of refs."""
        ctx, held = get_job_context(), self.kept[key]
        if isinstance(held, list):
            return ctx.get(held, timeout=60)
        if isinstance(held, dict):
            return {name: ctx.get(ref, timeout=60) for name, ref in held.items()}
        return ctx.get(held, timeout=60)

    def read_refs(self, key: str) -> Any:
        """What is kept under key, refs as they are (handed back to the caller)."""
        return self.kept[key]

    def drop(self, key: str) -> None:
        del self.kept[key]


class FailingInit:
    def __init__(self) -> None:
        raise RuntimeError("init exploded")

    def ping(self) -> str:
        return "pong"


def wait_for_file(path: str, timeout: float = 30.0) -> None:
    end = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > end:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def recorded_after(
    ctx: JobContext, cursor: int, kind: str, name: str = "", where: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any] | None:
    """The data of the first `kind` event after `cursor` (whose name holds `name`, whose data is `where`), asked
    again for a while: a backend may bring its workers' events a little later (ray flushes them every 0.2 s)."""
    deadline = time.monotonic() + 20
    while True:
        for _, _, e in ctx.events().page(cursor).events:
            if e.kind == kind and name in e.name and (where is None or where(dict(e.data or {}))):
                return dict(e.data or {})
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def progress_stopped(progress: Path, timeout: float = 30.0) -> bool:
    """True once a producer's progress file stops advancing (it was stopped), within timeout.

    Polled rather than read once after a fixed sleep: a cancel is asynchronous on every engine, so the producer
    may write a few more times before it stops.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = progress.read_text() if progress.exists() else None
        if now is not None and now == last:
            return True
        last = now
        time.sleep(0.5)
    return False


# ----------------------------------------------------------------------------- GPUs (test_gpus)
def held_gpus() -> list[int]:
    """fray.current_gpus() where this task runs."""
    import fray

    return fray.current_gpus()


def held_gpus_since() -> tuple[list[int], float]:
    """fray.current_gpus() where this task runs, and when it started (time.time())."""
    import fray

    return fray.current_gpus(), time.time()


def gpus_and_visible() -> tuple[list[int], str | None]:
    """fray.current_gpus() and CUDA_VISIBLE_DEVICES where this task runs."""
    import fray

    return fray.current_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES")


class GpuHolder:
    """An actor that says which GPUs it holds."""

    def gpus(self) -> list[int]:
        import fray

        return fray.current_gpus()


class GpuMember:
    """A group member that says what it holds and sees: (current_gpus, CUDA_VISIBLE_DEVICES, LOCAL_RANK (-1 outside
    an SPMD group))."""

    def view(self) -> tuple[list[int], str | None, int]:
        import fray

        return fray.current_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"), int(os.environ.get("LOCAL_RANK", -1))

    def crash_now(self) -> None:
        os._exit(1)


def _parent_of(pid: int) -> int:
    found = procfs.stat(pid)
    if found is None:
        raise ProcessLookupError(f"no process {pid}")
    return found.ppid


def kill_descendant(pid: int, exit_wait: float = 10.0) -> None:
    """SIGKILL process `pid` (an actor's, as its `pid()` method said), after proving it a descendant of this
    process (started by it directly or through the engine's daemons): a test never signals a process that is not
    its own. Raises ValueError naming the process otherwise. Returns once the process has ended (at most
    `exit_wait` seconds): the kernel takes a while to end a process, longer on a loaded machine, and a test's
    "just after the death" counts from its end, not from the signal."""
    ancestor = pid
    for _ in range(64):
        if ancestor <= 1:
            break
        ancestor = _parent_of(ancestor)
        if ancestor == os.getpid():
            ended = os.pidfd_open(pid)  # (the process proven above, signalled and waited for by this descriptor)
            try:
                signal.pidfd_send_signal(ended, signal.SIGKILL)
                if not select.select([ended], [], [], exit_wait)[0]:
                    raise TimeoutError(f"process {pid} was sent SIGKILL and had not ended {exit_wait:g} s later")
            finally:
                os.close(ended)
            return
    raise ValueError(f"process {pid} is not a descendant of this process ({os.getpid()}): not signalled")


class RestartsSlowly(Counter):
    """A Counter whose __init__ takes `delay` seconds when it runs again (a restart): its first run leaves
    `marker`. Its `pid` says which process to kill."""

    def __init__(self, marker: str, delay: float, start: int = 0) -> None:
        if os.path.exists(marker):
            time.sleep(delay)
        else:
            Path(marker).write_text("started")
        super().__init__(start)
