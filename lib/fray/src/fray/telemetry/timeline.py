"""A job's events as a Chrome trace / Perfetto JSON file (`ctx.timeline(path)`), and the validator that checks one.

Open the file in https://ui.perfetto.dev or chrome://tracing. What it holds:
- one process per process that ran fray code (`driver host pid 123`, `ray worker host pid 456`), one lane per
  thread; an actor's calls run on a lane named after the actor;
- one span per task and per actor call (category `task` / `actor call`, args: its key; status and error type
  when it did not succeed), and an
  arrow from where it was submitted to where it started (its queue wait);
- transfers as spans (category `transfer`, named by their path, args: bytes);
- counters: tasks in flight, bytes moved by path;
- deaths and restarts of actors, groups and workers as instants, with their reason;
- a cluster's jobs (fray.jobs.events: `Kind.JOB_STATE` events, a lane per job): a span per attempt (category
  `job,STATUS`, args: attempt, status, exit code, message; one still running is drawn to the file's writing),
  and instants for its submission and its final state.

Clocks: each process stamps its events with its own wall clock. Hosts' clocks differ by a little (NTP) or a lot
(none), so a process whose tasks would start before they were submitted is moved later by the largest such gap:
in the file a task never starts before it was submitted.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from fray.errors import FrayError
from fray.telemetry.events import Event, Kind, ProcessEvents

__all__ = ["TimelineSummary", "build", "validate", "write"]

_STARTS = {Kind.TASK_START: "task", Kind.CALL_START: "actor call"}
_ENDS = {Kind.TASK_END: "task", Kind.CALL_END: "actor call"}
_SUBMITS = {Kind.TASK_SUBMIT: "task", Kind.CALL_SUBMIT: "actor call"}
_INSTANTS = {Kind.ACTOR_DIED, Kind.ACTOR_RESTART, Kind.GROUP_RESTART, Kind.WORKER_DIED, Kind.WORKER_START}
_COUNTER_STEP_US = 1000.0  # a counter gets at most one sample a millisecond (the file stays small)
JOB_CATEGORY = "job"  # a job attempt's span is in it, and in its status's category (`job,FAILED`)
# trace viewers' reserved colour names (chrome://tracing; Perfetto colours by name)
_JOB_COLOURS = {"SUCCEEDED": "good", "FAILED": "terrible", "STOPPED": "grey", "RUNNING": "thread_state_running"}


@dataclass(frozen=True)
class TimelineSummary:
    """What `ctx.timeline(path)` wrote: the file and how many spans of each kind; `dropped` events were lost
    before they could be drawn (a process's ring was full)."""

    path: Path
    tasks: int
    calls: int
    transfers: int
    processes: int
    dropped: int

    def __str__(self) -> str:
        lost = f"; {self.dropped} events were dropped (FRAY_EVENTS_CAPACITY)" if self.dropped else ""
        return (
            f"{self.path}: {self.tasks} tasks, {self.calls} actor calls, {self.transfers} transfers "
            f"in {self.processes} processes{lost}"
        )


def _shifts(processes: list[ProcessEvents]) -> list[int]:
    """Per process, ns to add to its clock so that nothing it started began before it was submitted."""
    submitted: dict[tuple[str, str | int], int] = {}
    for proc in processes:
        for e in proc.events:
            family = _SUBMITS.get(e.kind)
            if family is not None:
                submitted.setdefault((family, e.key), e.t)
    shifts = []
    for proc in processes:
        gap = 0
        for e in proc.events:
            family = _STARTS.get(e.kind)
            if family is not None:
                at = submitted.get((family, e.key))
                if at is not None and at - e.t > gap:
                    gap = at - e.t
        shifts.append(gap)
    return shifts


class _Builder:
    def __init__(self, processes: list[ProcessEvents]) -> None:
        self.processes = processes
        self.out: list[dict[str, Any]] = []
        self.tids: list[dict[int, int]] = [{} for _ in processes]
        shifts = _shifts(processes)
        # (process index, event, corrected time in ns): the whole job's events in time order
        self.events = sorted(
            ((i, e, e.t + shifts[i]) for i, proc in enumerate(processes) for e in proc.events), key=lambda x: x[2]
        )
        self.t0 = self.events[0][2] if self.events else 0
        self.counts = {"task": 0, "actor call": 0, "transfer": 0}
        self._pending_samples: dict[str, dict[str, Any]] = {}  # counter name -> its newest unwritten sample
        # a job's attempt that started and has not ended: (process index, job key, attempt) -> (start event, t)
        self._attempts: dict[tuple[int, str | int, Any], tuple[Event, int]] = {}

    def us(self, t_ns: int) -> float:
        return round((t_ns - self.t0) / 1000, 3)

    def tid(self, index: int, thread: int) -> int:
        tids = self.tids[index]
        found = tids.get(thread)
        if found is None:
            found = tids[thread] = len(tids) + 1
        return found

    def build(self) -> dict[str, Any]:
        open_spans: dict[tuple[str, str | int], list[tuple[int, Event, int]]] = defaultdict(list)
        submits: dict[tuple[str, str | int], tuple[int, Event, int]] = {}
        in_flight, flow_id = 0, 0
        moved: dict[str, int] = defaultdict(int)
        last_sample: dict[str, float] = {}
        for index, e, t in self.events:
            kind = e.kind
            if kind in _SUBMITS:
                family = _SUBMITS[kind]
                submits.setdefault((family, e.key), (index, e, t))
                if family == "task":
                    in_flight += 1
                    self._counter("tasks in flight", {"tasks": in_flight}, t, last_sample)
            elif kind in _STARTS:
                family = _STARTS[kind]
                open_spans[(family, e.key)].append((index, e, t))
                submit = submits.get((family, e.key))
                if submit is not None:
                    flow_id += 1
                    s_index, s_event, s_t = submit
                    self._flow("s", flow_id, family, e.name, s_index, s_event.thread, s_t)
                    self._flow("f", flow_id, family, e.name, index, e.thread, t)
            elif kind in _ENDS:
                family = _ENDS[kind]
                started = open_spans.get((family, e.key))
                if started:
                    self._span(family, started.pop(0), e, t)
                if family == "task" and (e.data or {}).get("status") != "retry":
                    in_flight = max(0, in_flight - 1)
                    self._counter("tasks in flight", {"tasks": in_flight}, t, last_sample)
            elif kind == Kind.TRANSFER:
                data = e.data or {}
                nbytes, seconds = int(data.get("bytes", 0)), float(data.get("seconds", 0.0))
                begin = t - int(seconds * 1e9)
                self.out.append(
                    {
                        "ph": "X",
                        "cat": "transfer",
                        "name": e.name,
                        "pid": index + 1,
                        "tid": self.tid(index, e.thread),
                        "ts": self.us(begin),
                        "dur": max(0.0, round(seconds * 1e6, 3)),
                        "args": {"bytes": nbytes, **_ends_of(data, self.processes[index])},
                    }
                )
                self.counts["transfer"] += 1
                moved[e.name] += nbytes
                self._counter("bytes moved", dict(moved), t, last_sample)
            elif kind == Kind.JOB_STATE and self._job_attempt(index, e, t):
                continue
            elif kind in _INSTANTS or kind == Kind.JOB_STATE:
                self.out.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "cat": kind.split(".")[0],
                        "name": f"{kind} {e.name}",
                        "pid": index + 1,
                        "tid": self.tid(index, e.thread),
                        "ts": self.us(t),
                        "args": {"key": str(e.key), **(e.data or {})},
                    }
                )
        now = time.time_ns()
        for (index, _, attempt), (start, t) in self._attempts.items():  # still running: drawn to now
            self._attempt_span(index, start, t, max(now, t), {"state": "RUNNING", "attempt": attempt})
        self.out.extend(self._pending_samples.values())
        self.out.extend(self._names())
        return {"traceEvents": self.out, "displayTimeUnit": "ms", "otherData": {"producer": "fray"}}

    def _counter(self, name: str, values: Mapping[str, int], t: int, last: dict[str, float]) -> None:
        ts = self.us(t)
        sample = {"ph": "C", "name": name, "pid": 1, "tid": 0, "ts": ts, "args": dict(values)}
        if ts - last.get(name, -_COUNTER_STEP_US) >= _COUNTER_STEP_US:
            last[name] = ts
            self.out.append(sample)
            self._pending_samples.pop(name, None)
        else:  # kept back: written if it is the last value of its millisecond
            self._pending_samples[name] = sample

    def _flow(self, ph: str, flow_id: int, cat: str, name: str, index: int, thread: int, t: int) -> None:
        event: dict[str, Any] = {
            "ph": ph,
            "id": flow_id,
            "cat": cat,
            "name": name,
            "pid": index + 1,
            "tid": self.tid(index, thread),
            "ts": self.us(t),
        }
        if ph == "f":
            event["bp"] = "e"  # binds to the span that starts here
        self.out.append(event)

    def _span(self, family: str, start: tuple[int, Event, int], end: Event, t_end: int) -> None:
        index, s, t_start = start
        args: dict[str, Any] = {"key": str(s.key)}
        data = end.data or {}
        if "status" in data:  # (none: it succeeded, as most do; the file stays small)
            args["status"] = data["status"]
        if "error" in data:
            args["error"] = data["error"]
        start_data = s.data or {}
        for field in ("actor", "concurrency"):
            if field in start_data:
                args[field] = start_data[field]
        self.out.append(
            {
                "ph": "X",
                "cat": family,
                "name": s.name,
                "pid": index + 1,
                "tid": self.tid(index, s.thread),
                "ts": self.us(t_start),
                "dur": max(0.0, self.us(t_end) - self.us(t_start)),
                "args": args,
            }
        )
        self.counts[family] += 1

    def _job_attempt(self, index: int, e: Event, t: int) -> bool:
        """Takes a job state event that starts or ends an attempt (its span is drawn at the end); False for the
        others (submitted, ended: instants)."""
        data = e.data or {}
        attempt = data.get("attempt")
        if attempt is None:
            return False
        where = (index, e.key, attempt)
        if data.get("state") == "RUNNING":
            self._attempts[where] = (e, t)
        else:
            started = self._attempts.pop(where, None)
            if started is not None:
                self._attempt_span(index, started[0], started[1], t, data)
        return True

    def _attempt_span(self, index: int, start: Event, t_start: int, t_end: int, data: Mapping[str, Any]) -> None:
        status = str(data.get("state", "RUNNING"))
        args = {field: data[field] for field in ("attempt", "exit_code", "message") if field in data}
        self.out.append(
            {
                "ph": "X",
                "cat": f"{JOB_CATEGORY},{status}",
                "name": start.name,
                "pid": index + 1,
                "tid": self.tid(index, start.thread),
                "ts": self.us(t_start),
                "dur": max(0.0, self.us(t_end) - self.us(t_start)),
                "cname": _JOB_COLOURS.get(status, "generic_work"),
                "args": {"key": str(start.key), "status": status, **args},
            }
        )

    def _names(self) -> Iterable[dict[str, Any]]:
        for index, proc in enumerate(self.processes):
            pid = index + 1
            name = f"{proc.label} {proc.host} pid {proc.pid}"
            yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
            for thread, tid in self.tids[index].items():
                lane = proc.threads.get(thread, f"thread {thread}")
                yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}


