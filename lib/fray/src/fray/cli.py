"""The `fray` command.

fray backends                          which backends are known, installed, and their capabilities
fray capabilities                      the capabilities table (markdown) of the installed backends
fray run [--backend SPEC] -- CMD ...   run CMD as a job on SPEC's cluster, follow its log, exit with its status
fray doctor [--json] [--no-probes]     installed versions, shared memory and its bandwidth, each backend's state
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, available_backends, cluster, get_backend
from fray.types import JobStatus


def _backends() -> int:
    for name, where in sorted(available_backends().items()):
        try:
            backend = get_backend(name)
        except BackendNotAvailableError:
            hint = FIRST_PARTY[name][1] if name in FIRST_PARTY else "not importable"
            print(f"{name:12} not installed: {hint}")
            continue
        caps = sorted(c.value for c in getattr(backend, "capabilities", ()))
        print(f"{name:12} installed ({where}); capabilities: {', '.join(caps) or 'none declared'}")
    return 0


def capabilities_table() -> str:
    """A markdown table: one row per capability, one column per installed backend."""
    from fray.capabilities import Capability

    backends = {}
    for name in sorted(available_backends()):
        try:
            backends[name] = get_backend(name)
        except BackendNotAvailableError:
            continue
    lines = ["| capability | " + " | ".join(backends) + " |", "| --- |" + " --- |" * len(backends)]
    for cap in Capability:
        cells = ["yes" if cap in getattr(b, "capabilities", ()) else "**no**" for b in backends.values()]
        lines.append(f"| `{cap.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run(spec: str | None, command: Sequence[str], poll: float = 0.2) -> int:
    if not command:
        print("fray run: give a command after --, e.g. fray run -- python train.py", file=sys.stderr)
        return 2
    with cluster(spec) as jobs:
        job_id = jobs.create_job(list(command))
        print(f"fray: job {job_id} submitted", file=sys.stderr)
        shown = 0
        while True:
            info = jobs.get_job(job_id)
            logs = jobs.get_job_logs(job_id)
            sys.stdout.write(logs[shown:])
            sys.stdout.flush()
            shown = len(logs)
            if info.status.is_terminal:
                print(f"fray: job {job_id} {info.status.value}", file=sys.stderr)
                return 0 if info.status is JobStatus.SUCCEEDED else 1
            time.sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fray", description="Fray: one interface, several distributed engines.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list known backends and whether they are installed")
    sub.add_parser("capabilities", help="print the capabilities table of the installed backends (markdown)")
    run = sub.add_parser("run", help="run a command as a job and follow its log")
    run.add_argument("--backend", default=None, help="backend spec (default: FRAY_BACKEND, else in_memory)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    doctor = sub.add_parser("doctor", help="versions, shared memory, bandwidth probes and each backend's state")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--no-probes", action="store_true", help="skip the local bandwidth probes")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from fray.doctor import main as doctor_main

        return doctor_main(json_output=args.json, probes=not args.no_probes)
    if args.command == "backends":
        return _backends()
    if args.command == "capabilities":
        print(capabilities_table())
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return _run(args.backend, cmd)


if __name__ == "__main__":
    sys.exit(main())
