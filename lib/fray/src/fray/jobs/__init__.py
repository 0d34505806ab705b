"""Jobs: whole programs run by a ClusterContext, with their records, attempts and logs.

- requests, call, run_call: what a job runs (a command or a callable) and how a callable job is run;
- records, handle, events: what a job is (JobInfo and its attempts), its handle, its timeline events;
- supervisor, group_ranks, rank_procs, outcomes, policy, signals: the supervisor that runs a job's ranks and
  classes, budgets and signals their attempts;
- dirs, retry: a job's checkpoint directory, and a finished job run again;
- local, detached, plain_text: jobs as local subprocesses, jobs that outlive their submitter, logs as text.

Above the runtime; below the API (fray.cluster_context)."""

from __future__ import annotations

from typing import Any

# The names of the module `fray.jobs` was before it was this room (the local runner, now fray.jobs.local).
_LOCAL_RUNNER_NAMES = frozenset(
    {
        "LocalJobs",
        "ended_status",
        "follow_log",
        "host_resources",
        "job_command",
        "job_environment",
        "missing_dir_message",
        "private_dir",
        "read_log_end",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _LOCAL_RUNNER_NAMES:
        raise AttributeError(f"module 'fray.jobs' has no attribute {name!r}")
    from fray._moved import warn_moved
    from fray.jobs import local

    warn_moved(f"fray.jobs.{name}", f"fray.jobs.local.{name}")
    return getattr(local, name)
