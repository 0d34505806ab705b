"""`fray job list|status|logs|stop|delete`."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import webbrowser
from types import FrameType

from fray.cli.common import CommandError, as_dict, format_exit_code, format_time, open_cluster, say
from fray.jobs.plain_text import last_lines
from fray.types import JobInfo


def _list(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job list") as ctx:
        jobs = ctx.list_jobs()
    if args.json:
        print(json.dumps([as_dict(info) for info in jobs], indent=1, default=repr))
        return 0
    if not jobs:
        say("no jobs")
        return 0
    for line in job_table(jobs):
        print(line)
    return 0


def job_table(jobs: list[JobInfo]) -> list[str]:
    """`fray job list`'s lines: a header, then a job a line."""
    width = max(len(info.id) for info in jobs)
    named = max((len(info.name or "-") for info in jobs), default=4)
    # what a pending job waits for (create_job(after=...)): a column only when one does
    waits = {info.id: ", ".join(info.waiting_for) for info in jobs if info.waiting_for and not info.status.is_terminal}
    after = max([len("WAITS FOR"), *(len(text) for text in waits.values())])
    column = f"{'WAITS FOR':{after}}  " if waits else ""
    lines = [f"{'ID':{width}}  {'NAME':{named}}  {'STATUS':9}  ATTEMPTS  RANKS  {'SUBMITTED':19}  {column}ENTRYPOINT"]
    for info in jobs:
        entry = info.entrypoint if len(info.entrypoint) <= 60 else info.entrypoint[:57] + "..."
        waited = f"{waits.get(info.id) or '-':{after}}  " if waits else ""
        lines.append(
            f"{info.id:{width}}  {info.name or '-':{named}}  {info.status.value:9}  {len(info.attempts) or 1:8}  "
            f"{info.replicas:5}  {format_time(info.submission_time):19}  {waited}{entry}"
        )
    return lines


def _job_status(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job status") as ctx:
        info = ctx.get_job(args.job_id)
    if args.json:
        print(json.dumps(as_dict(info), indent=1, default=repr))
        return 0
    print(f"{info.id}: {info.status.value}" + (f" (name {info.name})" if info.name else ""))
    print(f"  entrypoint: {info.entrypoint}")
    times = (info.submission_time, info.start_time, info.end_time)
    print("  submitted: {}  started: {}  ended: {}".format(*map(format_time, times)))
    if info.exit_code is not None:
        print(f"  exit code: {format_exit_code(info.exit_code)}")
    if info.message:
        print(f"  message: {info.message}")
    if info.waiting_for:
        print(f"  {'waits for' if not info.status.is_terminal else 'waited for'}: {', '.join(info.waiting_for)}")
    if info.replicas > 1:
        print(f"  ranks: {info.replicas}")
    several = info.replicas > 1 or any((attempt.world_size or 1) > 1 for attempt in info.attempts)
    for attempt in info.attempts:
        how = f"exit code {format_exit_code(attempt.exit_code)}" if attempt.exit_code is not None else ""
        outcome = f" [{attempt.outcome}]" if attempt.outcome else ""  # its class: succeeded, failed, lost, stopped
        if several and attempt.world_size is not None:  # (an elastic job's may differ from one to the next)
            outcome += f" ({attempt.world_size} ranks)"
        print(f"  attempt {attempt.number}: {attempt.status.value} {how} {attempt.message}".rstrip() + outcome)
    if info.result is not None:
        print(f"  result: {info.result!r}")
    if info.error is not None:
        print(f"  error (rank {info.error.rank}): {info.error.type}: {info.error.message}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job logs") as ctx:
        if args.tail is not None and args.tail < 0:
            raise CommandError(f"--tail takes a number of lines >= 0, got {args.tail}", 2)
        if not args.follow:
            sys.stdout.write(ctx.get_job_logs(args.job_id, tail=args.tail))
            return 0
        pieces = iter(ctx.tail_job_logs(args.job_id))
        if args.tail is not None:  # the first piece is all the job wrote so far: its last lines, then what comes
            sys.stdout.write(last_lines(next(pieces, ""), args.tail))
            sys.stdout.flush()
        for piece in pieces:
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


def _retry(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job retry") as ctx:
        job = ctx.retry_job(args.job_id)
    print(job.id, flush=True)
    say(f"job {args.job_id} started again as {job.id}; follow it with `fray job logs {job.id} --follow`")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray job delete") as ctx:
        ctx.delete_job(args.job_id)
    say(f"job {args.job_id} deleted")
    return 0


def dashboard(args: argparse.Namespace) -> int:
    """`fray dashboard JOB [--open]`: the address of the live page a job's driver announced in its log (it runs
    with FRAY_DASHBOARD=1: `fray job submit --dashboard`). Without JOB: the cluster's page (cluster_page)."""
    from fray.dashboard import ANNOUNCED

    if args.job_id is None:
        return cluster_page(args)

    with open_cluster(args, "fray dashboard") as ctx:
        found = list(ANNOUNCED.finditer(ctx.get_job_logs(args.job_id)))
        status = ctx.get_job(args.job_id).status
    if not found:
        raise CommandError(
            f"job {args.job_id} has announced no live page: its driver starts one when it runs with FRAY_DASHBOARD=1 "
            "(fray job submit --dashboard ...), at fray.init()"
        )
    host, url = found[-1].group("host"), found[-1].group("url")
    if status.is_terminal:
        say(f"job {args.job_id} has ended ({status.value}): its live page ended with it")
    print(url)
    port = url.split(":")[2].split("/")[0]
    if host != socket.gethostname():
        say(f"the page is on host {host}, on its loopback only: forward it with  ssh -L {port}:127.0.0.1:{port} {host}")
    elif args.open:
        webbrowser.open(url)
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the page as Ctrl-C does


def cluster_page(args: argparse.Namespace) -> int:
    """`fray dashboard [--open]`: serves the cluster's live page from this process (its URL, with its token, on
    stdout) until Ctrl-C or SIGTERM, then closes it and exits 0."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with open_cluster(args, "fray dashboard") as ctx:
            url = ctx.dashboard()
            print(url, flush=True)
            say("the cluster's live page: serving until Ctrl-C (the URL holds its access token: keep it private)")
            if args.open:
                webbrowser.open(url)
            while True:
                signal.pause()  # (the page's server runs on its own thread; a signal's handler ends this)
    except KeyboardInterrupt:
        return 0  # (leaving the with: the context's shutdown closed the server)
    finally:
        signal.signal(signal.SIGTERM, previous)


JOB_VERBS = {
    "list": _list,
    "status": _job_status,
    "logs": _logs,
    "stop": _stop,
    "retry": _retry,
    "delete": _delete,
}
