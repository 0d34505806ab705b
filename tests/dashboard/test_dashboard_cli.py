"""The live page from outside the program: FRAY_DASHBOARD=1 starts it at fray.init() and prints its address on
stderr; `fray job submit --dashboard` runs a job that way, and `fray dashboard JOB` gives the page's address from
the job's log. Real processes, the real `fray` entry point, a real HTTP request to the page."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from _fray_cli import cli_env, run_fray, state_env

from fray.dashboard import ANNOUNCED

DRIVER = """
import sys, time, fray
ctx = fray.init("in_memory")
print(sum(ctx.get([ctx.create_task(abs, args=(-i,)) for i in range(10)])), flush=True)
stop = sys.argv[1] if len(sys.argv) > 1 else None
deadline = time.monotonic() + 60
while stop and time.monotonic() < deadline:
    try:
        open(stop).close()
        break
    except FileNotFoundError:
        time.sleep(0.05)
ctx.shutdown()
"""


def _answers(url: str) -> int:
    """The status of the page's first request (its token exchanged for a cookie: 303)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        return conn.getresponse().status
    finally:
        conn.close()


def test_fray_dashboard_1_starts_the_page_at_init_and_says_where(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**cli_env(tmp_path / "state"), "FRAY_DASHBOARD": "1"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "45"
    found = ANNOUNCED.search(out.stderr)
    assert found is not None, out.stderr
    assert found.group("url").startswith("http://127.0.0.1:") and "token=" in found.group("url")
    quiet = subprocess.run(
        [sys.executable, str(script)], env=cli_env(tmp_path / "state"), capture_output=True, text=True, timeout=60
    )
    assert ANNOUNCED.search(quiet.stderr) is None  # (off unless asked)


def test_fray_dashboard_gives_a_submitted_jobs_page(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    stop = tmp_path / "stop"
    with state_env(tmp_path) as env:
        submitted = run_fray(
            env, "job", "submit", "--dashboard", "--no-wait", "--", sys.executable, str(script), str(stop)
        )
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().splitlines()[-1]
        deadline = time.monotonic() + 60
        while True:
            found = run_fray(env, "dashboard", job)
            if found.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found.returncode == 0, found.stderr
        url = found.stdout.strip()
        assert _answers(url) == 303  # a live page, and this token opens it
        stop.touch()
        assert run_fray(env, "job", "logs", job, "--follow").returncode == 0
        ended = run_fray(env, "dashboard", job)
        assert ended.returncode == 0 and "has ended" in ended.stderr

        plain = run_fray(env, "job", "submit", "--", sys.executable, "-c", "print('no page')")
        assert plain.returncode == 0, plain.stderr
        none = run_fray(env, "dashboard", _last_job(env))
        assert none.returncode == 1 and "announced no live page" in none.stderr


def _last_job(env: dict[str, str]) -> str:
    listing = run_fray(env, "job", "list", "--json")
    jobs = json.loads(listing.stdout)
    return str(max(jobs, key=lambda j: j["submission_time"])["id"])
