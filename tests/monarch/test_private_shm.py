"""/dev/shm is shared by every user of the machine (issue 20, item 3): fray's store files live in a directory of
this user's, checked before use; a planted symlink or another user's file is never opened nor counted; names
cannot be guessed; only files of this user's whose owner is proven dead are reclaimed."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fray
from fray.errors import FrayError
from fray_monarch.data.arena import open_segment, pid_namespace, proc_tag, reclaim_dead_segments, shm_dir

MiB = 1024 * 1024
NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="making a file of another user's needs root")


def make_array(n: int) -> np.ndarray:
    return np.full(n, 3, dtype=np.uint8)


@pytest.fixture(scope="module")
def ctx() -> Iterator[fray.JobContext]:
    context = fray.init(f"monarch?procs=1&object_store_memory={256 * MiB}")
    try:
        yield context
    finally:
        fray.shutdown()


def _files_of(ctx: fray.JobContext) -> list[str]:
    return [n for n in os.listdir(shm_dir()) if n.startswith(f"fray.{ctx.ctl.key}.")]  # type: ignore[attr-defined]


def test_store_files_live_in_a_private_directory_under_names_that_cannot_be_guessed(ctx: fray.JobContext) -> None:
    ref = ctx.create_task(make_array, args=(4 * MiB,))
    kept = ctx.put(np.ones(4 * MiB, dtype=np.uint8))
    assert int(ctx.get(ref, timeout=60)[0]) == 3 and int(ctx.get(kept, timeout=60)[0]) == 1
    st = os.lstat(shm_dir())
    assert shm_dir() == f"/dev/shm/fray-{os.getuid()}"
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"fray.{ctx.ctl.key}.")]  # type: ignore[attr-defined]
    chunks = _files_of(ctx)
    assert len(chunks) >= 2, chunks  # the driver's and the worker's
    assert not [n for n in chunks if n.endswith(".lock")]  # (the directory is the lock: no file to leave behind)
    for name in chunks:
        owner, random = name.split(".")[3:]
        pid, start, namespace = owner.split("-")
        assert pid.isdigit() and start.isdigit() and namespace == pid_namespace()
        assert len(random) == 16 and int(random, 16) >= 0


def test_a_directory_that_is_not_private_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    symlinked = tmp_path / "a"
    symlinked.mkdir()
    (symlinked / f"fray-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(FrayError, match=f"fray-{os.getuid()} must be a directory.*symlink"):
        shm_dir(str(symlinked))
    open_to_all = tmp_path / "b"
    (open_to_all / f"fray-{os.getuid()}").mkdir(parents=True)
    os.chmod(open_to_all / f"fray-{os.getuid()}", 0o755)
    with pytest.raises(FrayError, match=r"mode 755.*chmod 700"):
        shm_dir(str(open_to_all))
    fresh = tmp_path / "c"
    fresh.mkdir()
    made = shm_dir(str(fresh))
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700


@as_root
def test_a_directory_another_user_made_first_is_avoided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 29: a pre-made /dev/shm/fray-<uid> stopped the backend for that user, with no way around it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # (the fallback's secret suffix is kept in ~/.fray)
    root = tmp_path / "shm"
    (root / f"fray-{os.getuid()}").mkdir(parents=True, mode=0o700)
    os.chown(root / f"fray-{os.getuid()}", NOBODY, NOBODY)
    with pytest.warns(UserWarning, match=f"owned by uid {NOBODY}.*store files go to"):
        first = shm_dir(str(root))
    assert os.path.basename(first).startswith(f"fray-{os.getuid()}-") and len(os.path.basename(first)) > 12
    st = os.lstat(first)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    suffix = (tmp_path / "home" / ".fray" / "shm-suffix").read_text()
    assert (
        first.endswith(suffix) and stat.S_IMODE(os.lstat(tmp_path / "home" / ".fray" / "shm-suffix").st_mode) == 0o600
    )
    # the fallback's name taken too (seen, say, before a reboot): a new suffix, which nobody could know
    other = tmp_path / "shm2"
    for name in (f"fray-{os.getuid()}", f"fray-{os.getuid()}-{suffix}"):
        (other / name).mkdir(parents=True, mode=0o700)
        os.chown(other / name, NOBODY, NOBODY)
    with pytest.warns(UserWarning):
        second = shm_dir(str(other))
    assert second != os.path.join(other, f"fray-{os.getuid()}-{suffix}") and os.lstat(second).st_uid == os.getuid()


def test_a_planted_symlink_is_never_opened(ctx: fray.JobContext, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 4096)
    planted = Path(shm_dir()) / f"fray.{ctx.ctl.key}.local.planted"  # type: ignore[attr-defined]
    planted.symlink_to(secret)
    try:
        with pytest.raises(OSError):
            open_segment(planted.name)
        with pytest.raises(FrayError):
            open_segment("../../" + planted.name)
    finally:
        planted.unlink()


@as_root
def test_another_users_files_are_neither_opened_nor_counted(ctx: fray.JobContext) -> None:
    """A huge (sparse) file of another user's with this context's prefix used to count against the budget:
    every stored put then failed with ObjectStoreFullError."""
    foreign = Path(shm_dir()) / f"fray.{ctx.ctl.key}.local.1-1-1.huge"  # type: ignore[attr-defined]
    with open(foreign, "wb") as f:
        f.truncate(1 << 40)
    os.chown(foreign, NOBODY, NOBODY)
    try:
        with pytest.raises(FrayError, match="not a store file of this user"):
            open_segment(foreign.name)
        ref = ctx.put(np.full(16 * MiB, 5, dtype=np.uint8))
        assert int(ctx.get(ctx.create_task(np.max, args=(ref,)), timeout=60)) == 5
    finally:
        foreign.unlink()


def test_reclaim_takes_only_files_of_this_users_proven_dead_owners() -> None:
    gone = subprocess.Popen(["sleep", "30"])
    tag = proc_tag(gone.pid)
    gone.kill()
    gone.wait()
    ours = pid_namespace()
    directory = Path(shm_dir())
    names = {
        "dead": f"fray.zzreclaim.local.{tag}-{ours}.aa",
        "other namespace": f"fray.zzreclaim.local.{tag}-1.bb",
        "unknown namespace": f"fray.zzreclaim.local.{tag}-.cc",
        "alive": f"fray.zzreclaim.local.{proc_tag(os.getpid())}-{ours}.dd",
    }
    if os.getuid() == 0:
        names["another user's"] = f"fray.zzreclaim.local.{tag}-{ours}.ee"
    for what, name in names.items():
        (directory / name).write_bytes(b"")
        if what == "another user's":
            os.chown(directory / name, NOBODY, NOBODY)
    try:
        reclaim_dead_segments()
        left = {what for what, name in names.items() if (directory / name).exists()}
        assert left == set(names) - {"dead"}
    finally:
        for name in names.values():
            (directory / name).unlink(missing_ok=True)
