"""Run one in_memory task in a child process: the way a task gets its own environment variables (threads share
one os.environ). The function, its arguments and its result travel through fray.in_memory._channel (large
buffers in shared memory; the result is stored as it arrived); the child first gets this process's sys.path,
so it can import what the call needs. It dies with this process however that ends (fray.host.watchdog)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from fray.backend import (
    RECORDER,
    SHARED,
    Kind,
    RemoteError,
    capture_exception,
    driver_import_path,
    keep_driver_view,
    loads,
    watchdog,
    worker_env_defaults,
)
from fray.errors import WorkerCrashedError
from fray.in_memory._channel import Channel
from fray.kit import Serialized


def run_in_child(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, str]) -> Any:
    parent_sock, child_sock = socket.socketpair()
    channel = Channel(parent_sock, device_mode=SHARED)  # (the child reads its arguments before it replies)
    with child_sock:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fray.in_memory._subprocess", str(child_sock.fileno())],
            pass_fds=(child_sock.fileno(),),
            env={**os.environ, **worker_env_defaults(), **env},
            start_new_session=True,  # a group of its own, which fray's watchdog kills if this process ends first
        )
    watchdog.watch_group(proc.pid)
    RECORDER.record(Kind.WORKER_START, proc.pid, _NAME, {"pid": proc.pid})
    try:
        channel.send(driver_import_path(), "sys.path")
        channel.send((fn, args, kwargs), "the task and its arguments")
        ok, blob = channel.recv_outcome("the task's result")
    except (EOFError, OSError):
        code = proc.wait()
        why = f"it exited with code {code} while running its task"
        RECORDER.record(Kind.WORKER_DIED, proc.pid, _NAME, {"reason": why, "exit_code": code})
        raise WorkerCrashedError(f"the child process running this task exited with code {code}") from None
    finally:
        channel.close()
        if not _exits(proc):
            proc.kill()
            proc.wait()
        watchdog.forget_group(proc.pid)
    if ok:
        return Serialized(blob)  # the store keeps it as it arrived
    error = loads(blob, "the task's error")
    assert isinstance(error, RemoteError)
    raise error.rebuild()


_NAME = "task process (runtime_env)"  # how the timeline and the page name such a process


def _exits(proc: subprocess.Popen[bytes]) -> bool:
    try:
        proc.wait(timeout=10)  # it exits once its result is sent
    except subprocess.TimeoutExpired:
        return False
    return True


def _main(fd: int) -> None:
    channel = Channel(socket.socket(fileno=fd))
    try:
        parent_path: list[str] = channel.recv("sys.path")
        keep_driver_view(parent_path)  # (the current directory `-m` put first, only if the parent imports from it)
        sys.path[:] = [*parent_path, *(p for p in sys.path if p not in parent_path)]
        channel.send_outcome(*_run(channel), "the task's result")
    except (EOFError, OSError):  # the parent is gone (or could not send the call): nobody to answer
        pass
    finally:
        channel.close()


def _run(channel: Channel) -> tuple[bool, Any]:
    try:
        fn, args, kwargs = channel.recv("the task and its arguments")
    except (EOFError, OSError):
        raise
    except Exception as exc:  # arguments that do not load here
        return (False, capture_exception(exc))
    try:
        return (True, fn(*args, **kwargs))
    except BaseException as exc:
        return (False, capture_exception(exc))


if __name__ == "__main__":
    _main(int(sys.argv[1]))
