"""The job commands of `fray`: `fray job ...`, `fray run`, `fray cluster start|stop`, `fray status`.

fray job submit [--backend SPEC] [--address A] [--working-dir DIR] [--env K=V]... [--no-wait]
                [--on-interrupt stop|leave] -- CMD ...
fray job list|status ID|logs ID [--follow]|stop ID|delete ID   [--backend SPEC] [--address A] [--json]
fray run ... -- CMD ...                   an attached `fray job submit`
fray cluster start|stop [--backend SPEC] [--listen ADDRESS]
fray status [--backend SPEC] [--address A] [--json]

Each command is a process of its own, so a job must have a home that outlives the command that submitted it:
in_memory keeps jobs in the state directory (fray.state, fray.detached); ray talks to a Ray cluster by address
(--address, the spec's address, RAY_ADDRESS, or the head `fray cluster start --backend ray` recorded). A backend
without the persistent_jobs capability (monarch) runs attached jobs only, and the other commands say so.

Exit codes: a waited-for job's own exit code (killed or stopped by signal N: 128+N); 130 / 143 when the submit
itself gets SIGINT / SIGTERM; 1 for an error of fray's (unknown job, no cluster, missing capability); 2 for bad
usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from fray.backend import Backend, PersistentClusters
from fray.capabilities import Capability
from fray.context import ClusterContext
from fray.errors import FrayError
from fray.registry import DEFAULT_BACKEND, ENV_VAR, get_backend, parse_spec
from fray.state import state_dir
from fray.types import JobInfo, JobStatus, RuntimeEnv

__all__ = ["add_commands", "exit_status", "run_command"]


class CommandError(Exception):
    """An error to print as `fray: error: ...` (exit code 1, or `code`), without a traceback."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------- argument parsing
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
    parser.add_argument("--working-dir", default=None, help="the directory the job runs in (default: this one)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="an environment variable of the job (repeatable)"
    )
    if detachable:
        parser.add_argument(
            "--no-wait", action="store_true", help="print the job id and return: the job goes on (detached)"
        )
    parser.add_argument(
        "--on-interrupt",
        choices=("stop", "leave"),
        default="stop",
        help="on Ctrl-C (SIGINT) or SIGTERM: stop the job (default), or leave it running",
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
    status = verbs.add_parser("status", help="one job's status")
    status.add_argument("job_id")
    _cluster_options(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    logs = verbs.add_parser("logs", help="a job's output (stdout and stderr)")
    logs.add_argument("job_id")
    _cluster_options(logs)
    logs.add_argument("--follow", "-f", action="store_true", help="follow the output until the job ends")
    for verb, text in (("stop", "stop a job (it stays listed, STOPPED)"), ("delete", "stop a job and forget it")):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("job_id")
        _cluster_options(parser)
    _submit_options(sub.add_parser("run", help="run a command as a job and follow its log (fray job submit)"), False)
    cluster = sub.add_parser("cluster", help="start or stop a cluster that outlives this command (ray)")
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
    overview = sub.add_parser("status", help="nodes with their total and free resources, and jobs")
    _cluster_options(overview)
    overview.add_argument("--json", action="store_true", help="print JSON")


def run_command(args: argparse.Namespace) -> int:
    """Run a command added by add_commands; errors of fray's are printed, never raised."""
    try:
        if args.command == "run":
            return _submit(args, wait=True)
        if args.command == "job":
            return _JOB_VERBS[args.verb](args)
        if args.command == "cluster":
            return _cluster_start(args) if args.action == "start" else _cluster_stop(args)
        if args.command == "status":
            return _status(args)
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


# ---------------------------------------------------------------------- opening a cluster
def _resolve(args: argparse.Namespace) -> tuple[str, dict[str, str], Backend]:
    name, options = parse_spec(args.backend or os.environ.get(ENV_VAR) or DEFAULT_BACKEND)
    return name, options, get_backend(name)


def _lacks_persistence(name: str, what: str) -> CommandError:
    return CommandError(
        f"{what} needs jobs that another `fray` command can reach, and the {name!r} backend lacks that capability "
        f"({Capability.PERSISTENT_JOBS.value!r}): its jobs live in the processes of the program that submitted "
        f"them. Run the job attached (`fray job submit --backend {name} -- CMD`, or `fray run`), or use the "
        "in_memory or ray backend for jobs that outlive one command."
    )


def _open(args: argparse.Namespace, what: str, persistent: bool = True) -> ClusterContext:
    """The backend's ClusterContext for this command. `persistent`: the command needs jobs that outlive one
    command (a cluster by address on ray; the state directory on in_memory)."""
    name, options, backend = _resolve(args)
    if persistent and Capability.PERSISTENT_JOBS not in backend.capabilities:
        raise _lacks_persistence(name, what)
    if getattr(args, "address", None):
        options["address"] = args.address
    if "address" not in options and isinstance(backend, PersistentClusters):  # ray: RAY_ADDRESS, else its head
        found, why_not = backend.persistent_address()
        if found:
            options["address"] = found
        elif persistent:
            raise CommandError(f"{what}: no {name} cluster to talk to. {why_not}")
    return backend.cluster_context(**options)


# ---------------------------------------------------------------------- submit
class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Interrupts:
    """While active, SIGINT and SIGTERM raise _Interrupted in the main thread, once: after the first, further
    ones are ignored (stopping the job is not to be cut short). Inside `deferred()`, one that comes is raised
    when the block ends (a job being submitted is then known, and can be stopped)."""

    def __init__(self) -> None:
        self.ignoring = False
        self._deferring = False
        self._pending: int | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.ignoring or self._pending is not None:
            return
        if self._deferring:
            self._pending = signum
            return
        self.ignoring = True
        raise _Interrupted(signum)

    def __enter__(self) -> _Interrupts:
        self._previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending is not None and not self.ignoring:
            self.ignoring = True
            raise _Interrupted(self._pending)


def _command_of(raw: Sequence[str], verb: str) -> list[str]:
    command = list(raw[1:] if raw[:1] == ["--"] else raw)
    if not command:
        raise CommandError(f"give a command after --, e.g. fray {verb} -- python train.py", 2)
    return command


def _env_of(pairs: Sequence[str]) -> RuntimeEnv | None:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--env takes K=V, got {pair!r}", 2)
        env[key] = value
    return RuntimeEnv(env=env) if env else None


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


def _follow_hint(args: argparse.Namespace, job_id: str) -> str:
    where = f" --backend {args.backend}" if args.backend else ""
    where += f" --address {args.address}" if getattr(args, "address", None) else ""
    return f"follow it with `fray job logs {job_id} --follow{where}`, stop it with `fray job stop {job_id}{where}`"


def _say(text: str) -> None:
    print(f"fray: {text}", file=sys.stderr, flush=True)


def _submit(args: argparse.Namespace, wait: bool) -> int:
    verb = "run" if args.command == "run" else "job submit"
    command = _command_of(args.cmd, verb)
    env = _env_of(args.env)
    wait = wait and not getattr(args, "no_wait", False)
    stays = not wait or args.on_interrupt == "leave"  # the job must outlive this command
    what = "--no-wait" if not wait else "--on-interrupt leave"
    ctx: ClusterContext | None = None
    job_id: str | None = None
    with _Interrupts() as interrupts:
        try:
            ctx = _open(args, what, persistent=stays)
            persistent = Capability.PERSISTENT_JOBS in ctx.capabilities
            if stays and not persistent:
                raise CommandError(f"{what}: {ctx.persistent_jobs_unavailable()}")
            # Where jobs can be reached from other commands, they are (detached); one waited for in "stop" mode
            # is tied to this process all the same: it ends when this command ends, however it ends.
            with interrupts.deferred():  # a Ctrl-C now is handled once the job id is known
                job_id = ctx.create_job(command, env=env, working_dir=args.working_dir, detached=persistent)
                if wait and args.on_interrupt == "stop":
                    ctx.tie_job(job_id)
            if not wait:
                print(job_id, flush=True)
                _say(f"job {job_id} submitted; {_follow_hint(args, job_id)}")
                return 0
            on_interrupt = "stops it" if args.on_interrupt == "stop" else "leaves it running"
            _say(f"job {job_id} submitted on {ctx.backend}; Ctrl-C {on_interrupt}")
            for piece in ctx.tail_job_logs(job_id):
                sys.stdout.write(piece)
                sys.stdout.flush()
            info = ctx.get_job(job_id)
            ctx.untie_job(job_id)
            detail = f" ({info.message})" if info.message else ""
            _say(f"job {job_id} {info.status.value}{detail}")
            return exit_status(info)
        except _Interrupted as interrupted:
            interrupts.ignoring = True
            if ctx is None or job_id is None:
                _say(f"interrupted ({interrupted}) before the job was submitted")
            elif args.on_interrupt == "stop" and wait:
                _say(f"{interrupted}: stopping job {job_id}")
                ctx.stop_job(job_id)
                ctx.untie_job(job_id)
                _say(f"job {job_id} {ctx.get_job(job_id).status.value}")
            else:
                _say(f"{interrupted}: job {job_id} left running; {_follow_hint(args, job_id)}")
            return 128 + interrupted.signum
        finally:
            interrupts.ignoring = True  # shutting down is not to be cut short either
            if ctx is not None:
                ctx.shutdown()


# ---------------------------------------------------------------------- the other job verbs
def _time(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"


def _as_dict(info: JobInfo) -> dict[str, Any]:
    return {**dataclasses.asdict(info), "status": info.status.value}


def _list(args: argparse.Namespace) -> int:
    with _open(args, "fray job list") as ctx:
        jobs = ctx.list_jobs()
    if args.json:
        print(json.dumps([_as_dict(info) for info in jobs], indent=1))
        return 0
    if not jobs:
        _say("no jobs")
        return 0
    width = max(len(info.id) for info in jobs)
    print(f"{'ID':{width}}  {'STATUS':9}  {'SUBMITTED':19}  ENTRYPOINT")
    for info in jobs:
        entry = info.entrypoint if len(info.entrypoint) <= 60 else info.entrypoint[:57] + "..."
        print(f"{info.id:{width}}  {info.status.value:9}  {_time(info.submission_time):19}  {entry}")
    return 0


def _job_status(args: argparse.Namespace) -> int:
    with _open(args, "fray job status") as ctx:
        info = ctx.get_job(args.job_id)
    if args.json:
        print(json.dumps(_as_dict(info), indent=1))
        return 0
    print(f"{info.id}: {info.status.value}")
    print(f"  entrypoint: {info.entrypoint}")
    print(
        f"  submitted: {_time(info.submission_time)}  started: {_time(info.start_time)}  ended: {_time(info.end_time)}"
    )
    if info.exit_code is not None:
        print(f"  exit code: {info.exit_code}")
    if info.message:
        print(f"  message: {info.message}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    with _open(args, "fray job logs") as ctx:
        if not args.follow:
            sys.stdout.write(ctx.get_job_logs(args.job_id))
            return 0
        for piece in ctx.tail_job_logs(args.job_id):
            sys.stdout.write(piece)
            sys.stdout.flush()
    return 0


def _stop(args: argparse.Namespace) -> int:
    with _open(args, "fray job stop") as ctx:
        before = ctx.get_job(args.job_id).status
        ctx.stop_job(args.job_id)
        after = ctx.get_job(args.job_id).status
    _say(
        f"job {args.job_id} {after.value}" if not before.is_terminal else f"job {args.job_id} had ended: {after.value}"
    )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _open(args, "fray job delete") as ctx:
        ctx.delete_job(args.job_id)
    _say(f"job {args.job_id} deleted")
    return 0


_JOB_VERBS = {
    "submit": lambda args: _submit(args, wait=True),
    "list": _list,
    "status": _job_status,
    "logs": _logs,
    "stop": _stop,
    "delete": _delete,
}


# ---------------------------------------------------------------------- cluster start / stop, status
_LAUNCH_FLAGS = ("job", "hosts", "nodes", "partition", "time")


def _cluster_start(args: argparse.Namespace) -> int:
    name, options, backend = _resolve(args)
    options.update({flag: getattr(args, flag) for flag in _LAUNCH_FLAGS if getattr(args, flag, None) is not None})
    if not isinstance(backend, PersistentClusters):
        if Capability.PERSISTENT_JOBS in backend.capabilities:
            _say(f"the {name} backend needs no cluster: its jobs run on this machine (detached ones: {state_dir()})")
            return 0
        raise _lacks_persistence(name, "fray cluster start")
    record, started = backend.start_cluster(args.listen, **options)
    if not started:
        _say(f"a {name} cluster is running already (pid {record['pid']}): {record['address']}")
        return 0
    print(record["address"])
    _say(
        f"started a {name} cluster (pid {record['pid']}) at {record['address']}, recorded in {state_dir()}; "
        f"`fray job submit --backend {name} -- CMD` uses it, `fray cluster stop --backend {name}` stops it"
    )
    for line in record.get("notes", ()):
        _say(line)
    return 0


def _cluster_stop(args: argparse.Namespace) -> int:
    name, _, backend = _resolve(args)
    if not isinstance(backend, PersistentClusters):
        _say(f"the {name} backend has no cluster to stop")
        return 0
    record = backend.stop_cluster()
    if record is None:
        _say(f"no {name} cluster is recorded in {state_dir()}: nothing to stop")
    elif not record.get("running"):
        _say(f"the recorded {name} cluster (pid {record.get('pid')}) was not running; its record is removed")
    else:
        _say(f"stopped the {name} cluster at {record['address']}")
    return 0


def _amount(name: str, value: float) -> str:
    if "memory" in name:
        return f"{value / 2**30:.1f} GiB"
    return f"{value:g}"


def _status(args: argparse.Namespace) -> int:
    with _open(args, "fray status") as ctx:
        nodes = ctx.node_status()
        jobs = ctx.list_jobs()
        work = ctx.running_work()
        where = {"backend": ctx.backend, **ctx.describe()}
    if args.json:
        seen = {"nodes": nodes, "jobs": [_as_dict(info) for info in jobs], **(work or {})}
        print(json.dumps({**where, **seen}, indent=1))
        return 0
    print("  ".join(f"{key}: {value}" for key, value in where.items() if key != "address"))
    print(f"nodes: {len(nodes)}")
    for node in nodes:
        total, free = node.get("total", {}), node.get("free", {})
        parts = [
            f"{key} {_amount(key, free[key])} free of {_amount(key, qty)}"
            if key in free
            else f"{key} {_amount(key, qty)}"
            for key, qty in sorted(total.items())
        ]
        seen_at = [
            f"{key.replace('_', ' ')} {node[key]}" for key in ("address", "processes", "held_by") if node.get(key)
        ]
        print(f"  {node.get('node')}: " + ", ".join(parts) + ("  (" + ", ".join(seen_at) + ")" if seen_at else ""))
    if work is not None:
        for kind in ("tasks", "actors"):
            items = work.get(kind, [])
            print(f"{kind}: {len(items)} {'running' if kind == 'tasks' else 'alive'}")
            names: dict[str, int] = {}
            for item in items:
                label = str(item.get("class") or item.get("name") or "?")
                names[label] = names.get(label, 0) + 1
            for label, n in sorted(names.items(), key=lambda kv: -kv[1])[:10]:
                print(f"  {label} x{n}")
    counts: dict[str, int] = {}
    for info in jobs:
        counts[info.status.value] = counts.get(info.status.value, 0) + 1
    print(
        f"jobs: {len(jobs)}" + (" (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")" if jobs else "")
    )
    for info in jobs:
        if not info.status.is_terminal:
            print(f"  {info.id}  {info.status.value}  {info.entrypoint[:60]}")
    return 0
