"""What a failed test's context recorded while the test ran (fray.telemetry.events), as text for its report: deaths,
restarts, worker starts, tasks and calls, with the process that recorded each (transfers left out), so that a failure
seen once in a long run says what the backend did, not only that a get timed out.

Reading the events asks the backend for its processes' rings, which a broken backend may not answer: the read
runs on a thread of its own and is given up after `timeout` seconds, saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from fray.context import JobContext
from fray.telemetry.events import Event, Kind

__all__ = ["events_during"]

SHOWN = 80  # the newest events shown; those before are counted
READ_TIMEOUT = 10.0


def events_during(ctx: JobContext, since_ns: int, timeout: float = READ_TIMEOUT) -> str:
    """The events `ctx` recorded from `since_ns` (time.time_ns()) on, one line each, oldest first."""
    read: list[str] = []

    def _read() -> None:
        try:
            read.append(_text(ctx, since_ns))
        except Exception as exc:  # (a context shut down by the test, or a backend that cannot be asked)
            read.append(f"the events could not be read: {type(exc).__name__}: {exc}")

    reader = threading.Thread(target=_read, name="fray-test-failure-events", daemon=True)
    reader.start()
    reader.join(timeout)
    return read[0] if read else f"the events could not be read: the backend did not answer in {timeout:g} s"


def _text(ctx: JobContext, since_ns: int) -> str:
    store = ctx.events()
    held = store.rows()  # (plain tuples: a session's context may hold many events, most from earlier tests)
    labels = [f"{info.label} pid {info.pid}" for info in store.processes]
    chosen = [
        (Event._make(row), labels[source])
        for source, row in zip(held.sources, held.rows, strict=True)
        if row[1] >= since_ns and row[2] != Kind.TRANSFER
    ]
    if not chosen:
        return "none recorded (is event recording on for this backend? FRAY_EVENTS=1)"
    chosen.sort(key=lambda pair: pair[0].t)
    lines = [f"{len(chosen) - SHOWN} earlier events not shown"] if len(chosen) > SHOWN else []
    lines += [_line(event, process, since_ns) for event, process in chosen[-SHOWN:]]
    return "\n".join(lines)


def _line(event: Event, process: str, since_ns: int) -> str:
    seconds = (event.t - since_ns) / 1e9
    return f"+{seconds:8.3f} s  {event.kind:<14} {event.name} [{event.key}]{_data(event.data)}  ({process})"


def _data(data: Mapping[str, Any] | None) -> str:
    return " " + ", ".join(f"{k}={v}" for k, v in data.items()) if data else ""
