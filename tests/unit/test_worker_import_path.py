"""in_memory's child processes (an SPMD member, a task with env vars) import from where their driver does (issue 29,
item 7). They are started with `python -m` in the driver's current directory, which put that directory first in
their sys.path even where the driver itself did not import from it: a driver script run from a directory every
user can write made them import a module another user put there (colorsys.py here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _planted_cwd import run_in_planted_cwd

as_root = pytest.mark.skipif(os.getuid() != 0, reason="planting files as another user needs root (setpriv)")


DRIVER = textwrap.dedent(
    """
    import fray
    from fray import RuntimeEnv, TaskOptions

    def where():
        import colorsys
        return colorsys.__file__

    class Member:
        def where(self):
            return where()

    ctx = fray.init("in_memory")
    task = ctx.get(ctx.create_task(where, options=TaskOptions(runtime_env=RuntimeEnv(env={"X": "1"}))), timeout=120)
    group = ctx.create_actor_group(Member, 2, distributed=True)
    members = ctx.get(group.where(), timeout=120)
    print("RESULT", task, *members, flush=True)
    fray.shutdown()
    """
)


@as_root
def test_a_module_planted_in_the_drivers_shared_current_directory_is_not_imported_by_child_processes(
    tmp_path: Path,
) -> None:
    imported, shared, stderr = run_in_planted_cwd(DRIVER, tmp_path)
    assert len(imported) == 3
    assert not [path for path in imported if path.startswith(shared)], f"imported {imported}"
    assert "planted colorsys imported" not in stderr


def test_a_driver_that_imports_from_its_current_directory_keeps_it_for_its_children(tmp_path: Path) -> None:
    (tmp_path / "mymodule_for_fray_test.py").write_text("VALUE = 7\n")
    code = textwrap.dedent(
        """
        import fray
        from fray import RuntimeEnv, TaskOptions

        def value():
            import mymodule_for_fray_test
            return mymodule_for_fray_test.VALUE

        ctx = fray.init("in_memory")
        options = TaskOptions(runtime_env=RuntimeEnv(env={"X": "1"}))
        print("RESULT", ctx.get(ctx.create_task(value, options=options), timeout=120))
        fray.shutdown()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )  # python -c: the current directory is on the driver's path
    assert "RESULT 7" in done.stdout, done.stderr[-3000:]
