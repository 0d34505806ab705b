"""`fray job list|status|logs|stop|delete`."""

from __future__ import annotations

import argparse
import json
import sys

from fray.cli.common import as_dict, format_exit_code, format_time, open_cluster, say


def _list(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job list") as ctx:
        jobs = ctx.list_jobs()
    if args.json:
        print(json.dumps([as_dict(info) for info in jobs], indent=1))
        return 0
    if not jobs:
        say("no jobs")
        return 0
    width = max(len(info.id) for info in jobs)
    print(f"{'ID':{width}}  {'STATUS':9}  {'SUBMITTED':19}  ENTRYPOINT")
    for info in jobs:
        entry = info.entrypoint if len(info.entrypoint) <= 60 else info.entrypoint[:57] + "..."
        print(f"{info.id:{width}}  {info.status.value:9}  {format_time(info.submission_time):19}  {entry}")
    return 0


def _job_status(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job status") as ctx:
        info = ctx.get_job(args.job_id)
    if args.json:
        print(json.dumps(as_dict(info), indent=1))
        return 0
    print(f"{info.id}: {info.status.value}")
    print(f"  entrypoint: {info.entrypoint}")
    times = (info.submission_time, info.start_time, info.end_time)
    print("  submitted: {}  started: {}  ended: {}".format(*map(format_time, times)))
    if info.exit_code is not None:
        print(f"  exit code: {format_exit_code(info.exit_code)}")
    if info.message:
        print(f"  message: {info.message}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job logs") as ctx:
        if not args.follow:
            sys.stdout.write(ctx.get_job_logs(args.job_id))
            return 0
        for piece in ctx.tail_job_logs(args.job_id):
            sys.stdout.write(piece)
            sys.stdout.flush()
    return 0


def _stop(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job stop") as ctx:
        before = ctx.get_job(args.job_id).status
        ctx.stop_job(args.job_id)
        after = ctx.get_job(args.job_id).status
    say(f"job {args.job_id} {after.value}" if not before.is_terminal else f"job {args.job_id} had ended: {after.value}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job delete") as ctx:
        ctx.delete_job(args.job_id)
    say(f"job {args.job_id} deleted")
    return 0


JOB_VERBS = {
    "list": _list,
    "status": _job_status,
    "logs": _logs,
    "stop": _stop,
    "delete": _delete,
}
