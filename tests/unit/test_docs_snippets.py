"""Every fenced Python block in README.md and docs/ runs, so a snippet that fails fails CI.

A block runs in a fresh interpreter on the backend its code names (`fray.init("ray...")`,
`fray.cluster("monarch")`; a name in a comment does not count), else on in_memory. A block that needs what CI
cannot have (a remote cluster) starts with a visible comment, `# not run in CI: <why>`, and is only compiled.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tokenize
from io import StringIO
from pathlib import Path

import pytest

from fray.errors import BackendNotAvailableError
from fray.registry import get_backend

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = "# not run in CI:"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_NAMED = re.compile(r"fray\.(?:init|cluster)\(\s*[\"'](ray|monarch)")


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


BLOCKS = _blocks()


def _without_comments(code: str) -> str:
    """`code` with its comments blanked out (a comment may mention `fray.init("ray")` without calling it)."""
    lines = code.splitlines(keepends=True)
    for token in tokenize.generate_tokens(StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col] + "\n"
    return "".join(lines)


def test_a_backend_named_only_in_a_comment_is_not_the_blocks() -> None:
    commented = 'import fray\nctx = fray.init()  # fray.init("ray") names one\nprint("#", fray.init("monarch"))\n'
    assert _NAMED.search(commented) is not None
    found = _NAMED.search(_without_comments(commented))
    assert found is not None and found.group(1) == "monarch"
    assert _NAMED.search(_without_comments('ctx = fray.init()  # fray.init("ray") names one\n')) is None


def test_the_docs_have_snippets() -> None:
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_snippet_runs(where: str, code: str, tmp_path: Path) -> None:
    if code.lstrip().startswith(NOT_RUN):
        why = code.lstrip().splitlines()[0][len(NOT_RUN) :].strip()
        assert why, f"{where}: say why the block is not run"
        compile(code, where, "exec")
        return
    named = _NAMED.search(_without_comments(code))
    backend = named.group(1) if named else "in_memory"
    try:
        get_backend(backend)
    except BackendNotAvailableError:
        pytest.skip(f"{where} runs on {backend!r}, which is not installed here (make test installs it)")
    env = {**os.environ, "FRAY_BACKEND": backend, "FRAY_STATE_DIR": str(tmp_path / "state")}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, f"{where} failed on {backend}:\n{out.stdout}\n{out.stderr}"
