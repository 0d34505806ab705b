"""The capability table as the conformance suite's results show it, and its check against a documented table.

The suite's pytest plugin records, per backend and capability, the conformance cases tied to that capability
(`requires_capability`) that passed, failed, or were skipped because the backend lacks it, and the capabilities
`test_missing_capabilities_are_refused_by_name` saw refused (`CapabilityResults`). A cell is:

- `yes`: its cases passed (none failed);
- `**no**`: its cases were skipped for lack of it, or using it was refused with `UnsupportedFeatureError`;
- `yes (untested)`: the backend declares it but no conformance case exercises it here (several hosts; packages
  from an index; a test context narrower than its backend);
- failing: a case failed (never written to a table: the check reports it).

A run covers a cell when a case of it ran; `complete` says that every capability case of the suite ran for a
backend, so that a cell no case touched is known to be untested rather than left out of the run.

Kept free of pytest: `fray capabilities --results` uses it outside a test run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fray.runtime.capabilities import Capability

YES = "yes"
NO = "**no**"
UNTESTED = "yes (untested)"
FAILING = "failing"
TABLE_START = "<!-- capabilities-table -->"
TABLE_END = "<!-- /capabilities-table -->"


@dataclass
class CellEvidence:
    """What one run showed of one capability on one backend (test node ids)."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lacking: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def cell(self) -> str | None:
        if self.failed:
            return FAILING
        if self.passed:
            return YES
        if self.lacking or self.refused:
            return NO
        return None


@dataclass
class CapabilityResults:
    """Per backend: the evidence per capability, and which of the suite's capability cases ran."""

    evidence: dict[str, dict[Capability, CellEvidence]] = field(default_factory=dict)
    ran: dict[str, set[str]] = field(default_factory=dict)  # backend -> suite case ids ("module::function")
    expected: frozenset[str] = frozenset()  # the suite's capability cases, for `complete`

    def _cell(self, backend: str, capability: Capability) -> CellEvidence:
        return self.evidence.setdefault(backend, {}).setdefault(capability, CellEvidence())

    def record(self, backend: str, nodeid: str, outcome: str, capabilities: Iterable[Capability]) -> None:
        """`outcome`: passed, failed, lacking (skipped for the one capability given) or refused."""
        for capability in capabilities:
            getattr(self._cell(backend, capability), outcome).append(nodeid)

    def mark_ran(self, backend: str, case: str) -> None:
        self.ran.setdefault(backend, set()).add(case)

    def backends(self) -> list[str]:
        return sorted(set(self.evidence) | set(self.ran))

    def complete(self, backend: str) -> bool:
        return bool(self.expected) and self.expected <= self.ran.get(backend, set())

    def cell(self, backend: str, capability: Capability) -> str | None:
        """The run's cell, or None where no case of it ran."""
        found = self.evidence.get(backend, {}).get(capability)
        return found.cell() if found is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "expected": sorted(self.expected),
            "backends": {
                name: {
                    "complete": self.complete(name),
                    "ran": sorted(self.ran.get(name, set())),
                    "capabilities": {
                        cap.value: vars(ev) for cap, ev in sorted(self.evidence.get(name, {}).items(), key=_by_value)
                    },
                }
                for name in self.backends()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapabilityResults:
        results = cls(expected=frozenset(data.get("expected", ())))
        for name, entry in data.get("backends", {}).items():
            results.ran[name] = set(entry.get("ran", ()))
            for value, ev in entry.get("capabilities", {}).items():
                results.evidence.setdefault(name, {})[Capability(value)] = CellEvidence(**ev)
        return results

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def read(cls, *paths: Path) -> CapabilityResults:
        """The results of one or more runs (one backend each, say); a later file's backend replaces an earlier's."""
        results = cls()
        for path in paths:
            one = cls.from_json(json.loads(path.read_text()))
            results.expected |= one.expected
            for name in one.backends():
                results.evidence[name] = one.evidence.get(name, {})
                results.ran[name] = one.ran.get(name, set())
        return results


def _by_value(item: tuple[Capability, CellEvidence]) -> str:
    return item[0].value


def expected_cell(
    results: CapabilityResults, backend: str, capability: Capability, declared: frozenset[Capability]
) -> str | None:
    """The cell the results call for; for a complete run, a cell no case touched reads from the declaration.

    A context can lack what its backend declares (a Ray cluster context on a private head lacks persistent_jobs):
    cases skipped or refused there say nothing of the backend's capability, which stays untested."""
    cell = results.cell(backend, capability)
    if cell == NO and capability in declared:
        cell = None
    if cell is None and results.complete(backend):
        return UNTESTED if capability in declared else NO
    return cell


def render_table(results: CapabilityResults, declared: Mapping[str, frozenset[Capability]]) -> str:
    """The markdown table (one row per capability, one column per backend of `declared`) from a run's results.

    Raises ValueError naming the backend whose results do not cover every capability case, or the cell that failed.
    """
    for name in declared:
        if not results.complete(name):
            raise ValueError(
                f"the results of backend {name!r} do not cover every capability case of the conformance suite: run "
                "them all for it (pytest tests/test_conformance.py -m 'fray_capability or fray_refusals' "
                "--fray-capability-results=FILE)"
            )
    lines = ["| capability | " + " | ".join(declared) + " |", "| --- |" + " --- |" * len(declared)]
    for cap in Capability:
        cells = []
        for name, have in declared.items():
            cell = expected_cell(results, name, cap, have)
            if cell == FAILING:
                failed = results.evidence[name][cap].failed
                raise ValueError(f"`{cap.value}` on {name}: its conformance cases failed ({', '.join(failed)})")
            cells.append(cell or "")
        lines.append(f"| `{cap.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def documented_table(text: str) -> dict[str, dict[str, str]]:
    """backend -> capability value -> cell, from the table between the capabilities-table markers of `text`."""
    found = re.search(re.escape(TABLE_START) + r"\n(.*?)\n" + re.escape(TABLE_END), text, re.S)
    if found is None:
        raise ValueError(f"no table between {TABLE_START} and {TABLE_END}")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in found.group(1).strip().splitlines()]
    header, body = rows[0], rows[2:]
    table: dict[str, dict[str, str]] = {name: {} for name in header[1:]}
    for row in body:
        capability = row[0].strip("`")
        for name, cell in zip(header[1:], row[1:], strict=False):
            table[name][capability] = cell
    return table


def disagreements(
    documented: Mapping[str, Mapping[str, str]],
    results: CapabilityResults,
    declared: Mapping[str, frozenset[Capability]],
) -> list[str]:
    """Each cell where the documented table and this run disagree, named, with why.

    Only the backends that are columns of the table and ran here, and of those only the cells a case of this run
    touched (all of them where the run was complete): a run of one test file compares what it saw.
    """
    problems = []
    for name in results.backends():
        if name not in documented:
            continue
        have = declared.get(name, frozenset())
        for cap in Capability:
            cell = expected_cell(results, name, cap, have)
            if cell is None:
                continue
            doc = documented[name].get(cap.value)
            where = f"`{cap.value}` on {name}"
            if cell == FAILING:
                failed = ", ".join(results.evidence[name][cap].failed)
                problems.append(f"{where}: the docs say {doc!r} but its conformance cases failed: {failed}")
            elif doc is None:
                problems.append(f"{where}: the suite shows {cell!r} but the docs table has no such row")
            elif doc != cell:
                problems.append(f"{where}: the docs say {doc!r}, this run of the conformance suite shows {cell!r}")
    return problems
