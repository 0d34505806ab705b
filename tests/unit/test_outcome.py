"""fray.runtime.outcome: one completion type, k-of-n waits and a linear as_completed over it."""

from __future__ import annotations

import threading
import time

import pytest

from fray.runtime.outcome import Outcome, State, completed, first_failure, wait_for, when


def _later(seconds: float, action: object) -> None:
    threading.Timer(seconds, action).start()  # type: ignore[arg-type]


def test_settled_once_first_writer_wins_and_callbacks_run_once() -> None:
    outcome, seen = Outcome(), []
    remove = outcome.add_callback(lambda o: seen.append(o.value))
    gone = outcome.add_callback(lambda o: seen.append("removed"))
    gone()
    assert outcome.set_value(1) and not outcome.set_failure(ValueError("late"))
    assert (outcome.state, outcome.value, seen) == (State.VALUE, 1, [1])
    remove()  # harmless after the fact
    outcome.add_callback(lambda o: seen.append("at once"))
    assert seen == [1, "at once"]


def test_a_raising_callback_does_not_keep_the_outcome_from_the_others(caplog: pytest.LogCaptureFixture) -> None:
    told: list[str] = []

    def fails(_: Outcome) -> None:
        told.append("fails")
        raise RuntimeError("a broken callback")

    outcome = Outcome()
    outcome.add_callback(lambda _: told.append("first"))
    outcome.add_callback(fails)
    outcome.add_callback(lambda _: told.append("last"))
    with caplog.at_level("ERROR", logger="fray.runtime.outcome"):
        assert outcome.set_value(1)
    assert told == ["first", "fails", "last"]
    assert outcome.state is State.VALUE
    assert any("a broken callback" in (r.exc_text or str(r.exc_info)) for r in caplog.records)


def test_lose_turns_a_value_into_a_failure_without_telling_again() -> None:
    outcome, seen = Outcome(), []
    outcome.add_callback(lambda o: seen.append(o.state))
    outcome.set_value(b"x")
    outcome.lose(LookupError("owner died"))
    assert outcome.failed() and isinstance(outcome.error, LookupError) and seen == [State.VALUE]


def test_wait_for_k_of_n_and_on_the_first_failure() -> None:
    outcomes = [Outcome() for _ in range(4)]
    _later(0.05, lambda: outcomes[2].set_value(2))
    _later(0.1, lambda: outcomes[0].set_value(0))
    assert wait_for(outcomes, 2, timeout=30) == {0, 2}
    assert wait_for(outcomes, 4, timeout=0.05) == {0, 2}  # a timeout returns what is done
    _later(0.05, lambda: outcomes[3].set_failure(ValueError("x")))
    assert wait_for(outcomes, 4, timeout=30, stop_on_failure=True) == {0, 2, 3}
    assert first_failure(outcomes) == 3


def test_when_fires_once_and_cancel_stops_it() -> None:
    outcomes, fired = [Outcome(), Outcome()], []
    when(outcomes, 2, lambda: fired.append("both"))
    cancel = when(outcomes, 1, lambda: fired.append("cancelled"))
    cancel()
    outcomes[0].set_value(0)
    outcomes[1].set_value(1)
    assert fired == ["both"]
    when(outcomes, 2, lambda: fired.append("at once"))
    assert fired == ["both", "at once"]


def test_to_future_needs_no_thread() -> None:
    outcome = Outcome()
    before = threading.active_count()
    future = outcome.to_future(lambda o: o.value * 2)
    assert threading.active_count() == before and not future.done()
    outcome.set_value(21)
    assert future.result(timeout=0) == 42
    failing = Outcome()
    future = failing.to_future(lambda o: (_ for _ in ()).throw(o.error))
    failing.set_failure(KeyError("k"))
    with pytest.raises(KeyError):
        future.result(timeout=0)


def test_completed_yields_batches_in_input_order_and_is_linear() -> None:
    outcomes = [Outcome() for _ in range(3)]
    outcomes[1].set_value(1)
    it = completed(outcomes, timeout=30)
    assert next(it) == [1]
    outcomes[2].set_value(2)
    outcomes[0].set_value(0)
    assert next(it) == [0, 2]
    with pytest.raises(StopIteration):
        next(it)
    many = [Outcome() for _ in range(20000)]
    start = time.monotonic()
    for o in many:
        o.set_value(None)
    assert sum(len(batch) for batch in completed(many, timeout=30)) == 20000
    assert time.monotonic() - start < 30  # linear: a quadratic one takes minutes here


def test_completed_times_out_naming_what_is_left() -> None:
    with pytest.raises(TimeoutError, match="1 of 1 not complete"):
        list(completed([Outcome()], timeout=0.05))
