"""Run one in_memory task in a child process: the way a task gets its own environment variables (threads share
one os.environ). The function and arguments travel by cloudpickle; the child writes its outcome to a file."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from fray.errors import WorkerCrashedError
from fray.remote_errors import RemoteError, capture_exception


def run_in_child(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, str]) -> Any:
    with tempfile.TemporaryDirectory(prefix="fray-task-") as tmp:
        call_path, result_path = os.path.join(tmp, "call"), os.path.join(tmp, "result")
        with open(call_path, "wb") as f:
            cloudpickle.dump((fn, args, kwargs, sys.path), f)
        child_env = {**os.environ, **env}
        code = subprocess.call(
            [sys.executable, "-m", "fray.in_memory._subprocess", call_path, result_path], env=child_env
        )
        if not os.path.exists(result_path):
            raise WorkerCrashedError(f"the child process running this task exited with code {code}")
        with open(result_path, "rb") as f:
            ok, value = pickle.load(f)
    if not ok:
        assert isinstance(value, RemoteError)
        raise value.rebuild()
    return value


def _main(call_path: str, result_path: str) -> None:
    with open(call_path, "rb") as f:
        fn, args, kwargs, parent_path = pickle.load(f)
    sys.path[:] = [*parent_path, *(p for p in sys.path if p not in parent_path)]
    try:
        outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException as exc:
        outcome = (False, capture_exception(exc))
    with open(result_path, "wb") as f:
        cloudpickle.dump(outcome, f)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
