"""A driver run from a directory every user can write, where user nobody planted `colorsys.py` first: what the
import-path tests of every backend share (issue 29, item 7)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
PLANTED = "import sys; print('planted colorsys imported', file=sys.stderr)\n"


def run_in_planted_cwd(driver: str, tmp_path: Path) -> tuple[list[str], str, str]:
    """Run `driver` (a script that prints "RESULT <colorsys paths...>") with its current directory a 1777
    directory in /tmp holding nobody's colorsys.py; its own directory is private. Returns (the paths it printed,
    the planted directory, its stderr). Needs root (setpriv)."""
    shared = Path(tempfile.mkdtemp(prefix="fray-test-cwd-", dir="/tmp"))  # /tmp itself: others reach it
    try:
        shared.chmod(0o1777)  # as /tmp is: every user may add files
        planted = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c",
             f"open({str(shared / 'colorsys.py')!r}, 'w').write({PLANTED!r})"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        script = tmp_path / "driver.py"  # the driver's own directory (sys.path[0]) is private
        script.write_text(driver)
        done = subprocess.run(
            [sys.executable, str(script)], cwd=shared, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert result, done.stderr[-3000:]
        return result[0].split()[1:], str(shared), done.stderr
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(shared)], check=False)
