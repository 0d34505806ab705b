"""What fray loads code from is this user's alone to change: ~/.fray is 0700 whatever the umask, the socket
guard's library and every directory on the way to it are checked each time it is loaded (a group member of a
umask-002 site could otherwise swap the library every process of this user preloads), `active()` is true only for
a library that passes those checks, and a worker's import path entries are checked along their whole resolved
path, symbolic links included (fray_monarch.core.trust)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _sockets import PER_USER_GUARD, unguarded_env

from fray_monarch.core import import_path, trust


def _guard(home: Path, *args: str, umask: int = 0o022, preload: str = "") -> subprocess.CompletedProcess[str]:
    env = unguarded_env()
    env["HOME"] = str(home)
    if preload:
        env["LD_PRELOAD"] = preload
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o755)
    return path


def test_fray_home_is_private_whatever_the_umask(home: Path) -> None:
    done = _guard(home, *PER_USER_GUARD, umask=0o002)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == home / ".fray" / "lib"
    assert oct((home / ".fray").stat().st_mode & 0o777) == oct(0o700)
    assert oct((home / ".fray" / "lib").stat().st_mode & 0o777) == oct(0o700)
    # one an old umask left open is closed at the next load
    (home / ".fray").chmod(0o775)
    assert _guard(home, *PER_USER_GUARD).returncode == 0
    assert oct((home / ".fray").stat().st_mode & 0o777) == oct(0o700)


def test_the_library_is_refused_when_a_directory_on_its_way_is_writable_by_others(home: Path) -> None:
    assert _guard(home, *PER_USER_GUARD).returncode == 0
    home.chmod(0o775)  # a group member could rename ~/.fray and put a directory of theirs in its place
    done = _guard(home, *PER_USER_GUARD)
    assert done.returncode == 2, done.stdout
    assert f"others can write to {home} (mode 775)" in done.stderr and "chmod go-w" in done.stderr


def test_a_look_alike_library_does_not_count_as_the_guard(home: Path, tmp_path: Path) -> None:
    built = _guard(home, *PER_USER_GUARD)
    assert built.returncode == 0, built.stderr
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: whoever can write here can replace the file
    look_alike = shared / "guard.so"
    shutil.copy(built.stdout.strip(), look_alike)
    look_alike.chmod(0o755)
    probe = (
        "from fray_monarch import socket_guard\n"
        "print(socket_guard.active())\n"
        "try:\n    socket_guard.require(False)\nexcept Exception as exc:\n    print(exc)\n"
    )
    done = _guard(home, "-c", probe, preload=str(look_alike))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "False"
    assert f"preloaded a socket guard from {look_alike}, which is not to be trusted" in lines[1]
    assert _guard(home, "-c", probe, preload=built.stdout.strip()).stdout.splitlines() == ["True"]


def test_an_import_path_entry_is_checked_along_its_whole_resolved_path(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert import_path.untrusted_reason(str(mine)) is None
    open_dir = tmp_path / "open"  # writable by every user, not sticky
    open_dir.mkdir()
    open_dir.chmod(0o777)
    below = open_dir / "project"  # ours, but whoever writes open_dir can swap it
    below.mkdir(mode=0o755)
    assert f"others can write to {open_dir}" in (import_path.untrusted_reason(str(below)) or "")
    link = open_dir / "link"  # a link to a trusted directory, in a directory anyone can write
    link.symlink_to(mine)
    assert f"others can write to {open_dir}" in (import_path.untrusted_reason(str(link)) or "")
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    assert "others can write to" in (import_path.untrusted_reason(str(group)) or "")
    own_link = tmp_path / "own-link"  # our link, in our directory, to our directory: fine
    own_link.symlink_to(mine)
    assert import_path.untrusted_reason(str(own_link)) is None
    sticky = tmp_path / "sticky"  # as /tmp: others cannot rename what is ours there
    sticky.mkdir()
    sticky.chmod(0o1777)
    inside = sticky / "project"
    inside.mkdir(mode=0o755)
    assert trust.untrusted_reason(inside) is None


@pytest.mark.skipif(os.getuid() != 0, reason="a link of another user's needs root to make (chown)")
def test_a_link_of_another_users_is_not_followed_into_trust(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    link = tmp_path / "theirs"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)  # user nobody's link: it can point it elsewhere at will
    assert "is a link of another user's (uid 65534)" in (import_path.untrusted_reason(str(link)) or "")