def _ends_of(data: Mapping[str, Any], reader: ProcessEvents) -> dict[str, str]:
    """A transfer's from (where the backend knows it) and to (the process that read it)."""
    ends = {"to": f"{reader.label} {reader.process}"}
    if data.get("from") is not None:
        ends["from"] = str(data["from"])
    return ends


def build(processes: list[ProcessEvents]) -> tuple[dict[str, Any], dict[str, int]]:
    """The trace of these processes' events, and how many task, actor call and transfer spans it has."""
    builder = _Builder(processes)
    trace = builder.build()
    return trace, builder.counts


def write(path: str | os.PathLike[str], processes: list[ProcessEvents]) -> TimelineSummary:
    trace, counts = build(processes)
    target = Path(path)
    with os.fdopen(_open_private(target), "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))
    return TimelineSummary(
        target,
        counts["task"],
        counts["actor call"],
        counts["transfer"],
        len(processes),
        sum(p.dropped for p in processes),
    )


def _open_private(path: Path) -> int:
    """`path` opened for writing as a file only this user can read (a timeline names the job's functions, actors
    and errors): created 0600, or, if it exists, a regular file of this user's, set to 0600 and emptied. Never
    through a symlink (O_NOFOLLOW), never blocking on another user's FIFO (O_NONBLOCK), never into a file that
    another user made first (/tmp/trace.json planted for us to fill): FrayError naming the problem."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FrayError(f"refusing to write the timeline to {path}: it is a symlink; give the real path") from None
        if exc.errno == errno.ENXIO:  # a FIFO (or socket, device) no one reads: not a file either
            raise FrayError(f"refusing to write the timeline to {path}: it is not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FrayError(f"refusing to write the timeline to {path}: it is not a regular file")
        if info.st_uid != os.getuid():
            raise FrayError(
                f"refusing to write the timeline to {path}: the file belongs to user {info.st_uid}, who could read "
                "it; remove it or choose another path"
            )
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


_PHASES = {"X", "B", "E", "i", "I", "s", "t", "f", "C", "M"}


def validate(
    trace: Any, tasks: int | None = None, calls: int | None = None, transfers: Mapping[str, int] | None = None
) -> list[str]:
    """What is wrong with a trace (an empty list: nothing): it must be a Chrome trace (integer pid and tid, a
    known phase, a time on every event but metadata, no negative duration); every flow starts and ends once, and
    never ends before it starts (a task never starts before it was submitted); the calls of an actor that runs
    one call at a time never overlap on its lane, nor the attempts of a job (fray.jobs.events) on its. Given
    `tasks` / `calls`, the task / actor call spans must number exactly that; given `transfers` (path -> bytes, as
    `ctx.transfer_stats()` reports), the transfer spans' bytes by path must add up to it."""
    problems: list[str] = []
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        return ["not a Chrome trace: no traceEvents list"]
    flows: dict[Any, dict[str, float]] = defaultdict(dict)
    lanes: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    spans: dict[str, int] = defaultdict(int)
    moved: dict[str, int] = defaultdict(int)
    for n, e in enumerate(events):
        where = f"event {n} ({e.get('name') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in _PHASES:
            problems.append(f"{where}: unknown phase {ph!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid", 0), int):
            problems.append(f"{where}: pid and tid must be integers")
        if ph == "M":
            continue
        ts = e.get("ts")
        if not isinstance(ts, int | float):
            problems.append(f"{where}: no time")
            continue
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, int | float) or dur < 0:
                problems.append(f"{where}: a span needs a duration >= 0")
                continue
            args = e.get("args") or {}
            spans[str(e.get("cat"))] += 1
            if e.get("cat") == "transfer":
                moved[str(e.get("name"))] += int(args.get("bytes", 0))
            if args.get("concurrency") == 1 or str(e.get("cat", "")).split(",")[0] == JOB_CATEGORY:
                lanes[(e["pid"], e.get("tid", 0))].append((float(ts), float(ts) + float(dur), str(e.get("name"))))
        elif ph in ("s", "f"):
            if ph in flows[e.get("id")]:
                problems.append(f"{where}: flow {e.get('id')} has two {ph!r} events")
            flows[e.get("id")][ph] = float(ts)
    for flow, ends in flows.items():
        if set(ends) != {"s", "f"}:
            problems.append(f"flow {flow} does not close (has only {sorted(ends)})")
        elif ends["f"] < ends["s"]:
            problems.append(f"flow {flow} ends before it starts: started {ends['f'] - ends['s']:.3f} us early")
    for (pid, tid), runs in lanes.items():
        runs.sort()
        for (_, end, name), (start, _, next_name) in pairwise(runs):
            if start < end - 1e-3:
                problems.append(f"lane pid {pid} tid {tid}: {next_name} starts before {name} ended")
    for cat, want in (("task", tasks), ("actor call", calls)):
        if want is not None and spans[cat] != want:
            problems.append(f"{spans[cat]} {cat} spans, expected {want}")
    if transfers is not None:
        for path in sorted(set(transfers) | set(moved)):
            if transfers.get(path, 0) != moved.get(path, 0):
                problems.append(
                    f"transfers by {path}: {moved.get(path, 0)} bytes drawn, {transfers.get(path, 0)} moved"
                )
    return problems
