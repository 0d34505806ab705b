"""Progress bars of ctx.get(refs, progress=...) and fray.as_completed(refs, progress=...)."""

from __future__ import annotations

import sys

import pytest

import fray
from fray.testing import workloads as h


@pytest.fixture
def ctx():
    with fray.init("in_memory") as ctx:
        yield ctx


def test_get_with_progress_counts_done_and_failed(ctx: fray.JobContext, capsys: pytest.CaptureFixture[str]) -> None:
    refs = [ctx.create_task(h.add, args=(i, 1)) for i in range(10)]
    assert ctx.get(refs, progress="always") == list(range(1, 11))
    assert "10/10" in capsys.readouterr().err
    failing = [ctx.create_task(h.add, args=(1, 1)), ctx.create_task(h.raise_value_error, args=("bad",))]
    with pytest.raises(ValueError, match="bad"):
        ctx.get(failing, progress="always")
    assert "failed=1" in capsys.readouterr().err


def test_text_counter_without_tqdm(
    ctx: fray.JobContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now fails
    refs = [ctx.create_task(h.add, args=(i, 1)) for i in range(5)] + [ctx.create_task(h.raise_value_error, args=("x",))]
    assert len(list(fray.as_completed(refs, progress="always"))) == 6
    err = capsys.readouterr().err
    assert "6/6 done, 1 failed" in err


def test_nothing_on_a_non_terminal_unless_always(ctx: fray.JobContext, capsys: pytest.CaptureFixture[str]) -> None:
    refs = [ctx.create_task(h.add, args=(i, 1)) for i in range(3)]
    assert ctx.get(refs, progress=True) == [1, 2, 3]  # pytest's captured stderr is not a terminal
    assert list(fray.as_completed(refs, progress=True)) == refs
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="progress"):
        ctx.get(refs, progress="yes")  # type: ignore[arg-type]
