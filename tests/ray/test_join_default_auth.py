"""Joining a Ray cluster whose nodes run without token auth (Ray's default for nodes started without a token
or with RAY_AUTH_MODE=disabled): fray's driver follows the cluster's mode. Before, fray switched the driver to
token mode whenever a token file existed; the cluster could then not reach the driver, and its ordinary actors
were never created ("Actor creation cancelled") while tasks worked. One cluster, started and stopped by a
subprocess (_default_auth_driver.py; one Ray connection per process). Plus the decision rule without a cluster.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

from _procs import run_driver

from fray_ray import _auth

DRIVER = Path(__file__).with_name("_default_auth_driver.py")


def test_driver_joins_a_cluster_without_token_auth_and_creates_actors_and_groups() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    out = run_driver(DRIVER, "default-auth driver", 240, env)
    assert out["probe"] == "disabled"  # the GCS answered a request without a token
    expected = {"driver_mode": "disabled", "actor": 2, "group": [0, 1], "task": 3}
    assert out["by_address"] == expected
    assert out["by_env"] == expected  # RAY_ADDRESS instead of address=
    assert out["mode_after"] is None  # what fray set for the connection is gone with it
    # joined twice: one warning, naming the address, who can use it and the fix; on loopback too (issue 29, item 7:
    # joining a token-less Ray on loopback was silent, though every user of the machine can run code on it)
    assert len(out["open_warnings"]) == 1, out["open_warnings"]
    warning = out["open_warnings"][0]
    assert out["address"] in warning and "token auth" in warning
    assert ("every user of this machine" in warning) == out["address_is_loopback"], warning
    # RAY_AUTH_MODE set by the user is theirs: kept, with a warning naming the consequence
    assert out["user_token_mode"] == "token"
    assert out["user_token_warned"] is True
    assert out["user_mode_after"] == "token"


# ---------------------------------------------------------------------------------------- the rule, no cluster
def _no_probe(address: str, timeout: float = 0.0) -> str | None:
    raise AssertionError("the cluster should not have been asked")


def test_a_cluster_fray_started_is_joined_in_token_mode_without_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(_auth, "cluster_auth_mode", _no_probe)
    monkeypatch.setattr(_auth, "_own_clusters", {"127.0.0.1:6390"})
    assert _auth.join_auth_mode("127.0.0.1:6390") == "token"


@pytest.mark.parametrize(
    "answer, token, expected",
    [("disabled", True, "disabled"), ("token", False, "token"), (None, True, "token"), (None, False, None)],
)
def test_a_joined_cluster_decides_the_mode(
    monkeypatch: pytest.MonkeyPatch, answer: str | None, token: bool, expected: str | None
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(_auth, "cluster_auth_mode", lambda address, timeout=0.0: answer)
    monkeypatch.setattr(_auth, "token_available", lambda: token)
    monkeypatch.setattr(_auth, "is_own_cluster", lambda address: False)
    assert _auth.join_auth_mode("10.0.0.5:6379") == expected


def test_the_users_mode_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(_auth, "_fray_auth_mode", None)  # fray did not write it
    monkeypatch.setattr(_auth, "cluster_auth_mode", _no_probe)
    assert _auth.join_auth_mode("10.0.0.5:6379") is None


def test_an_unreachable_or_ray_client_address_cannot_be_told() -> None:
    assert _auth.cluster_auth_mode("ray://10.0.0.5:10001") is None
    assert _auth.cluster_auth_mode("127.0.0.1:1", timeout=0.5) is None  # nothing listens on port 1


@pytest.fixture
def joining(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A join fray decides (no RAY_AUTH_MODE, not a head of fray's), no cluster warned about before, warnings
    caught."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(_auth, "_warned_open", set(), raising=False)
    monkeypatch.setattr(_auth, "is_own_cluster", lambda address: False)
    caplog.set_level(logging.WARNING, logger="fray_ray")


def _caught(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings about a cluster running code for anyone who reaches it."""
    return [r.getMessage() for r in caplog.records if "can run code on it as the user it runs as" in r.getMessage()]


def test_a_cluster_without_token_auth_beyond_loopback_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, joining: None
) -> None:
    monkeypatch.setattr(_auth, "cluster_auth_mode", lambda address, timeout=0.0: "disabled")
    assert _auth.join_auth_mode("10.0.0.5:6379") == "disabled"
    assert _auth.join_auth_mode("10.0.0.5:6379") == "disabled"
    warned = _caught(caplog)
    assert len(warned) == 1, warned
    assert "10.0.0.5:6379" in warned[0] and "token auth" in warned[0]


def test_a_cluster_without_token_auth_on_loopback_is_warned_about_naming_every_local_user(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, joining: None
) -> None:
    monkeypatch.setattr(_auth, "cluster_auth_mode", lambda address, timeout=0.0: "disabled")
    assert _auth.join_auth_mode("127.0.0.1:6379") == "disabled"
    warned = _caught(caplog)
    assert len(warned) == 1 and "127.0.0.1:6379" in warned[0] and "every user of this machine" in warned[0], warned


@pytest.mark.parametrize("address", ["127.0.0.1:6379", "10.0.0.5:6379"])
def test_a_cluster_with_token_auth_is_not_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, joining: None, address: str
) -> None:
    monkeypatch.setattr(_auth, "cluster_auth_mode", lambda address, timeout=0.0: "token")
    _auth.join_auth_mode(address)
    assert _caught(caplog) == []
