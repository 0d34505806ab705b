"""Worker output the way Ray users know it: each line a task or actor prints reaches the driver's console
prefixed with who printed it, `(square pid=4242) hello`, `(Counter pid=4243) hello`, `(... ip=10.0.0.5)` where
there are several hosts.

`push_label(label)` / `pop_label(token)` mark the thread (or asyncio task) running a task or actor call, and a
`LabelledStream` installed over sys.stdout / sys.stderr prefixes that thread's lines (other threads write through
unchanged). in_memory does this in the driver; monarch inside each worker process (whose stdout is the driver's).
"""

from __future__ import annotations

import contextvars
import io
import os
import sys
import threading
from typing import Any, TextIO

__all__ = ["LabelledStream", "install", "label_for", "pop_label", "push_label"]

_label: contextvars.ContextVar[str | None] = contextvars.ContextVar("fray_output_label", default=None)
_install_lock = threading.Lock()


def label_for(name: str, pid: int | None = None, host: str | None = None) -> str:
    """`(name pid=N)` or `(name pid=N ip=H)`: the prefix of a task's or actor's lines."""
    where = f" ip={host}" if host else ""
    return f"({name} pid={pid if pid is not None else os.getpid()}{where})"


class LabelledStream(io.TextIOBase):
    """Writes through to `target`; a thread (or asyncio task) running under `labelled(label)` has its output
    buffered to whole lines and each line prefixed with its label."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self.target = target
        self._partial: dict[int, str] = {}  # thread id -> its unfinished line
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        label = _label.get()
        if label is None:
            return self.target.write(text)
        me = threading.get_ident()
        with self._lock:
            pending = self._partial.pop(me, "") + text
            *lines, rest = pending.split("\n")
            if rest:
                self._partial[me] = rest
            if lines:
                self.target.write("".join(f"{label} {line}\n" for line in lines))
        return len(text)

    def finish_line(self, label: str) -> None:
        """A labelled piece of work ended: print its unfinished last line, if any."""
        if threading.get_ident() not in self._partial:  # the usual case, on every task: no lock needed
            return  # (only this thread adds or removes its own key)
        with self._lock:
            rest = self._partial.pop(threading.get_ident(), "")
            if rest:
                self.target.write(f"{label} {rest}\n")

    def flush(self) -> None:
        self.target.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:  # type: ignore[override]
        # The target's state, not this wrapper's: code that checks `stream.closed` before using a stream it kept
        # (Ray's colorama does at exit) must not call into a target that is gone.
        return bool(getattr(self.target, "closed", False))

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def install() -> None:
    """Put a LabelledStream over sys.stdout and sys.stderr (again if something replaced them since)."""
    if isinstance(sys.stdout, LabelledStream) and isinstance(sys.stderr, LabelledStream):
        return
    with _install_lock:
        if not isinstance(sys.stdout, LabelledStream):
            sys.stdout = LabelledStream(sys.stdout)  # type: ignore[assignment]
        if not isinstance(sys.stderr, LabelledStream):
            sys.stderr = LabelledStream(sys.stderr)  # type: ignore[assignment]


def push_label(label: str) -> contextvars.Token[str | None]:
    """Lines this thread prints from now until pop_label are prefixed with label."""
    install()
    return _label.set(label)


def pop_label(token: contextvars.Token[str | None]) -> None:
    label = _label.get()
    _label.reset(token)
    if label is not None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, LabelledStream):
                stream.finish_line(label)
