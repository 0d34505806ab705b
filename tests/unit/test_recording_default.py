"""Whether a job context records events (fray.telemetry.events.choose_recording): in_memory does not unless asked (its
spec's
`events` option or FRAY_EVENTS), a live page turns recording on and says so, and a timeline written while nothing
is recorded warns naming the fix. On a real in_memory context and its real page server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import fray
from fray.dashboard.job_page import JobPage
from fray.telemetry import events
from fray.telemetry.events import RECORDER, Kind, choose_recording, record_for_a_page


@pytest.fixture(autouse=True)
def _recording_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each case sees a process whose only contexts are its own: the choices of the contexts other tests keep
    alive in this process (the conformance suite's session contexts) are set aside, and restored after."""
    monkeypatch.delenv("FRAY_EVENTS", raising=False)
    monkeypatch.setattr(events, "_choices", set())
    was = RECORDER.enabled
    yield
    RECORDER.enabled = was


def _started(ctx: fray.JobContext) -> list[str]:
    """The names of the tasks whose start the job's events hold."""
    return [e.name for _, _, e in ctx.events().page().events if e.kind == Kind.TASK_START]


def _noop() -> None:
    return None


def test_in_memory_records_nothing_unless_asked() -> None:
    with fray.init("in_memory") as ctx:
        assert not RECORDER.enabled
        ctx.get(ctx.create_task(_noop))
        assert _started(ctx) == []
    with fray.init("in_memory?events=on") as ctx:
        assert RECORDER.enabled
        ctx.get(ctx.create_task(_noop))
        assert _started(ctx) == ["_noop"]


def test_fray_events_in_the_environment_is_the_default_and_the_spec_option_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FRAY_EVENTS", "1")
    with fray.init("in_memory"):
        assert RECORDER.enabled
    with fray.init("in_memory?events=off"):
        assert not RECORDER.enabled
    monkeypatch.setenv("FRAY_EVENTS", "0")
    choices = [choose_recording(True), choose_recording(False, True)]  # (FRAY_EVENTS=0 turns ray's and monarch's off)
    assert [c.on for c in choices] == [False, True]
    monkeypatch.delenv("FRAY_EVENTS")
    choices.append(choose_recording(True))
    assert choices[-1].on and RECORDER.enabled
    for choice in choices:
        choice.release()


def test_a_context_that_records_nothing_does_not_turn_off_another_s_recording() -> None:
    """Each context chooses for itself: the process records while one of its live contexts does (before, the
    context started last chose for the whole process, and an in_memory context turned a Ray context's off)."""
    with fray.init("in_memory?events=on") as recording:
        with fray.init("in_memory") as quiet:
            assert RECORDER.enabled
            quiet.get(quiet.create_task(_noop))
        assert RECORDER.enabled  # (the quiet one's shutdown leaves it on too)
        recording.get(recording.create_task(_noop))
        assert _started(recording).count("_noop") == 2
    with fray.init("in_memory") as quiet:
        assert not RECORDER.enabled  # (no context records now)
        url = quiet.dashboard()  # its page: it records from now on, until it shuts down
        assert url and RECORDER.enabled
        with fray.init("in_memory"):
            assert RECORDER.enabled


def test_a_live_page_turns_recording_on_and_says_since_when() -> None:
    with fray.init("in_memory") as ctx:
        ctx.get(ctx.create_task(_noop))  # before the page: not recorded
        note = record_for_a_page()
        assert RECORDER.enabled and "from when this page opened" in note and "events=on" in note
        ctx.get(ctx.create_task(_noop))
        state = JobPage(ctx, note).state(0)
        assert state["note"] == note
        assert state["totals"]["done"] == 1  # the task after the page opened
        assert _started(ctx) == ["_noop"]
        assert record_for_a_page() == ""  # on already: nothing to say


def test_dashboard_records_from_when_it_opened_unless_fray_events_0_forbids_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fray.init("in_memory") as ctx:
        url = ctx.dashboard()
        assert url.startswith("http://127.0.0.1:") and RECORDER.enabled
    monkeypatch.setenv("FRAY_EVENTS", "0")
    with fray.init("in_memory?events=off"):
        assert "FRAY_EVENTS=0" in record_for_a_page() and not RECORDER.enabled


def test_a_timeline_written_while_nothing_is_recorded_warns_naming_the_fix(tmp_path: Path) -> None:
    with fray.init("in_memory") as ctx:
        ctx.get(ctx.create_task(_noop))
        with pytest.warns(RuntimeWarning, match=r"records no events now .*in_memory\?events=on.*FRAY_EVENTS=1"):
            summary = ctx.timeline(tmp_path / "off.json")
        assert summary.tasks == 0 and json.loads((tmp_path / "off.json").read_text())["traceEvents"] is not None
    with fray.init("in_memory?events=on") as ctx:
        ctx.get(ctx.create_task(_noop))
        summary = ctx.timeline(tmp_path / "on.json")  # (no warning: pytest's filterwarnings would not hide one)
        assert summary.tasks == 1
