"""The Ray auth token file (issue 20): whoever reads it can run code on every cluster started with it. The one
fray makes for the clusters it starts is private (0600 in a 0700 directory it makes); an existing one that other
users can read is warned about, naming the file and the fix. Real Ray's token loader, a HOME of the test's own."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

from fray_ray import _auth


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """HOME is a fresh directory, no token chosen by the environment; Ray's token cache is dropped after, so the
    rest of the session reads the real token again."""
    from ray._raylet import AuthenticationTokenLoader

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(tmp_path))
        for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            patch.delenv(name, raising=False)
        patch.setattr(_auth, "_fray_auth_mode", None)
        patch.setattr(_auth, "_warned_token_files", set(), raising=False)
        yield tmp_path
    AuthenticationTokenLoader.instance().reset_cache()


def test_the_token_fray_makes_is_private_to_its_user(home: Path) -> None:
    assert _auth.own_cluster_mode() == "token"
    token = home / ".ray" / "auth_token"
    assert _mode(home / ".ray") == 0o700
    assert _mode(token) == 0o600
    assert len(token.read_text()) == 64  # Ray's own format: 256 random bits in hex
    assert _auth.token_headers()  # and Ray's loader reads it


def test_a_token_made_in_an_existing_directory_is_private_too(home: Path) -> None:
    (home / ".ray").mkdir(mode=0o755)
    os.chmod(home / ".ray", 0o755)  # a ~/.ray Ray made earlier for something else: left as it is
    _auth.own_cluster_mode()
    assert _mode(home / ".ray" / "auth_token") == 0o600


def test_a_token_is_never_written_through_a_symlink(home: Path) -> None:
    (home / ".ray").mkdir()
    target = home / "elsewhere"
    (home / ".ray" / "auth_token").symlink_to(target)  # dangling: not a token, and not to be followed
    _auth.write_new_token()
    assert not target.exists()


def test_a_token_file_others_can_read_is_warned_about_once(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    (home / ".ray").mkdir()
    token = home / ".ray" / "auth_token"
    token.write_text("0" * 64)
    os.chmod(token, 0o644)
    with caplog.at_level(logging.WARNING, logger="fray_ray"):
        assert _auth.own_cluster_mode() == "token"  # used as it is
        _auth.token_headers()
    warned = [r.getMessage() for r in caplog.records if str(token) in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"chmod 600 {token}" in warned[0] and "other users" in warned[0]
    assert _mode(token) == 0o644  # fray does not change the user's file


def test_a_private_token_file_is_not_warned_about(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    (home / ".ray").mkdir(mode=0o700)
    token = home / ".ray" / "auth_token"
    token.write_text("0" * 64)
    os.chmod(token, 0o600)
    with caplog.at_level(logging.WARNING, logger="fray_ray"):
        assert _auth.token_available()
    assert not [r for r in caplog.records if "auth_token" in r.getMessage()]
