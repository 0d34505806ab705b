"""ctx.map: lazy and bounded over any iterable, ordered or as finished, a failure names its item."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.context import JobContext
from fray.testing import executor_workloads as w


class Counted:
    """An endless generator of ints that says how many it has handed out (so the test sees how far ahead the
    map read): an input that cannot be materialized at all."""

    def __init__(self) -> None:
        self.read = 0

    def __iter__(self) -> Iterator[int]:
        for i in itertools.count():
            self.read = i + 1
            yield i


def test_map_results_in_order(fray_ctx: JobContext) -> None:
    assert list(fray_ctx.map(abs, range(-5, 5), max_in_flight=3)) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
    assert list(fray_ctx.map(int, ["1", "2"])) == [1, 2]  # a class is called, as an executor's would be


def test_map_reads_an_endless_generator_lazily_with_at_most_max_in_flight_ahead(fray_ctx: JobContext) -> None:
    source = Counted()
    results = fray_ctx.map(abs, source, max_in_flight=4)
    assert source.read == 0  # nothing read before the caller asks
    taken = []
    for value in results:
        taken.append(value)
        # at most max_in_flight items submitted and not yet taken
        assert source.read - len(taken) <= 4
        if len(taken) == 40:
            break
    assert taken == list(range(40))
    results.close()  # type: ignore[attr-defined]


def test_map_as_finished_yields_the_fast_before_the_slow(fray_ctx: JobContext) -> None:
    order = list(fray_ctx.map(w.nap, [3.0, 0.0, 0.0, 0.0], ordered=False, max_in_flight=4))
    assert order[0] == 0.0 and order[-1] == 3.0, order
    assert sorted(order) == [0.0, 0.0, 0.0, 3.0]


def test_map_error_names_the_item_index(fray_ctx: JobContext) -> None:
    got = []
    with pytest.raises(ValueError, match="item 6 is bad") as info:
        for value in fray_ctx.map(w.fail_at_six, range(10), max_in_flight=3):
            got.append(value)
    assert got == [0, 2, 4, 6, 8, 10]  # everything before the failed item, in order
    assert info.value.item_index == 6  # type: ignore[attr-defined]
    with pytest.raises(ValueError) as unordered:
        list(fray_ctx.map(w.fail_at_six, range(10), ordered=False))
    assert unordered.value.item_index == 6  # type: ignore[attr-defined]


def test_map_passes_task_options_and_checks_its_arguments(fray_ctx: JobContext, tmp_path: Path) -> None:
    assert list(fray_ctx.map(abs, [-1, -2], name="absolutes", max_retries=0)) == [1, 2]
    with pytest.raises(ValueError, match="max_in_flight"):
        fray_ctx.map(abs, [1], max_in_flight=0)
    with pytest.raises(TypeError, match="callable"):
        fray_ctx.map(42, [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        fray_ctx.map(abs, 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        fray_ctx.map(abs, [1], not_an_option=1)
    with pytest.raises(ValueError, match="progress"):
        fray_ctx.map(abs, [1], progress="sometimes")  # type: ignore[arg-type]


def test_map_progress_counts_items_of_unknown_total(fray_ctx: JobContext, capsys: pytest.CaptureFixture[str]) -> None:
    assert list(fray_ctx.map(abs, iter([-1, -2, -3]), progress="always")) == [1, 2, 3]
    err = capsys.readouterr().err
    assert "3" in err and "fray.map" in err
