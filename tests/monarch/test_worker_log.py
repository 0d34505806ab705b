"""Where a worker process writes its output with log_to_driver=false: the context's log file, but only inside a
private directory of this user's and never through a symlink (on an attached host the driver's path may be
anyone's)."""

from __future__ import annotations

import os
from pathlib import Path

from fray_monarch.workers.runtime import open_private_log


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_the_log_is_written_only_in_a_private_directory_and_never_through_a_symlink(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert _target(open_private_log(str(private / "out.log"))) == str(private / "out.log")
    assert (private / "out.log").stat().st_mode & 0o777 == 0o600

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    assert _target(open_private_log(str(shared / "out.log"))) == os.devnull
    assert not (shared / "out.log").exists()

    victim = tmp_path / "victim"
    victim.write_text("mine")
    (private / "planted.log").symlink_to(victim)
    assert _target(open_private_log(str(private / "planted.log"))) == os.devnull
    assert victim.read_text() == "mine"

    assert _target(open_private_log(str(tmp_path / "missing" / "out.log"))) == os.devnull
