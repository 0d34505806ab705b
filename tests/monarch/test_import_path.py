"""A worker takes its driver's import path, but only entries it can trust on its own host (issue 29, item 7).
Before, the driver's current directory went to the front of every worker's sys.path whatever the driver itself
saw, on every host: a driver started in a directory every user can write made its workers import a module another
user put there (colorsys.py here) instead of the real one."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from _planted_cwd import run_in_planted_cwd

from fray_monarch.core import import_path

as_root = pytest.mark.skipif(os.getuid() != 0, reason="planting files as another user needs root (setpriv)")


DRIVER = textwrap.dedent(
    """
    import fray

    def where():
        import colorsys
        return colorsys.__file__

    ctx = fray.init("monarch?procs=1")
    print("RESULT", ctx.get(ctx.create_task(where), timeout=120), flush=True)
    fray.shutdown()
    """
)


@as_root
def test_a_module_planted_in_the_drivers_shared_current_directory_is_not_imported_by_its_workers(
    tmp_path: Path,
) -> None:
    imported, shared, stderr = run_in_planted_cwd(DRIVER, tmp_path)
    assert not imported[0].startswith(shared), f"a worker imported {imported[0]}, planted by another user"
    assert "planted colorsys imported" not in stderr


def test_the_driver_sends_its_own_view_and_workers_take_only_trusted_entries(tmp_path: Path) -> None:
    assert "" not in import_path.driver_import_path()  # (made absolute)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    everyones = tmp_path / "everyones"
    everyones.mkdir()
    everyones.chmod(0o777)
    missing = tmp_path / "missing"
    assert import_path.untrusted_reason(str(mine)) is None
    assert "others can write to" in (import_path.untrusted_reason(str(everyones)) or "")
    assert "does not exist" in (import_path.untrusted_reason(str(missing)) or "")
    before = list(sys.path)
    try:
        sys.path.insert(0, os.getcwd())  # as `python -m` starts a process
        left_out = import_path.take([str(mine), str(everyones), str(missing)])
        assert os.getcwd() not in sys.path  # not in the driver's view: gone
        assert sys.path[0] == str(mine) and str(everyones) not in sys.path and str(missing) not in sys.path
        assert [entry.split(" ")[0] for entry in left_out] == [str(everyones), str(missing)]
    finally:
        sys.path[:] = before
