"""Ctrl-C in a driver: one line naming what was interrupted, and exit status 130, on every backend.

Two parts. fray's blocking calls (get, wait, as_completed, wait_job, tail_job_logs, init) re-raise a
KeyboardInterrupt from their public method with fray's internal frames trimmed (`interrupted`), naming what they
waited for; a program that catches it sees its own frames and one of fray's. And `fray.init` installs a
`sys.excepthook` (`install_hook`) only where the program has none of its own (Python's default, or the one Ray
installs at import): an unhandled KeyboardInterrupt then prints `fray: interrupted while waiting for <what>` and
the process exits 130 after its atexit handlers ran (Python's own exit for it is a re-raised SIGINT, -2, and no
hook can change that status, so the hook ends the process itself). Any other exception goes to the hook that was
there before. `fray.shutdown` puts that hook back.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from collections.abc import Iterator
from types import TracebackType

__all__ = ["EXIT_STATUS", "install_hook", "interrupted", "interruptible", "message", "refs", "uninstall_hook"]

EXIT_STATUS = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C ended
_WHAT = "fray_waiting_for"  # the attribute of a KeyboardInterrupt that names what fray waited for

_previous: object = None  # the hook fray's replaced (None: fray's is not installed)


def interrupted(exc: KeyboardInterrupt, what: str) -> KeyboardInterrupt:
    """`exc` to re-raise from a blocking public call (`raise interrupted(exc, what) from None`): its traceback
    trimmed to the caller's frames and that call, and `what` recorded (the innermost call's, if several)."""
    if getattr(exc, _WHAT, None) is None:
        setattr(exc, _WHAT, what)
    return exc.with_traceback(None)


def refs(count: int) -> str:
    return "1 ref" if count == 1 else f"{count} refs"


def _engines(hook: object) -> bool:
    """A hook an engine installed, not the program (Ray sets one at import that reports driver errors and then
    calls Python's default)."""
    return str(getattr(hook, "__module__", "")).startswith("ray.")


def install_hook() -> None:
    """Where the program has no sys.excepthook of its own, make an unhandled KeyboardInterrupt one line and 130."""
    global _previous
    hook = sys.excepthook
    if hook is _hook or not (hook is sys.__excepthook__ or _engines(hook)):
        return
    _previous = hook
    sys.excepthook = _hook


def uninstall_hook() -> None:
    """Put back the hook install_hook replaced, if fray's is still the one installed."""
    global _previous
    if sys.excepthook is _hook and _previous is not None:
        sys.excepthook = _previous  # type: ignore[assignment]
    _previous = None


def message(exc: BaseException, tb: TracebackType | None) -> str:
    """`fray: interrupted while waiting for <what fray waited for>`, or where the program was (its own code)."""
    what = getattr(exc, _WHAT, None)
    if what is not None:
        return f"fray: interrupted while waiting for {what}"
    frames = traceback.extract_tb(tb)
    if not frames:
        return "fray: interrupted"
    last = frames[-1]
    return f"fray: interrupted in {last.name} ({os.path.basename(last.filename)}, line {last.lineno})"


def _hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if not issubclass(kind, KeyboardInterrupt):
        previous = _previous if callable(_previous) else sys.__excepthook__
        previous(kind, exc, tb)
        return
    try:
        sys.stderr.write(message(exc, tb) + "\n")
        atexit._run_exitfuncs()  # what `fray.shutdown` and the engines registered: os._exit skips them
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(EXIT_STATUS)


def interruptible(pieces: Iterator[str], what: str) -> Iterator[str]:
    """`pieces`, with a Ctrl-C while they come raised as `interrupted` says (naming `what`)."""
    try:
        yield from pieces
    except KeyboardInterrupt as exc:
        raise interrupted(exc, what) from None
