"""The user's Ray token goes only where it is asked for (issue 29, item 5): to a cluster whose Job API uses token
auth, or one fray started; never to a Job API without token auth (Ray's own client sends it only in token mode).
Real Ray heads on loopback: one with token auth, one without."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import fray
from fray_ray._auth import token_available
from fray_ray._head import job_client


def _head(monkeypatch: pytest.MonkeyPatch, mode: str | None) -> Iterator[str]:
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
