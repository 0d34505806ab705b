"""The job commands of `fray`: `fray job ...`, `fray run`, `fray cluster start|stop`, `fray status`.

fray job submit [--backend SPEC] [--address A] [--working-dir DIR] [--env K[=V]]... [--env-file PATH]... [--no-wait]
                [--on-interrupt stop|leave] [--name NAME [--if-exists return|replace|refuse]] [--retries N]
                [--replicas N|MIN:MAX] [--cpus N] [--gpus N] [--memory BYTES] [--resource K=V]...
                [--placement pack|spread]
                (-- CMD ... | --call MODULE:FUNCTION [-- ARG ...])
fray job list|status JOB|logs JOB [--follow] [--tail N]|stop JOB|delete JOB   [--backend SPEC] [--address A] [--json]
                                          (JOB: an id, or a name for its latest run)
fray run ... -- CMD ...                   an attached `fray job submit`
fray cluster start|stop [--backend SPEC] [--listen ADDRESS]
fray status [--backend SPEC] [--address A] [--json]
fray dashboard JOB [--open]               the live page a job's driver announced (fray job submit --dashboard)
fray dashboard [--open]                   serve the cluster's live page (its jobs) until Ctrl-C

Each command is a process of its own, so a job must have a home that outlives the command that submitted it:
in_memory keeps jobs in the state directory (fray.host.state_dir, fray.jobs.detached); ray talks to a Ray cluster by
address (--address, the spec's address, RAY_ADDRESS, or the head `fray cluster start --backend ray` recorded). A backend
without the persistent_jobs capability (monarch) runs attached jobs only, and the other commands say so.

Exit codes: a waited-for job's own exit code (killed or stopped by signal N: 128+N); 130 / 143 when the submit
itself gets SIGINT / SIGTERM; 1 for an error of fray's (unknown job, no cluster, missing capability); 2 for bad
usage.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from fray.cli.cluster import cluster_start, cluster_stop, status
from fray.cli.common import CommandError
from fray.cli.jobs import JOB_VERBS, dashboard
from fray.cli.submit import submit
from fray.errors import FrayError

__all__ = ["add_commands", "run_command"]


def _cluster_options(parser: argparse.ArgumentParser, address: bool = True) -> None:
    parser.add_argument("--backend", default=None, help="backend spec (default: FRAY_BACKEND, else in_memory)")
    if address:
        parser.add_argument(
            "--address",
            default=None,
            help="the cluster to talk to (ray: its dashboard URL; default: the spec's address, RAY_ADDRESS, "
            "else the cluster `fray cluster start` started)",
        )


def _submit_options(parser: argparse.ArgumentParser, detachable: bool) -> None:
    _cluster_options(parser)
    parser.add_argument(
        "--working-dir",
        default=None,
        help="the directory the job runs in (default: this one, on this machine's cluster; a Ray cluster elsewhere "
        "gets only a directory named here uploaded)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K[=V]",
        help="an environment variable of the job (repeatable): K takes its value from this environment; K=V puts "
        "V in this command's arguments, readable by every user of the machine (ps): not for secrets",
    )
    parser.add_argument(
        "--env-file",
        action="append",
        default=[],
        metavar="PATH",
        help="environment variables of the job, one K=V a line (repeatable; # comments); --env wins",
    )
    if detachable:
        parser.add_argument(
            "--no-wait", action="store_true", help="print the job id and return: the job goes on (detached)"
        )
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="its driver starts its live page at fray.init() (FRAY_DASHBOARD=1): `fray dashboard JOB` gives it",
    )
    parser.add_argument(
        "--on-interrupt",
        choices=("stop", "leave"),
        default="stop",
        help="on Ctrl-C (SIGINT) or SIGTERM: stop the job (default), or leave it running",
    )
    shape = parser.add_argument_group("the job's shape (it then runs under fray.jobs.supervisor)")
    shape.add_argument("--name", default=None, help="its name: one live job has it (see --if-exists)")
    shape.add_argument(
        "--if-exists",
        choices=("return", "replace", "refuse"),
        default="return",
        help="with a live job of that --name: follow it (default), stop it and start anew, or fail",
    )
    shape.add_argument("--retries", type=int, default=0, help="run it again after a failed attempt, up to N times")
    shape.add_argument(
        "--recoveries", type=int, default=None, help="run it again after a lost (preempted) attempt, up to N times"
    )
    shape.add_argument("--retry-on-exit-codes", default=None, metavar="C,..", help="retry only failures with these")
    shape.add_argument("--no-retry-on-exit-codes", default=None, metavar="C,..", help="never retry failures with these")
    shape.add_argument("--grace", type=float, default=None, help="seconds a rank has between SIGTERM and SIGKILL")
    shape.add_argument(
        "--replicas",
        default="1",
        metavar="N|MIN:MAX",
        help="ranks to start, with RANK, WORLD_SIZE... set; MIN:MAX: as many as fit, at least MIN (elastic)",
    )
    shape.add_argument("--cpus", type=float, default=None, help="CPUs each rank holds")
    shape.add_argument("--gpus", type=int, default=None, help="GPUs each rank holds (its own CUDA_VISIBLE_DEVICES)")
    shape.add_argument("--memory", type=float, default=None, help="bytes of memory each rank holds")
    shape.add_argument("--resource", action="append", default=[], metavar="K=V", help="a custom resource per rank")
    shape.add_argument(
        "--placement",
        choices=("pack", "spread"),
        default=None,
        help="the ranks as a group over the cluster's nodes (default: on the job's host where they fit one node)",
    )
    shape.add_argument(
        "--call",
        default=None,
        metavar="MODULE:FUNCTION",
        help="run a Python function (importable from the working directory) instead of a command; the words "
        "after -- are its arguments (strings)",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")


def add_commands(sub: Any) -> None:
    """Add `job`, `run`, `cluster` and `status` to the `fray` parser's subcommands."""
    job = sub.add_parser("job", help="submit jobs, list them, follow their logs, stop and delete them")
    verbs = job.add_subparsers(dest="verb", required=True)
    _submit_options(verbs.add_parser("submit", help="run a command as a job (and follow its log)"), True)
    listing = verbs.add_parser("list", help="the jobs of the backend's cluster")
    _cluster_options(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    one = verbs.add_parser("status", help="one job's status")
    one.add_argument("job_id")
    _cluster_options(one)
    one.add_argument("--json", action="store_true", help="print JSON")
    logs = verbs.add_parser("logs", help="a job's output (stdout and stderr)")
    logs.add_argument("job_id")
    _cluster_options(logs)
    logs.add_argument("--follow", "-f", action="store_true", help="follow the output until the job ends")
    logs.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines (then follow)")
    for verb, text in (
        ("stop", "stop a job (it stays listed, STOPPED)"),
        ("retry", "start a finished job again, as it was submitted (a named job's next run)"),
        ("delete", "stop a job and forget it"),
    ):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("job_id")
        _cluster_options(parser)
    _submit_options(sub.add_parser("run", help="run a command as a job and follow its log (fray job submit)"), False)
    cluster = sub.add_parser(
        "cluster", help="start or stop a cluster that outlives this command (ray, monarch; in_memory needs none)"
    )
    actions = cluster.add_subparsers(dest="action", required=True)
    start = actions.add_parser("start", help="start a cluster and record it in the state directory")
    _cluster_options(start, address=False)
    start.add_argument("--listen", default="127.0.0.1", help="the address it listens on (default: loopback only)")
    launch = start.add_argument_group("hosts to launch (monarch; also spec options: --backend 'monarch?job=ssh&...')")
    launch.add_argument("--job", default=None, help="how: ssh (--hosts NAMES), slurm (--nodes N), process (--hosts N)")
    launch.add_argument("--hosts", default=None, help="host names to log in to (ssh), or a count (process)")
    launch.add_argument("--nodes", default=None, help="Slurm nodes to allocate")
    launch.add_argument("--partition", default=None, help="the Slurm partition")
    launch.add_argument("--time", default=None, help="the Slurm time limit, e.g. 00:30:00")
    _cluster_options(actions.add_parser("stop", help="stop the recorded cluster and its jobs"), address=False)
    page = sub.add_parser(
        "dashboard",
        help="the address of a job's live page (its driver ran with --dashboard); without JOB, serve the "
        "cluster's page until Ctrl-C",
    )
    page.add_argument("job_id", nargs="?", default=None, metavar="JOB", help="a job (id or name); none: the cluster")
    _cluster_options(page)
    page.add_argument("--open", action="store_true", help="open it in a web browser on this machine")
    overview = sub.add_parser("status", help="nodes with their total and free resources, and jobs")
    _cluster_options(overview)
    overview.add_argument("--json", action="store_true", help="print JSON")


def run_command(args: argparse.Namespace) -> int:
    """Run a command added by add_commands; errors of fray's are printed, never raised."""
    try:
        if args.command == "run":
            return submit(args, wait=True)
        if args.command == "job":
            return submit(args, wait=True) if args.verb == "submit" else JOB_VERBS[args.verb](args)
        if args.command == "cluster":
            return cluster_start(args) if args.action == "start" else cluster_stop(args)
        if args.command == "status":
            return status(args)
        if args.command == "dashboard":
            return dashboard(args)
        raise CommandError(f"unknown command {args.command!r}", 2)
    except CommandError as exc:
        print(f"fray: error: {exc}", file=sys.stderr)
        return exc.code
    except (FrayError, ValueError, TypeError) as exc:  # unknown job, bad spec or directory, missing capability
        print(f"fray: error: {exc}", file=sys.stderr)
        return 1
    except (ConnectionError, RuntimeError) as exc:  # the engine's: no cluster at that address, refused auth, ...
        print(f"fray: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:  # `fray job logs ID | head`: the reader has gone
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail too
        return 128 + signal.SIGPIPE
