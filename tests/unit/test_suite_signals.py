"""The suite means the same wherever it runs: started with SIGINT ignored (a background job of a
non-interactive shell), its Ctrl-C cases still send their drivers a SIGINT they see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_IGNORING = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'pytest', *sys.argv[1:]])"
)


def test_the_ctrl_c_cases_pass_in_a_run_started_with_sigint_ignored() -> None:
    case = "tests/test_interrupts.py::test_ctrl_c_in_a_get_is_one_line_and_exit_status_130[in_memory]"
    done = subprocess.run(
        [sys.executable, "-c", _IGNORING, "-q", "-p", "no:cacheprovider", "-o", "addopts=", case],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
