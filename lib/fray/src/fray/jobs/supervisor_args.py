"""The supervisor's command line (fray.jobs.supervisor), checked as create_job checks what it makes of it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fray.host import settings
from fray.jobs.call import CALL_VAR
from fray.jobs.elastic import parse_replicas
from fray.jobs.policy import JobPolicy
from fray.jobs.requests import ONE_NODE, PLACEMENTS

__all__ = ["parse_args"]


def parse_args(argv: Sequence[str], description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fray.jobs.supervisor", description=description)
    parser.add_argument(
        "--replicas", default="1", metavar="N|MIN:MAX", help="ranks to start (default 1); MIN:MAX with --placement"
    )
    parser.add_argument("--retries", type=int, default=0, help="times to run again after a failed attempt")
    parser.add_argument("--recoveries", type=int, default=None, help="times to run again after a lost attempt")
    parser.add_argument("--grace", type=float, default=None, help="seconds a rank has between SIGTERM and SIGKILL")
    parser.add_argument("--retry-on-exit-codes", default=None, metavar="C,..", help="retry only these failures")
    parser.add_argument("--no-retry-on-exit-codes", default=None, metavar="C,..", help="never retry these failures")
    parser.add_argument("--gpus-per-rank", type=int, default=0, help="GPUs each rank holds")
    parser.add_argument(
        "--call", default=None, metavar="LABEL", help=f"run the callable in ${CALL_VAR} in each rank (LABEL names it)"
    )
    parser.add_argument(
        "--placement",
        choices=(*(p for p in PLACEMENTS if p is not None), ONE_NODE),
        default=None,
        help="the ranks as a group over the nodes (node: on one node, each rank seeing its own GPUs)",
    )
    parser.add_argument("--rank-resources", default="{}", help="with --placement: each rank's resources (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if (args.call is not None) == bool(args.command):
        parser.error("give either --call or a command after --")
    if args.call is not None and not settings.JOB_CALL.is_set():
        parser.error(f"--call needs the call in ${CALL_VAR} (ClusterContext.create_job(fn) sets it)")
    try:
        args.replicas = parse_replicas(args.replicas)
    except ValueError as exc:
        parser.error(str(exc))
    if isinstance(args.replicas, tuple) and args.placement is None:
        parser.error("--replicas MIN:MAX goes with --placement (on one host, create_job counts the ranks that fit)")
    if args.gpus_per_rank < 0:
        parser.error("--gpus-per-rank must be >= 0")
    try:
        args.policy = JobPolicy.of(
            args.retries,
            args.recoveries,
            _codes(args.retry_on_exit_codes),
            _codes(args.no_retry_on_exit_codes),
            args.grace,
        )
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    return args


def _codes(text: str | None) -> list[int] | None:
    return None if text is None else [int(code) for code in text.split(",") if code.strip()]
