"""The README's example runs and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs_on_in_memory() -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)  # type: ignore[union-attr]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "FRAY_BACKEND": "in_memory"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "285"


def test_example_pipeline_runs_on_in_memory() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pipeline.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "FRAY_BACKEND": "in_memory"},
    )
    assert out.returncode == 0, out.stderr
    assert "ok: statistics match" in out.stdout
