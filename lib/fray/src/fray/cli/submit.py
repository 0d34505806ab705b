"""`fray job submit` and `fray run`: start a job and, unless told not to, follow its log until it ends."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, cast

from fray.cli.common import CommandError, exit_status, open_cluster, say
from fray.cluster_context import ClusterContext
from fray.host import settings
from fray.jobs.elastic import parse_replicas
from fray.jobs.policy import JobPolicy
from fray.runtime.capabilities import Capability
from fray.types import RuntimeEnv


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


def _env_of(pairs: Sequence[str], files: Sequence[str]) -> RuntimeEnv | None:
    """The job's variables: `--env K` (K's value in this command's environment), `--env K=V`, and the K=V lines of
    each `--env-file` (blank lines and # comments skipped). A K=V on the command line is warned about: this
    process's argv is readable by every user of the machine (/proc/PID/cmdline, ps) while it runs."""
    env: dict[str, str] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise CommandError(f"--env-file {path}: {exc.strerror or exc}", 2) from None
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise CommandError(f"--env-file {path}, line {number}: K=V expected, got {line!r}", 2)
            env[key.strip()] = value
    in_argv = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key:
            raise CommandError(f"--env takes K (its value from this environment) or K=V, got {pair!r}", 2)
        if sep:
            in_argv.append(key)
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
        else:
            raise CommandError(f"--env {key}: {key} is not set in this environment (export it, or use K=V)", 2)
    if in_argv:
        names = ", ".join(in_argv)
        say(
            f"warning: the value of {names} is in this command's arguments, which every user of this machine can "
            f"read while it runs (ps, /proc/PID/cmdline); for a secret, pass --env {in_argv[0]} (the value from "
            "your environment) or --env-file PATH"
        )
    return RuntimeEnv(env=env) if env else None


def _resources_of(args: argparse.Namespace) -> dict[str, float] | None:
    """Each rank's resources from --cpus, --gpus, --memory and --resource K=V."""
    out: dict[str, float] = {}
    for key, value in (("CPU", args.cpus), ("GPU", args.gpus), ("memory", args.memory)):
        if value is not None:
            out[key] = float(value)
    for pair in args.resource:
        key, sep, value = pair.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise CommandError(f"--resource takes NAME=QUANTITY, got {pair!r}", 2)
    return out or None


def _callable_of(spec: str, working_dir: str | None) -> Callable[..., Any]:
    """MODULE:FUNCTION, imported here (from the working directory first) to be sent to the job by value or name."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise CommandError(f"--call takes MODULE:FUNCTION, e.g. --call train:main, got {spec!r}", 2)
    where = os.path.abspath(working_dir or os.getcwd())
    if where not in sys.path:
        sys.path.insert(0, where)
    try:
        found: Any = importlib.import_module(module_name)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise CommandError(f"--call {spec}: {exc} (looked in {where} and the installed packages)", 2) from None
    if not callable(found):
        raise CommandError(f"--call {spec}: {type(found).__name__} is not callable", 2)
    return cast(Callable[..., Any], found)


def _follow_hint(args: argparse.Namespace, job_id: str) -> str:
    where = f" --backend {args.backend}" if args.backend else ""
    where += f" --address {args.address}" if getattr(args, "address", None) else ""
    return f"follow it with `fray job logs {job_id} --follow{where}`, stop it with `fray job stop {job_id}{where}`"


def _exit_codes(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(code) for code in text.split(",") if code.strip()]
    except ValueError:
        raise CommandError(f"{flag} takes exit codes separated by commas (e.g. 1,3,137), got {text!r}", 2) from None


def _replicas_of(text: str) -> int | tuple[int, int]:
    try:
        return parse_replicas(text)
    except ValueError as exc:
        raise CommandError(str(exc), 2) from None


def submit(args: argparse.Namespace, wait: bool) -> int:
    verb = "run" if args.command == "run" else "job submit"
    words = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    entrypoint: list[str] | Callable[..., Any]
    entrypoint = _callable_of(args.call, args.working_dir) if args.call else _command_of(args.cmd, verb)
    shape: dict[str, Any] = {
        "name": args.name,
        "if_exists": args.if_exists,
        "max_retries": args.retries,
        "replicas": _replicas_of(args.replicas),
        "resources": _resources_of(args),
        "placement": args.placement,
        "max_recoveries": args.recoveries,
        "retry_on_exit_codes": _exit_codes(args.retry_on_exit_codes, "--retry-on-exit-codes"),
        "no_retry_on_exit_codes": _exit_codes(args.no_retry_on_exit_codes, "--no-retry-on-exit-codes"),
        "stop_grace": args.grace,
    }
    if args.call:
        shape["args"] = tuple(words)
    if args.retries < 0:
        raise CommandError(f"--retries must be >= 0, got {args.retries}", 2)
    policy = ("max_retries", "max_recoveries", "retry_on_exit_codes", "no_retry_on_exit_codes", "stop_grace")
    try:  # budgets and grace that do not go together are a usage error, as the flags' own are
        JobPolicy.of(*(shape[k] for k in policy))
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc), 2) from None
    env = _env_of(args.env, args.env_file)
    if args.dashboard:  # (fray.dashboard: its driver starts its live page at fray.init and prints where)
        env = RuntimeEnv(env={**(env.env if env is not None else {}), settings.DASHBOARD.name: "1"})
    wait = wait and not getattr(args, "no_wait", False)
    stays = not wait or args.on_interrupt == "leave"  # the job must outlive this command
    what = "--no-wait" if not wait else "--on-interrupt leave"
    ctx: ClusterContext | None = None
    job_id: str | None = None
    with _Interrupts() as interrupts:
        try:
            ctx = open_cluster(args, what, persistent=stays)
            persistent = Capability.PERSISTENT_JOBS in ctx.capabilities
            if stays and not persistent:
                raise CommandError(f"{what}: {ctx.persistent_jobs_unavailable()}")
            # Where jobs can be reached from other commands, they are (detached); one waited for in "stop" mode
            # is tied to this process all the same: it ends when this command ends, however it ends.
            with interrupts.deferred():  # a Ctrl-C now is handled once the job id is known
                job_id = ctx.create_job(entrypoint, env=env, working_dir=args.working_dir, detached=persistent, **shape)
                if wait and args.on_interrupt == "stop":
                    ctx.tie_job(job_id)
            if not wait:
                print(job_id, flush=True)
                say(f"job {job_id} submitted; {_follow_hint(args, job_id)}")
                return 0
            on_interrupt = "stops it" if args.on_interrupt == "stop" else "leaves it running"
            say(f"job {job_id} submitted on {ctx.backend}; Ctrl-C {on_interrupt}")
            for piece in ctx.tail_job_logs(job_id):
                sys.stdout.write(piece)
                sys.stdout.flush()
            info = ctx.get_job(job_id)
            ctx.untie_job(job_id)
            detail = f" ({info.message})" if info.message else ""
            say(f"job {job_id} {info.status.value}{detail}")
            return exit_status(info)
        except _Interrupted as interrupted:
            interrupts.ignoring = True
            if ctx is None or job_id is None:
                say(f"interrupted ({interrupted}) before the job was submitted")
            elif args.on_interrupt == "stop" and wait:
                say(f"{interrupted}: stopping job {job_id}")
                ctx.stop_job(job_id)
                ctx.untie_job(job_id)
                say(f"job {job_id} {ctx.get_job(job_id).status.value}")
            else:
                say(f"{interrupted}: job {job_id} left running; {_follow_hint(args, job_id)}")
            return 128 + interrupted.signum
        finally:
            interrupts.ignoring = True  # shutting down is not to be cut short either
            if ctx is not None:
                ctx.shutdown()
