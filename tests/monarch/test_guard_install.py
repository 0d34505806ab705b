"""The socket guard comes built with fray-monarch (setup.py), is used only while it matches its source, is refused
clearly where LD_PRELOAD cannot name it, and a process the loader could not give it fails once, clearly, instead
of starting itself again for ever."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from _sockets import PER_USER_GUARD, unguarded_env

from fray_monarch import socket_guard


def _digest() -> str:
    return hashlib.sha256(socket_guard.SOURCE.read_bytes()).hexdigest()


def test_the_guard_built_at_install_is_the_one_preloaded() -> None:
    installed = socket_guard._installed(_digest())
    if installed is None:
        pytest.skip("fray-monarch was installed without its guard built (no C compiler then): built per user instead")
    assert installed.parent == socket_guard.SOURCE.parent and installed.name.startswith("_socket_guard.")
    assert socket_guard.library() == installed
    assert socket_guard._installed("0" * 64) is None  # built from another source: not used


def test_a_guard_path_with_a_space_is_refused_naming_why(tmp_path: Path) -> None:
    home = tmp_path / "my home"
    home.mkdir(mode=0o755)
    done = subprocess.run(
        [sys.executable, *PER_USER_GUARD],
        env={**unguarded_env(), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout
    assert "cannot be preloaded: LD_PRELOAD splits paths at spaces and colons" in done.stderr


def test_a_process_the_loader_could_not_give_the_guard_fails_once_saying_why(tmp_path: Path) -> None:
    junk = tmp_path / "_socket_guard.so"
    junk.write_bytes(b"not a library for this machine")
    junk.chmod(0o700)
    env = {**unguarded_env(), "LD_PRELOAD": str(junk), socket_guard.RESTARTED: "1"}
    code = "import fray; fray.init('monarch?procs=1')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "cannot be preloaded" in done.stderr  # (the loader's own word)
    assert "was started again under fray's socket guard" in done.stderr and "still runs without it" in done.stderr
    again = "from fray_monarch.socket_guard import restart_under_guard; restart_under_guard(['python'])"
    looped = subprocess.run([sys.executable, "-c", again], env=env, capture_output=True, text=True, timeout=120)
    assert looped.returncode != 0 and "still runs without it" in looped.stderr  # (no second start)
