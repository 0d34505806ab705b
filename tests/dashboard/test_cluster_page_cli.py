"""`fray dashboard` without a job: the cluster's live page, served by the command itself until SIGTERM (or Ctrl-C).
The real `fray` entry point in a subprocess, real HTTP requests to the URL it prints."""

from __future__ import annotations

import http.client
import json
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _fray_cli import FRAY, run_fray, state_env

pytestmark = pytest.mark.timeout(180)


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The command's first line on stdout, waiting at most `timeout` seconds for it."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(timeout), f"no URL within {timeout} s"
    return proc.stdout.readline().strip()


def _get(port: int, path: str, cookie: str = "") -> tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_fray_dashboard_serves_the_clusters_page_until_sigterm(tmp_path: Path) -> None:
    with state_env(tmp_path) as env:
        done = run_fray(env, "job", "submit", "--", sys.executable, "-c", "import sys; sys.exit(3)")
        assert done.returncode == 3, done.stderr
        proc = subprocess.Popen([FRAY, "dashboard"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url = _first_line(proc, timeout=60)
            where = urlsplit(url)
            assert (where.scheme, where.hostname) == ("http", "127.0.0.1") and where.port is not None
            assert where.query.startswith("token=")
            status, headers, _ = _get(where.port, f"/?{where.query}")
            assert status == 303
            cookie, page = headers["Set-Cookie"].split(";")[0], headers["Location"]  # the page's own path
            assert _get(where.port, f"{page}api/state?since=0")[0] == 401  # not without it
            status, _, body = _get(where.port, f"{page}api/state?since=0", cookie)
            assert status == 200
            state = json.loads(body)
            assert state["backend"] == "in_memory"
            assert [(job["state"], job["exit_code"]) for job in state["jobs"]] == [("FAILED", 3)]
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 0, stderr
            assert "serving until Ctrl-C" in stderr
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", where.port), timeout=5).close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_fray_dashboard_ends_on_ctrl_c_with_exit_0(tmp_path: Path) -> None:
    with state_env(tmp_path) as env:
        proc = subprocess.Popen([FRAY, "dashboard"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert _first_line(proc, timeout=60).startswith("http://127.0.0.1:")
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 0, stderr
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
