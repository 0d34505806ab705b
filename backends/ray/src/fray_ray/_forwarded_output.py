"""What a worker of this machine printed just before its driver shut down, given the time to reach the driver.

Ray's log monitor polls each worker's stdout and stderr files and publishes their new lines; the driver's print
thread relays them to its console (for a job, its log). `ray.shutdown()` called by hand stops that thread at once
(Ray waits only as the interpreter exits), so a task's last lines, printed just before its result reached the
driver, were lost whenever the driver shut down right after its `get`. Before it shuts Ray down, a driver that
forwards its workers' output waits until SETTLE seconds have passed since the last write to a worker's output file
on this machine: at most SETTLE, and not at all when its workers have been quiet that long. The files of workers
on other machines are not here: their last lines may still be lost, as with Ray used directly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["SETTLE", "settle", "this_nodes_logs"]

SETTLE = 1.0  # seconds after a worker's last write in which Ray's log monitor has relayed it to the driver


def _last_write(logs_dir: str) -> float:
    """When a worker's stdout or stderr file in `logs_dir` was last written (0.0: none there)."""
    newest = 0.0
    try:
        entries = os.scandir(logs_dir)
    except OSError:
        return newest
    with entries:
        for entry in entries:
            if entry.name.startswith("worker-") and entry.name.endswith((".out", ".err")):
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:  # (a file removed meanwhile)
                    continue
    return newest


def settle(
    logs_dir: str | None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Waits until SETTLE seconds after the last write to a worker's output file in `logs_dir`, at most SETTLE;
    returns the seconds waited."""
    if not logs_dir:
        return 0.0
    wait = min(SETTLE, _last_write(logs_dir) + SETTLE - clock())
    if wait <= 0:
        return 0.0
    sleep(wait)
    return wait


def this_nodes_logs() -> str | None:
    """The log directory of the Ray node this driver runs beside, where its workers' output files are; None where
    there is none here (a cluster on other machines)."""
    import ray

    node = getattr(ray._private.worker.global_worker, "node", None)
    try:
        path = node.get_logs_dir_path() if node is not None else None
    except Exception:  # (a node object without its session dir: nothing of it is here)
        return None
    return path if path and os.path.isdir(path) else None
