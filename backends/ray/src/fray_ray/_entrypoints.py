"""A Ray job's entrypoint as fray submits it, and its log as fray returns it: the command wrapped to run in place
and to die with its job's supervisor, unwrapped again for its record, and Ray's own lines taken out of its log."""

from __future__ import annotations

import shlex

__all__ = ["guarded", "in_place", "strip_preamble", "unguarded"]

# A private head's job must not outlive its head. Ray's job supervisor starts the entrypoint (`/bin/sh -c ...`) in
# a session of its own with a watcher that kills it when the supervisor dies, but the raylet kills the direct
# children of a worker that exits, watcher included, and the entrypoint's own children (`sleep 300 & ...`) were
# left running forever after their head had stopped. So the entrypoint starts its own watcher, a child of the
# job's shell (in the job's process group, which it kills once the supervisor is gone; it ends with the job).
_GUARD = (
    'sup=$PPID; job=$$; (while kill -0 "$sup" && kill -0 "$job"; do sleep 1; done; '
    'kill -0 "$sup" || kill -9 -"$job") >/dev/null 2>&1 </dev/null & exec /bin/sh -c '
)


def guarded(command: str) -> str:
    return _GUARD + shlex.quote(command)


def in_place(command: str, working_dir: str) -> str:
    """The command, run in working_dir (on this machine): Ray's own working_dir would zip and copy it."""
    return f"cd -- {shlex.quote(working_dir)} && {{ {command}\n}}"


def unguarded(entrypoint: str) -> str:
    if entrypoint.startswith(_GUARD):
        parts = shlex.split(entrypoint[len(_GUARD) :])
        if len(parts) == 1:
            return parts[0]
    return entrypoint


def strip_preamble(logs: str, job_id: str, entrypoint: str) -> str:
    """Drop the two lines Ray's job manager adds to a job's log, and nothing else: its logger's "Runtime env is
    setting up." (the first line) and the supervisor's "Running entrypoint for job ID: COMMAND" line. The latter
    is written through a buffer flushed only after the entrypoint has started, so it may come after the job's
    first output (a command that does not exist: the shell's "not found" comes first), even mid-line."""
    logs = logs.replace(f"Running entrypoint for job {job_id}: {entrypoint}\n", "", 1)
    first, newline, rest = logs.partition("\n")
    if newline and first.endswith(" -- Runtime env is setting up."):
        logs = rest
    return logs
