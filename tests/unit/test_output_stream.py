"""fray.runtime.worker_output.LabelledStream: the wrapper in_memory puts over sys.stdout / sys.stderr."""

from __future__ import annotations

import io

from fray.runtime.worker_output import LabelledStream


def test_a_labelled_stream_is_closed_when_its_target_is() -> None:
    # Ray's colorama keeps the sys.stdout it saw at import and, at exit, does `not s.closed and s.isatty()`.
    # When that was our wrapper over a stream closed since (pytest's capture), isatty() raised ValueError.
    target = io.StringIO()
    stream = LabelledStream(target)
    assert not stream.closed
    target.close()
    assert stream.closed
    assert not (not stream.closed and stream.isatty())
