"""The `fray` command.

fray --version                         fray's version
fray backends                          which backends are known, installed, and their capabilities
fray capabilities [--results FILE]     the capabilities table (markdown) of the installed backends: as they
                                       declare them, or as a conformance run's results show them
fray job submit|list|status|logs|stop|delete ...   jobs (see fray.cli.commands)
fray run [--backend SPEC] -- CMD ...   run CMD as a job, follow its log, exit with its exit code (job submit)
fray cluster start|stop [--backend SPEC]           a cluster that outlives one command (ray, monarch)
fray status [--backend SPEC]           nodes with their total and free resources, and jobs
fray doctor [--json] [--no-probes]     installed versions, shared memory and its bandwidth, each backend's state
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, available_backends, get_backend
from fray.runtime.capabilities import Capability

if TYPE_CHECKING:
    from fray.backend import Backend


def _backends() -> int:
    for name, where in sorted(available_backends().items()):
        try:
            backend = get_backend(name)
        except BackendNotAvailableError:
            hint = FIRST_PARTY[name][1] if name in FIRST_PARTY else "not importable"
            print(f"{name:12} not installed: {hint}")
            continue
        have = set(backend.capabilities)
        caps = sorted(c.value for c in have)
        lacks = sorted(c.value for c in Capability if c.has_api and c not in have)
        print(
            f"{name:12} installed ({where}); capabilities: {', '.join(caps) or 'none declared'}"
            + (f"; lacks: {', '.join(lacks)}" if lacks else "")
        )
    return 0


def _installed() -> dict[str, Backend]:
    backends = {}
    for name in sorted(available_backends(registered=False)):  # (not one a test registered here)
        try:
            backends[name] = get_backend(name)
        except BackendNotAvailableError:
            continue
    return backends


def capabilities_table() -> str:
    """A markdown table: one row per capability, one column per installed backend, as the backends declare them."""
    backends = _installed()
    lines = ["| capability | " + " | ".join(backends) + " |", "| --- |" + " --- |" * len(backends)]
    for cap in Capability:
        cells = ["yes" if cap in b.capabilities else "**no**" for b in backends.values()]
        lines.append(f"| `{cap.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capabilities_table_from_results(*paths: Path) -> str:
    """The table as the conformance runs whose results are in `paths` (`--fray-capability-results`) showed it."""
    from fray.testing.capability_table import CapabilityResults, render_table

    declared = {name: backend.capabilities for name, backend in _installed().items()}
    return render_table(CapabilityResults.read(*paths), declared)


def main(argv: Sequence[str] | None = None) -> int:
    from fray import __version__
    from fray.cli.commands import add_commands, run_command

    parser = argparse.ArgumentParser(prog="fray", description="Fray: one interface, several distributed engines.")
    parser.add_argument("--version", action="version", version=f"fray {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list known backends and whether they are installed")
    caps = sub.add_parser("capabilities", help="print the capabilities table of the installed backends (markdown)")
    caps.add_argument(
        "--results",
        type=Path,
        action="append",
        metavar="FILE",
        help="build it from conformance runs' results (pytest --fray-capability-results=FILE; repeat for one file "
        "per backend) instead of the backends' declarations",
    )
    add_commands(sub)  # job, run, cluster, status
    doctor = sub.add_parser("doctor", help="versions, shared memory, bandwidth probes and each backend's state")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--no-probes", action="store_true", help="skip the local bandwidth probes")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from fray.cli.doctor import main as doctor_main

        return doctor_main(json_output=args.json, probes=not args.no_probes)
    if args.command == "backends":
        return _backends()
    if args.command == "capabilities":
        if args.results is None:
            print(capabilities_table())
            return 0
        try:
            print(capabilities_table_from_results(*args.results))
        except (OSError, ValueError) as exc:
            print(f"fray capabilities: {exc}", file=sys.stderr)
            return 2
        return 0
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
