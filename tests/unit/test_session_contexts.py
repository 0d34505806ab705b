"""The fray pytest plugin's session contexts: each is started by the first test that asks for it and shut down
after the last one that does, not at the end of the session (an engine's idle context costs CPU while later tests
run). Run as a child pytest on real in_memory contexts, as CI runs the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = """
from typing import Any

import fray

SEEN: dict[str, Any] = {}


def test_first_uses_the_job_context(fray_ctx: fray.JobContext) -> None:
    SEEN["ctx"] = fray_ctx
    assert "cluster" not in SEEN


def test_then_both(fray_ctx: fray.JobContext, fray_cluster: fray.ClusterContext) -> None:
    assert fray_ctx is SEEN["ctx"] and not fray_ctx.is_shut_down  # (one context until its last user)
    SEEN["cluster"] = fray_cluster


def test_then_the_cluster_alone(fray_cluster: fray.ClusterContext) -> None:
    assert SEEN["ctx"].is_shut_down, "the job context outlived its last test"
    assert fray_cluster is SEEN["cluster"] and not fray_cluster.is_shut_down


def test_last_uses_neither() -> None:
    assert SEEN["ctx"].is_shut_down
    assert SEEN["cluster"].is_shut_down, "the cluster context outlived its last test"
"""


HELD_BY_A_MODULE_FIXTURE = """
from collections.abc import Iterator

import pytest

import fray


@pytest.fixture(scope="module")
def held(fray_session_ctx: fray.JobContext) -> Iterator[fray.JobContext]:
    yield fray_session_ctx
    assert not fray_session_ctx.is_shut_down, "shut down before a fixture that uses it"


def test_uses_it_through_a_module_fixture(held: fray.JobContext) -> None:
    assert held.get(held.put(1), timeout=60) == 1


def test_after_it() -> None:
    pass
"""


def _pytest(directory: Path, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fray-backend=in_memory", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return run.stdout + run.stderr


def test_each_session_context_is_shut_down_after_the_last_test_that_uses_it(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    out = _pytest(tmp_path, "test_cases.py")
    assert "4 passed" in out, out


def test_a_deselected_last_user_does_not_keep_a_context_open(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    out = _pytest(tmp_path, "test_cases.py", "-k", "not then_the_cluster_alone")
    assert "3 passed, 1 deselected" in out, out


def test_a_context_a_wider_fixture_uses_is_kept_until_that_fixture_ends(tmp_path: Path) -> None:
    (tmp_path / "test_held.py").write_text(HELD_BY_A_MODULE_FIXTURE)
    out = _pytest(tmp_path, "test_held.py")
    assert "2 passed" in out and "error" not in out, out
