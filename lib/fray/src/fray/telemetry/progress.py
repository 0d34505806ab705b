"""Progress of many refs: a tqdm bar (done/total, rate, failures) on a terminal, a one-line counter on stderr
without tqdm, nothing on a non-terminal unless asked with progress="always".

Used by `ctx.get(refs, progress=True)` and `fray.as_completed(refs, progress=True)`.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal

__all__ = ["Progress", "ProgressMode", "check_mode"]

ProgressMode = bool | Literal["always"]


def check_mode(progress: Any) -> ProgressMode:
    if progress is True or progress is False or progress == "always":
        return progress  # type: ignore[no-any-return]
    raise ValueError(f"progress must be True, False or 'always', got {progress!r}")


class Progress:
    """`with Progress(total, mode, what) as bar: bar.advance(done, failed)`."""

    def __init__(self, total: int | None, mode: ProgressMode, what: str = "refs") -> None:
        """total None: not known ahead (a generator's items); the bar counts without an end."""
        stream = sys.stderr
        self.shown = mode == "always" or (mode is True and stream.isatty())
        self.total, self.what, self.stream = total, what, stream
        self.done = self.failed = 0
        self.started = time.monotonic()
        self._last_text = 0.0
        self._bar: Any = None
        if not self.shown:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # optional (fray-core[progress]): a plain counter instead
            return
        self._bar = tqdm(total=total, desc=what, unit="ref", file=stream, dynamic_ncols=True, leave=True)

    def advance(self, done: int = 1, failed: int = 0) -> None:
        self.done += done
        self.failed += failed
        if not self.shown:
            return
        if self._bar is not None:
            self._bar.update(done)
            if failed:
                self._bar.set_postfix(failed=self.failed, refresh=False)
            return
        now = time.monotonic()
        if now - self._last_text >= 0.2 or (self.total is not None and self.done >= self.total):
            self._last_text = now
            self._write_text(end="")

    def _write_text(self, end: str) -> None:
        rate = self.done / max(1e-9, time.monotonic() - self.started)
        failed = f", {self.failed} failed" if self.failed else ""
        total = "" if self.total is None else f"/{self.total}"
        self.stream.write(f"\r{self.what}: {self.done}{total} done{failed}, {rate:.1f}/s{end}")
        self.stream.flush()

    def close(self) -> None:
        if not self.shown:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._write_text(end="\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
