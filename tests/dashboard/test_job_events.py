"""A cluster's jobs as job state events (fray.jobs.events) and as a Chrome trace (fray.telemetry.timeline): synthetic
JobInfo lists, with the times a cluster records (UNIX seconds)."""

from __future__ import annotations

from typing import Any

from fray.jobs.events import JOBS_LABEL, job_events
from fray.telemetry import timeline
from fray.telemetry.events import Kind
from fray.types import JobAttempt, JobInfo, JobStatus

T = 1_700_000_000.0  # a UNIX time in seconds

DONE = JobInfo("job-ok", JobStatus.SUCCEEDED, T, T + 1, T + 3, "python ok.py", exit_code=0)
FAILED = JobInfo("job-bad", JobStatus.FAILED, T + 2, T + 2.5, T + 4, "python bad.py", 3, "exited with code 3")
RETRIED = JobInfo(
    "train.1",
    JobStatus.SUCCEEDED,
    T + 1,
    T + 1.5,
    T + 9,
    "python -m fray.jobs.supervisor ...",
    0,
    name="train",
    attempts=(
        JobAttempt(1, JobStatus.FAILED, 1, T + 1.5, T + 4, "rank 0 exited with code 1"),
        JobAttempt(2, JobStatus.SUCCEEDED, 0, T + 4.5, T + 9),
    ),
)
RUNNING = JobInfo("job-run", JobStatus.RUNNING, T + 5, T + 6, None, "sleep 100")
PENDING = JobInfo("job-wait", JobStatus.PENDING, T + 7, None, None, "sleep 1")


def _states(jobs: list[JobInfo]) -> list[tuple[str | int, int, dict[str, Any]]]:
    return [(e.key, e.t, dict(e.data or {})) for e in job_events(jobs).events]


def test_each_job_gives_its_submission_attempts_and_end_at_the_times_the_cluster_recorded() -> None:
    events = job_events([DONE, FAILED])
    assert events.label == JOBS_LABEL
    assert events.threads == {1: "python ok.py (job-ok)", 2: "python bad.py (job-bad)"}
    assert {e.kind for e in events.events} == {Kind.JOB_STATE}
    assert [e.t for e in events.events] == sorted(e.t for e in events.events)
    assert [e.seq for e in events.events] == list(range(1, len(events.events) + 1))
    ok = [(t, data) for key, t, data in _states([DONE]) if key == "job-ok"]
    assert ok == [
        (int(T * 1e9), {"state": "PENDING"}),
        (int((T + 1) * 1e9), {"state": "RUNNING", "attempt": 1}),
        (int((T + 3) * 1e9), {"state": "SUCCEEDED", "attempt": 1, "exit_code": 0}),
        (int((T + 3) * 1e9), {"state": "SUCCEEDED", "exit_code": 0}),
    ]
    bad = [data for key, _, data in _states([FAILED]) if key == "job-bad"]
    assert bad[-1] == {"state": "FAILED", "exit_code": 3, "message": "exited with code 3"}
    assert {e.name for e in events.events} == {"python ok.py", "python bad.py"}


def test_a_supervised_job_gives_each_attempt_and_a_running_or_pending_job_no_end() -> None:
    retried = _states([RETRIED])
    attempts = [(data["attempt"], data["state"]) for _, _, data in retried if "attempt" in data]
    assert attempts == [(1, "RUNNING"), (1, "FAILED"), (2, "RUNNING"), (2, "SUCCEEDED")]
    assert job_events([RETRIED]).events[0].name == "train"  # its name, not its entrypoint
    assert [data for _, _, data in _states([RUNNING])] == [{"state": "PENDING"}, {"state": "RUNNING", "attempt": 1}]
    assert [data for _, _, data in _states([PENDING])] == [{"state": "PENDING"}]
    assert job_events([JobInfo("nothing", JobStatus.PENDING)]).events == []  # no time recorded: nothing made up


def test_the_trace_draws_a_lane_per_job_a_span_per_attempt_and_instants_for_submit_and_end() -> None:
    jobs = [DONE, FAILED, RETRIED, RUNNING, PENDING]
    trace, _ = timeline.build([job_events(jobs)])
    assert timeline.validate(trace) == []
    events = trace["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert lanes == {
        "python ok.py (job-ok)",
        "python bad.py (job-bad)",
        "train (train.1)",
        "sleep 100 (job-run)",
        "sleep 1 (job-wait)",
    }
    assert next(e["args"]["name"] for e in events if e.get("name") == "process_name").startswith("jobs ")
    spans = {(e["args"]["key"], e["args"]["attempt"]): e for e in events if e["ph"] == "X"}
    assert set(spans) == {("job-ok", 1), ("job-bad", 1), ("train.1", 1), ("train.1", 2), ("job-run", 1)}
    bad = spans[("job-bad", 1)]
    assert bad["cat"] == "job,FAILED" and bad["name"] == "python bad.py"
    assert bad["args"] == {
        "key": "job-bad",
        "status": "FAILED",
        "attempt": 1,
        "exit_code": 3,
        "message": "exited with code 3",
    }
    assert bad["dur"] == 1.5e6  # us
    assert spans[("train.1", 1)]["args"]["message"] == "rank 0 exited with code 1"
    assert spans[("train.1", 2)]["cat"] == "job,SUCCEEDED"
    running = spans[("job-run", 1)]
    assert running["cat"] == "job,RUNNING" and running["dur"] > 1e6  # drawn to now (years after T)
    instants = [(e["args"]["key"], e["args"]["state"]) for e in events if e["ph"] == "i"]
    assert sorted(instants) == sorted(
        [(j.id, "PENDING") for j in jobs] + [("job-ok", "SUCCEEDED"), ("job-bad", "FAILED"), ("train.1", "SUCCEEDED")]
    )


def test_validate_refuses_attempts_of_one_job_that_overlap() -> None:
    trace, _ = timeline.build([job_events([RETRIED])])
    first = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["attempt"] == 1)
    first["dur"] += 2e6  # into attempt 2
    assert timeline.validate(trace) == [f"lane pid 1 tid {first['tid']}: train starts before train ended"]
