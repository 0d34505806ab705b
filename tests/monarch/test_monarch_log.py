"""Monarch 0.7's own log, `/tmp/<user>/monarch_log.log`, opened by name whatever TMPDIR says: another user who made
`/tmp/<user>` first could plant a FIFO there (every Monarch import of the victim hangs) or a symlink (the victim's
Monarch appends to a file of the attacker's choosing), and read the log. fray makes that directory private before
Monarch is imported, and refuses to start, naming the path, when someone else's directory is in the way.

The victim is user games (uid 5, its own passwd name, as Monarch uses it), the attacker user nobody (setpriv)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

VICTIM, VICTIM_GID, ATTACKER = 5, 60, 65534
VICTIM_DIR = Path("/tmp/games")
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="acting as two other users needs root (setpriv)")


def _as(uid: int, gid: int, code: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MONARCH_LOG_SUFFIX")}
    env["HOME"] = str(home)
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=home,
    )


@pytest.fixture()
def home(tmp_path: Path) -> Iterator[Path]:
    """The victim's home; /tmp/games is removed before and after (no one else's test uses user games)."""
    shutil.rmtree(VICTIM_DIR, ignore_errors=True)
    os.chmod(tmp_path, 0o755)
    victim_home = tmp_path / "home"
    victim_home.mkdir(mode=0o700)
    os.chown(victim_home, VICTIM, VICTIM_GID)
    yield victim_home
    shutil.rmtree(VICTIM_DIR, ignore_errors=True)


IMPORT = "import fray_monarch.core.runtime; print('imported')"


def test_a_directory_another_user_made_first_is_refused_and_named(home: Path) -> None:
    planted = _as(
        ATTACKER,
        ATTACKER,
        f"import os; os.mkdir({str(VICTIM_DIR)!r}, 0o777); os.chmod({str(VICTIM_DIR)!r}, 0o777); "
        f"os.mkfifo({str(VICTIM_DIR / 'monarch_log.log')!r}, 0o666)",
        home,
    )
    assert planted.returncode == 0, planted.stderr
    try:
        done = _as(VICTIM, VICTIM_GID, IMPORT, home, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO planted in /tmp/<user> hung the victim's Monarch import")
    assert done.returncode != 0 and "imported" not in done.stdout
    assert f"Monarch 0.7 writes its log into {VICTIM_DIR}, which is a directory of uid {ATTACKER}" in done.stderr


def test_a_link_planted_in_the_victims_own_open_directory_is_refused(home: Path) -> None:
    VICTIM_DIR.mkdir(mode=0o777)  # the victim's own, made by an old Monarch under umask 000
    os.chmod(VICTIM_DIR, 0o777)
    os.chown(VICTIM_DIR, VICTIM, VICTIM_GID)
    target = home / "precious"
    target.write_text("mine\n")
    os.chown(target, VICTIM, VICTIM_GID)
    planted = _as(
        ATTACKER, ATTACKER, f"import os; os.symlink({str(target)!r}, {str(VICTIM_DIR / 'monarch_log.log')!r})", home
    )
    assert planted.returncode == 0, planted.stderr
    done = _as(VICTIM, VICTIM_GID, IMPORT, home)
    assert done.returncode != 0, done.stdout
    assert f"{VICTIM_DIR / 'monarch_log.log'}, which is not a regular file of yours" in done.stderr
    assert target.read_text() == "mine\n"


def test_otherwise_the_directory_is_made_private_and_the_log_unreadable_to_others(home: Path) -> None:
    done = _as(VICTIM, VICTIM_GID, IMPORT, home)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]
    info = os.lstat(VICTIM_DIR)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (VICTIM, 0o700)
    peek = _as(ATTACKER, ATTACKER, f"print(open({str(VICTIM_DIR / 'monarch_log.log')!r}).read())", home)
    assert peek.returncode != 0 and "PermissionError" in peek.stderr
    # a directory of the victim's that Monarch made with the umask is made private too
    os.chmod(VICTIM_DIR, 0o755)
    os.chmod(VICTIM_DIR / "monarch_log.log", 0o644)
    assert _as(VICTIM, VICTIM_GID, IMPORT, home).returncode == 0
    assert stat.S_IMODE(os.lstat(VICTIM_DIR).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(VICTIM_DIR / "monarch_log.log").st_mode) == 0o600
