"""What the `fray` job commands share: their error, opening a backend's cluster, and printing."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from typing import Any

from fray.backend import Backend, PersistentClusters
from fray.cluster_context import ClusterContext
from fray.host import settings
from fray.jobs.dirs import SPEC_OPTION
from fray.registry import backend_options, cluster_context_from, get_backend, parse_spec
from fray.runtime.capabilities import Capability
from fray.types import JobInfo, JobStatus

__all__ = [
    "CommandError",
    "as_dict",
    "exit_status",
    "format_time",
    "lacks_persistence",
    "open_cluster",
    "resolve",
    "say",
]


class CommandError(Exception):
    """An error to print as `fray: error: ...` (exit code 1, or `code`), without a traceback."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def resolve(args: argparse.Namespace) -> tuple[str, dict[str, str], Backend]:
    name, options = parse_spec(args.backend or settings.BACKEND.read())
    return name, options, get_backend(name)


def lacks_persistence(name: str, what: str) -> CommandError:
    return CommandError(
        f"{what} needs jobs that another `fray` command can reach, and the {name!r} backend lacks that capability "
        f"({Capability.PERSISTENT_JOBS.value!r}): its jobs live in the processes of the program that submitted "
        f"them. Run the job attached (`fray job submit --backend {name} -- CMD`, or `fray run`), or use the "
        "in_memory or ray backend for jobs that outlive one command."
    )


def open_cluster(args: argparse.Namespace, what: str, persistent: bool = True) -> ClusterContext:
    """The backend's ClusterContext for this command. `persistent`: the command needs jobs that outlive one
    command (a cluster by address on ray; the state directory on in_memory)."""
    name, options, backend = resolve(args)
    if persistent and Capability.PERSISTENT_JOBS not in backend.capabilities:
        raise lacks_persistence(name, what)
    if getattr(args, "address", None):
        options["address"] = args.address
    if "address" not in options and isinstance(backend, PersistentClusters):  # ray: RAY_ADDRESS, else its head
        found, why_not = backend.persistent_address()
        if found:
            options["address"] = found
        elif persistent:
            raise CommandError(f"{what}: no {name} cluster to talk to. {why_not}")
    backend.prepare_command(backend_options(backend, {k: v for k, v in options.items() if k != SPEC_OPTION}))
    return cluster_context_from(backend, options)


def say(text: str) -> None:
    print(f"fray: {text}", file=sys.stderr, flush=True)


def exit_status(info: JobInfo) -> int:
    """The exit code of `fray job submit` for a job that ended: its own; killed or stopped by signal N: 128+N."""
    code = info.exit_code if isinstance(info.exit_code, int) else None
    if code is not None and code < 0:
        return 128 - code
    if info.status is JobStatus.SUCCEEDED:
        return 0
    if info.status is JobStatus.STOPPED:
        return code if code is not None and code > 128 else 128 + signal.SIGTERM
    return code if code else 1


def format_exit_code(code: int) -> str:
    """A job's exit code as a shell shows it: ended by signal N (a negative code from Python) is 128+N."""
    if code >= 0:
        return str(code)
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"{128 - code} (ended by {name})"


def format_time(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"


def as_dict(info: JobInfo) -> dict[str, Any]:
    return {**dataclasses.asdict(info), "status": info.status.value}
