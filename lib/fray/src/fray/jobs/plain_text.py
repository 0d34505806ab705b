"""Job logs as plain text: terminal escape sequences (colours, bold) removed.

A job's log is a file, read back as text (`get_job_logs`, `fray job logs`, a CI artifact), never a terminal: the
codes Ray writes into it for its own lines ("View the dashboard at <bold green URL>", coloured "(raylet)" prefixes),
or a program's own colours, are noise there. One rule for every backend: `get_job_logs` and
`tail_job_logs` give the text without them; the pieces of a tail, joined, are the same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["last_lines", "plain", "plain_pieces"]

# CSI sequences (ESC [ parameters final-letter: colours, cursor moves), OSC sequences (ESC ] text, then BEL or
# ESC backslash: titles, links, and the records of fray.jobs.records) and two-character escapes (ESC letter).
_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\\]^_]")
_PARTIAL = re.compile(r"\x1b(\[[0-9;?]*|\][^\x07\x1b]*)?\Z")  # a sequence cut at the end of what was read so far


def plain(text: str) -> str:
    """text without terminal escape sequences (a sequence cut at its very end is dropped too)."""
    return _CODES.sub("", _PARTIAL.sub("", text))


def plain_pieces(pieces: Iterable[str]) -> Iterator[str]:
    """Each piece without escape sequences; one split between two pieces is removed whole."""
    carry = ""
    for piece in pieces:
        text = carry + piece
        cut = _PARTIAL.search(text)
        carry = text[cut.start() :] if cut else ""
        text = _CODES.sub("", text[: cut.start()] if cut else text)
        if text:
            yield text


def last_lines(text: str, count: int) -> str:
    """The last `count` lines of text (all of it if it has fewer; "" for count <= 0), line ends kept."""
    return "".join(text.splitlines(keepends=True)[-count:]) if count > 0 else ""
