"""Environment defaults of the worker processes fray starts (monarch's workers, in_memory's child processes).

- OMP_NUM_THREADS: the CPUs the process's actor holds (its `resources["CPU"]`, at least 1), and 1 for a process
  that runs tasks, as Ray sets it for its workers. torch and numpy's BLAS otherwise start a thread per core in
  every process: with several such processes on a machine of few cores, a large tensor operation now and then
  takes many times its usual time (threads spinning while a sibling waits for a core).
- THP_MEM_ALLOC_ENABLE=1: torch's CPU allocator aligns large tensors to 2 MiB and asks for transparent huge pages,
  as numpy does for its arrays by default: a fresh large tensor then takes a fraction of the page faults of 4 KiB
  pages, which are most of what a task returning a new tensor pays. torch reads it once, at its first allocation,
  so it is set when the process starts.

A variable already set (in the driver's environment, which fray's processes inherit, or a task's env_vars) wins.

in_memory runs tasks and actors as threads of the user's own process, which gets the THP default too
(`huge_pages_in_this_process`, at fray.init), so a thread's fresh batch tensors take fewer page faults there
too (bench_rlhf.py). It takes effect only if torch has not allocated anything yet (and costs nothing
otherwise); OMP_NUM_THREADS is left alone there (it would slow the user's own computing).

The import path: a worker process imports from where its driver does (`driver_import_path`, `keep_driver_view`).
Python puts the current directory first in a process started with `python -m` (as fray's and Monarch's worker
processes are, in the driver's current directory), where the driver itself may not import from it (a script run
from elsewhere): a directory every user can write, such as /tmp, would then let another user's module be imported
in front of the real one. So a worker drops that entry unless its driver's path has it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

__all__ = ["driver_import_path", "huge_pages_in_this_process", "keep_driver_view", "worker_env_defaults"]


def worker_env_defaults(cpus: float | None = None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The defaults of a worker process whose actor holds `cpus` CPUs (None: a process that runs tasks) that
    `environ` does not set already."""
    defaults = {"OMP_NUM_THREADS": str(max(1, int(cpus or 1))), "THP_MEM_ALLOC_ENABLE": "1"}
    return {name: value for name, value in defaults.items() if name not in environ}


def huge_pages_in_this_process(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Set THP_MEM_ALLOC_ENABLE=1 in this process unless it is set (True if it was set here)."""
    if "THP_MEM_ALLOC_ENABLE" in environ:
        return False
    environ["THP_MEM_ALLOC_ENABLE"] = "1"
    return True


def driver_import_path() -> list[str]:
    """This process's sys.path for its workers: '' (the current directory, there for `python -c`, `-m` and the
    REPL) made absolute, nothing added."""
    cwd = os.getcwd()
    path: list[str] = []
    for entry in sys.path:
        entry = entry or cwd
        if entry not in path:
            path.append(entry)
    return path


def keep_driver_view(driver_path: Iterable[str]) -> None:
    """In a worker process started with `python -m`: drop the current directory that put first in sys.path unless
    the driver's import path (`driver_import_path`, '' made absolute) has it too."""
    own = {"", os.getcwd()} - {entry or os.getcwd() for entry in driver_path}
    sys.path[:] = [entry for entry in sys.path if entry not in own]
