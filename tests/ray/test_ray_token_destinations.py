"""The user's Ray token goes only to a cluster fray started (in this process, or recorded by `fray cluster start`)
or, when the user chose token mode (RAY_AUTH_MODE=token), anywhere, as Ray's own client sends it then; never to a
Job API without token auth, and never merely because a Job API asks for it (answers 401): a stale RAY_ADDRESS
whose port another user took would collect it. Real Ray heads on loopback, one with token auth and one without,
and a Job API look-alike run by user nobody that answers 401 and notes what it is sent."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fray
from fray.errors import FrayError
from fray_ray import _auth
from fray_ray._auth import token_available
from fray_ray._head import job_client


def _head(monkeypatch: pytest.MonkeyPatch, mode: str | None) -> Iterator[str]:
    # A user token exists, as on any machine where fray started a Ray: the heads below each have their own, so
    # whether another test of the run made the user's first is a matter of timing.
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    _auth.own_cluster_mode()
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    cluster = fray.cluster("ray?num_cpus=1")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # this process, from now on: as a user's would be
    try:
        yield str(cluster._head.address)  # type: ignore[attr-defined]
    finally:
        cluster.shutdown()


@pytest.fixture
def token_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _head(monkeypatch, None)  # fray starts its heads with token auth


@pytest.fixture
def open_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _head(monkeypatch, "disabled")


def _sends_token(client: object) -> bool:
    headers = {k.lower() for k in getattr(client, "_headers", {})}
    return bool(headers & {"authorization", "x-ray-authorization"})


def test_the_token_goes_to_a_cluster_that_asks_for_it(token_head: str) -> None:
    assert token_available()
    client = job_client(token_head)
    assert _sends_token(client) and client.list_jobs() == []


def test_the_token_never_goes_to_a_job_api_without_token_auth(open_head: str) -> None:
    assert token_available(), "a token exists here: the test is whether it is sent"
    client = job_client(open_head)
    assert not _sends_token(client), "the token was sent to a cluster that did not ask for it"
    assert client.list_jobs() == []
    assert os.environ.get("RAY_AUTH_MODE") is None


def test_a_token_sent_over_plain_http_beyond_loopback_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from fray_ray._head import _warn_if_plain_http

    with caplog.at_level("WARNING", logger="fray_ray"):
        _warn_if_plain_http("http://127.0.0.1:8265")
        _warn_if_plain_http("https://10.0.0.5:8265")
        assert not caplog.records
        _warn_if_plain_http("http://10.0.0.5:8265")
    assert "over plain http" in caplog.text and "10.0.0.5" in caplog.text


# As user nobody: an HTTP server on a loopback port that answers 401 to everything (as a Job API that wants a
# token does) and prints the token headers it was sent, "-" when none.
ASKS_FOR_TOKENS = """
import http.server
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        sent = self.headers.get("Authorization") or self.headers.get("X-Ray-Authorization") or "-"
        print("sent", sent, flush=True)
        self.send_response(401)
        self.send_header("Content-Length", "12")
        self.end_headers()
        self.wfile.write(b"Unauthorized")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print("port", server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def stranger() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    if os.getuid() != 0:
        pytest.skip("running a server as another user needs root (setpriv)")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FRAY_BACKEND")}
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", ASKS_FOR_TOKENS],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{proc.stdout.readline().split()[1]}", proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _heard(proc: subprocess.Popen[str]) -> list[str]:
    proc.kill()
    out = proc.communicate(timeout=30)[0]
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("sent ")]


def test_a_job_api_that_answers_401_gets_no_token_unless_token_mode_was_chosen(
    stranger: tuple[str, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    address, proc = stranger
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))  # no cluster recorded there
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    _auth.own_cluster_mode()  # (a token exists, as on any machine where fray started a Ray)
    assert token_available() and _auth.token_headers(), "a token is at hand: the test is whether it is sent"
    refused: Exception | None = None
    try:
        job_client(address)
    except Exception as exc:
        refused = exc
    heard = _heard(proc)
    leaked = sum(sent != "-" for sent in heard)  # (counted: a failure must not print the token)
    assert len(heard) > 0 and leaked == 0, f"the token went to another user's port in {leaked} requests"
    assert isinstance(refused, FrayError), refused
    assert "asks for a token; fray sends your Ray token" in str(refused) and "RAY_AUTH_MODE=token" in str(refused)


def test_with_token_mode_chosen_the_token_goes_where_the_user_sends_it(
    stranger: tuple[str, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, proc = stranger
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the user's choice (fray wrote no value there)
    with pytest.raises(Exception, match=r"(?i)auth"):  # the look-alike refuses it too
        job_client(address)
    assert sum(sent != "-" for sent in _heard(proc)) > 0
