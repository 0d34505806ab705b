"""The documentation and its API reference build with warnings as errors (what `make docs` runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_docs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocstrings", reason="the docs tools come with the full install (fray-core[docs])")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "create_actor_group" in reference and "ObjectRefStream" in reference
