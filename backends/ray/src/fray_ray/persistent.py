"""A Ray head that outlives the command that started it: `fray cluster start --backend ray` / `fray cluster stop`.

The same head as a private one (fray_ray._head.LocalHead: `ray start --head --block` in a process group of its
own, ports chosen free, a temp dir of its own, on loopback unless told otherwise) but not tied to its starter's
life. It is recorded in the state directory (`clusters/ray.json`: addresses, process group, temp dir), where later
commands find it: `fray job ... --backend ray` talk to it by address, `fray cluster stop` stops its jobs, then
exactly its process group, and removes its temp dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

from fray.backend import Identity, state_dir, stop_group
from fray_ray._head import LocalHead, job_client
from fray_ray._local import LOOPBACK
from fray_ray._tokens import remove as remove_token

__all__ = ["recorded", "start", "stop"]

NAME = "ray"


def recorded() -> dict[str, Any] | None:
    """The head `fray cluster start` recorded, with "running": whether its process still runs."""
    record = state_dir.read_cluster(NAME)
    if record is None:
        return None
    leader = Identity.from_record(record.get("leader"))
    return {**record, "running": leader is not None and leader.running()}


def start(
    num_cpus: float | None = None,
    resources: dict[str, float] | None = None,
    num_gpus: float | None = None,
    object_store_memory: int | None = None,
    listen: str = LOOPBACK,
) -> tuple[dict[str, Any], bool]:
    """Start and record a head (or find the running one): (its record, whether it was started now)."""
    current = recorded()
    if current is not None and current["running"]:
        return current, False
    if current is not None:  # its process is gone: clear what is left of it
        _clean(current)
    head = LocalHead(num_cpus, resources, num_gpus, object_store_memory, owned=False, listen=listen)
    head.wait_ready(partial(job_client, own=True))  # stops the head and raises if it does not come up
    record = {
        "backend": NAME,
        "address": head.address,
        "gcs_address": head.gcs_address,
        "pid": head.proc.pid,
        "leader": head.leader.record() if head.leader else None,  # the head's process: its group's leader
        "temp_dir": head.temp_dir,
        "token_file": str(head.token_file) if head.token_file else None,  # (its own token: fray_ray._tokens)
        "listen": listen,
        "started": time.time(),
    }
    state_dir.record_cluster(NAME, record)
    return {**record, "running": True}, True


def stop(job_grace: float = 15.0) -> dict[str, Any] | None:
    """Stop the recorded head: its running jobs through the Job API first (so their processes end the way Ray
    ends them), then its `ray start --block` process (which stops what it started), then whatever is left of its
    process group; remove its temp dir and the record. Returns the record, or None if there was none."""
    current = recorded()
    if current is None:
        return None
    if current["running"]:
        try:
            client = job_client(current["address"], own=True)
            running = [d.submission_id for d in client.list_jobs() if d.submission_id and not d.status.is_terminal()]
            for job_id in running:
                client.stop_job(job_id)
            deadline = time.monotonic() + job_grace
            while running and time.monotonic() < deadline:
                time.sleep(0.2)
                running = [j for j in running if not client.get_job_status(j).is_terminal()]
        except Exception:  # the head is going anyway, and its jobs' guards end them with their supervisors
            pass
        try:
            os.kill(int(current["pid"]), signal.SIGTERM)  # --block: Ray stops every process it started
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30.0
        leader = Identity.from_record(current.get("leader"))
        while leader is not None and leader.running() and time.monotonic() < deadline:
            time.sleep(0.1)
    _clean(current)
    return current


def _clean(record: dict[str, Any]) -> None:
    leader = Identity.from_record(record.get("leader"))
    if leader is not None:  # only a group proven to be the head's: after a reboot its number is anyone's
        stop_group(leader, grace=3.0)
    if record.get("temp_dir"):
        shutil.rmtree(record["temp_dir"], ignore_errors=True)
    if record.get("token_file"):
        remove_token(Path(record["token_file"]), owned=False)
    state_dir.forget_cluster(NAME)
