"""The capability table from the conformance suite's results, and the check that the docs agree with a run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fray.runtime.capabilities import Capability
from fray.testing.capability_table import (
    NO,
    UNTESTED,
    YES,
    CapabilityResults,
    disagreements,
    documented_table,
    render_table,
)

DOC = """intro
<!-- capabilities-table -->
| capability | one |
| --- | --- |
{rows}
<!-- /capabilities-table -->
after
"""


def _doc(**cells: str) -> str:
    rows = "\n".join(f"| `{cap.value}` | {cells.get(cap.value, NO)} |" for cap in Capability)
    return DOC.format(rows=rows)


def _results(complete: bool) -> CapabilityResults:
    results = CapabilityResults(expected=frozenset({"s::a", "s::b"}))
    results.mark_ran("one", "s::a")
    if complete:
        results.mark_ran("one", "s::b")
    results.record("one", "t::a[one]", "passed", [Capability.STREAMING])
    results.record("one", "t::b[one]", "lacking", [Capability.PROCESS_ISOLATION])
    return results


DECLARED = {"one": frozenset({Capability.STREAMING, Capability.MULTI_HOST})}


def test_a_cell_the_run_contradicts_is_named() -> None:
    problems = disagreements(documented_table(_doc(streaming=NO)), _results(complete=False), DECLARED)
    assert problems == ["`streaming` on one: the docs say '**no**', this run of the conformance suite shows 'yes'"]


def test_a_failed_case_is_named_with_its_cell() -> None:
    results = _results(complete=False)
    results.record("one", "t::c[one]", "failed", [Capability.STREAMING])
    problems = disagreements(documented_table(_doc(streaming=YES)), results, DECLARED)
    assert problems == ["`streaming` on one: the docs say 'yes' but its conformance cases failed: t::c[one]"]


def test_a_partial_run_compares_only_the_cells_it_touched() -> None:
    # multi_host is declared; the docs claim plain "yes", which only a complete run can contradict
    doc = documented_table(_doc(streaming=YES, multi_host=YES, detached_actors=YES))
    assert disagreements(doc, _results(complete=False), DECLARED) == []


def test_a_complete_run_shows_a_declared_capability_no_case_exercised() -> None:
    doc = documented_table(_doc(streaming=YES, multi_host=YES))
    problems = disagreements(doc, _results(complete=True), DECLARED)
    assert problems == [
        f"`multi_host` on one: the docs say 'yes', this run of the conformance suite shows {UNTESTED!r}"
    ]
    assert disagreements(documented_table(_doc(streaming=YES, multi_host=UNTESTED)), _results(True), DECLARED) == []


def test_a_context_narrower_than_its_backend_leaves_the_cell_untested() -> None:
    results = _results(complete=True)
    results.record("one", "t::d[one]", "lacking", [Capability.MULTI_HOST])  # declared by the backend
    assert disagreements(documented_table(_doc(streaming=YES, multi_host=UNTESTED)), results, DECLARED) == []


def test_backends_not_in_the_docs_are_not_compared() -> None:
    results = CapabilityResults()
    results.record("registered-by-a-test", "t::a", "passed", [Capability.STREAMING])
    assert disagreements(documented_table(_doc()), results, {}) == []


def test_the_table_is_rendered_from_complete_results_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="backend 'one' do not cover every capability case"):
        render_table(_results(complete=False), DECLARED)
    _results(complete=True).write(tmp_path / "r.json")
    table = render_table(CapabilityResults.read(tmp_path / "r.json"), DECLARED)
    assert documented_table(DOC.format(rows="\n".join(table.splitlines()[2:])))["one"] == {
        cap.value: {"streaming": YES, "multi_host": UNTESTED}.get(cap.value, NO) for cap in Capability
    }


CASE = """
from fray.testing import requires_capability


@requires_capability("streaming")
def test_streams(fray_ctx):
    pass
"""


def _run_plugin(tmp_path: Path, doc: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "backends.md").write_text(doc)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfray_capabilities_doc = backends.md\n")
    (tmp_path / "test_case.py").write_text(textwrap.dedent(CASE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRAY_", "PYTEST_"))}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fray-backend=in_memory"]
    command += [f"--fray-capability-results={tmp_path / 'results.json'}", "test_case.py"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_the_plugin_fails_a_run_that_contradicts_the_docs(tmp_path: Path) -> None:
    doc = DOC.format(rows="\n".join(f"| `{c.value}` | {NO} |" for c in Capability)).replace("one", "in_memory", 1)
    done = _run_plugin(tmp_path, doc)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert (
        "`streaming` on in_memory: the docs say '**no**', this run of the conformance suite shows 'yes'" in done.stdout
    )
    results = CapabilityResults.read(tmp_path / "results.json")
    assert results.cell("in_memory", Capability.STREAMING) == YES


def test_the_plugin_passes_a_partial_run_that_agrees(tmp_path: Path) -> None:
    # every other cell is wrong ("**no**" for what in_memory has), but this run touched only `streaming`
    rows = "\n".join(f"| `{c.value}` | {YES if c is Capability.STREAMING else NO} |" for c in Capability)
    done = _run_plugin(tmp_path, DOC.format(rows=rows).replace("one", "in_memory", 1))
    assert done.returncode == 0, done.stdout + done.stderr


def test_fray_capabilities_builds_the_table_from_results_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fray.cli import main
    from fray.errors import BackendNotAvailableError
    from fray.registry import FIRST_PARTY, get_backend

    installed = {}
    for name in FIRST_PARTY:
        try:
            installed[name] = get_backend(name).capabilities
        except BackendNotAvailableError:
            continue
    first = sorted(installed)[0]
    partial = CapabilityResults(expected=frozenset({"s::a"}))
    partial.record(first, "t::a", "passed", [Capability.STREAMING])
    partial.write(tmp_path / "partial.json")
    assert main(["capabilities", "--results", str(tmp_path / "partial.json")]) == 2
    assert "do not cover every capability case" in capsys.readouterr().err
    files = []
    for name in installed:  # one file per backend, as one run per backend writes them
        results = CapabilityResults(expected=frozenset({"s::a"}))
        results.mark_ran(name, "s::a")
        results.write(tmp_path / f"{name}.json")
        files += ["--results", str(tmp_path / f"{name}.json")]
    assert main(["capabilities", *files]) == 0
    table = documented_table(
        DOC.format(rows="").replace("| capability | one |\n| --- | --- |\n", capsys.readouterr().out)
    )
    assert sorted(table) == sorted(installed)
    for name, have in installed.items():  # nothing exercised: what the backend declares reads untested
        assert table[name] == {c.value: UNTESTED if c in have else NO for c in Capability}
