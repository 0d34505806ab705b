"""/tmp is shared by every user of the machine (issue 29, item 6): another user's files planted where a monarch
driver looks for its dead predecessors' private directories are neither opened through, blocked on, nor read
without end; only this user's own directories are reclaimed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fray_monarch.core.tempdirs import OWNER_FILE, PRIVATE_PREFIX, reclaim_private_dirs

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="planting files as another user needs root (setpriv)")

# As another user: a directory whose owner file is a FIFO, one whose owner file links to /dev/zero, one with no
# owner file, and a link to / named like a private directory.
PLANT = """
import os, sys
base = sys.argv[1]
for name, kind in (("fifo0001", "fifo"), ("zero0002", "zero"), ("none0003", "none")):
    path = os.path.join(base, "fray-m" + name)
    os.mkdir(path, 0o700)
    owner = os.path.join(path, "owner")
    if kind == "fifo":
        os.mkfifo(owner)
    elif kind == "zero":
        os.symlink("/dev/zero", owner)
os.symlink("/", os.path.join(base, "fray-mlink0004"))
"""


@as_root
def test_another_users_planted_files_neither_hang_nor_are_followed() -> None:
    base = Path(tempfile.mkdtemp(prefix="fray-test-shared-", dir="/tmp"))  # /tmp itself: others reach it
    try:
        base.chmod(0o1777)
        _reclaim_among_planted(base)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def _reclaim_among_planted(base: Path) -> None:
    planted = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", PLANT, str(base)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert planted.returncode == 0, planted.stderr
    mine = base / f"{PRIVATE_PREFIX}dead0001"  # a private directory of ours whose process is gone
    mine.mkdir(mode=0o700)
    (mine / OWNER_FILE).write_text("999999999-1-1")
    # in a child with a time limit: before the fix, the FIFO blocked open() for good and /dev/zero read without end
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from fray_monarch.core.tempdirs import reclaim_private_dirs as r; print(r({str(base)!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-2000:]
    assert not mine.exists()
    left = sorted(os.listdir(base))
    assert left == sorted(f"{PRIVATE_PREFIX}{n}" for n in ("fifo0001", "zero0002", "none0003", "link0004")), left
    assert os.path.isdir("/usr"), "nothing was removed through the link to /"
    assert reclaim_private_dirs(str(base)) == 0
