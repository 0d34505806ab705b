"""The fray command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _fray(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fray.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_backends_lists_in_memory_with_capabilities() -> None:
    out = _fray("backends").stdout
    assert "in_memory" in out and "installed" in out and "cancel_running" in out


def test_run_follows_the_log_and_exits_with_the_job_exit_code(tmp_path: Path) -> None:
    env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path)}  # attached jobs are listed there too
    ok = _fray("run", "--backend", "in_memory", "--", sys.executable, "-c", "print('hello from the job')", env=env)
    assert ok.returncode == 0 and "hello from the job" in ok.stdout, ok.stderr
    failed = _fray("run", "--backend", "in_memory", "--", sys.executable, "-c", "raise SystemExit(4)", env=env)
    assert failed.returncode == 4 and "FAILED" in failed.stderr
    assert _fray("run", "--").returncode == 2


def test_help_names_every_backend_with_a_cluster_command() -> None:
    words = " ".join(_fray("--help").stdout.split())  # argparse wraps a command's help over lines
    entry = words[words.index("cluster start or stop") :][:120]
    assert "(ray)" not in entry and "(ray, monarch;" in entry, entry


def test_job_logs_are_plain_text_also_when_a_sequence_is_split_between_pieces() -> None:
    from fray.jobs.plain_text import plain, plain_pieces

    log = "View the dashboard at \x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m\n\x1b[33m(raylet)\x1b[0m x"
    assert plain(log) == "View the dashboard at http://127.0.0.1:8265 \n(raylet) x"
    for cut in range(len(log) + 1):
        assert "".join(plain_pieces([log[:cut], log[cut:]])) == plain(log)
    assert plain("so far \x1b[3") == "so far "  # a sequence cut at the end of what was read is left out
