"""`ctx.map(fn, iterable)`: fn over an iterable of any length, with at most `max_in_flight` tasks submitted.

The iterable is read lazily (an item is read when a slot frees, so a generator of ten million items is never
held), results come in order (or as they finish), and a result the caller has taken is no longer held: the
driver's memory stays flat in the number of items. A failed item raises its own exception, noted with its index.
"""

from __future__ import annotations

import itertools
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

from fray.errors import UnsupportedFeatureError
from fray.executor import TaskSubmitter, task_call
from fray.runtime.completion import WatchedContext, outcomes
from fray.runtime.refs import ObjectRef
from fray.telemetry.progress import Progress, ProgressMode, check_mode
from fray.types import TaskOptions

# ctx.map's max_in_flight when none is given: enough to keep a backend of slow round trips (Ray) busy, in a
# driver's memory no one notices (docs/executors.md, "Cost").
DEFAULT_IN_FLIGHT = 1000

__all__ = ["DEFAULT_IN_FLIGHT", "Canceller", "MapContext", "bounded_map", "check_window", "drop_refs", "note_item"]


class MapContext(TaskSubmitter, Protocol):
    """What ctx.map needs of a job context."""

    def get(self, refs: ObjectRef | list[ObjectRef], timeout: float | None = None) -> Any: ...

    def cancel(self, ref: ObjectRef) -> None: ...


def check_window(max_in_flight: Any, name: str = "max_in_flight") -> int:
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"{name} must be an int >= 1, got {max_in_flight!r}")
    return max_in_flight


def note_item(exc: BaseException, index: int, what: str) -> BaseException:
    """exc, marked with the index of the item that raised it: `exc.item_index`, and a note in its traceback."""
    exc.item_index = index  # type: ignore[attr-defined]
    note = f"raised by item {index} of {what}"
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(note)
    return exc


def bounded_map(
    ctx: MapContext,
    fn: Callable[..., Any],
    iterable: Iterable[Any],
    max_in_flight: int,
    ordered: bool,
    progress: ProgressMode,
    options: TaskOptions,
) -> Iterator[Any]:
    """The checks happen now; the work once the caller starts iterating (see ctx.map)."""
    if not callable(fn):
        raise TypeError(f"map needs a callable, got {type(fn).__name__}")
    window = check_window(max_in_flight)
    mode = check_mode(progress)
    items = iter(iterable)  # a TypeError naming the type if it is not iterable
    total = len(iterable) if isinstance(iterable, (Sequence, Mapping)) else None
    run = _ordered if ordered else _as_finished
    return run(ctx, fn, items, window, (total, mode), options)


def _ordered(
    ctx: MapContext,
    fn: Callable[..., Any],
    items: Iterator[Any],
    window: int,
    shown: tuple[int | None, ProgressMode],
    options: TaskOptions,
) -> Iterator[Any]:
    bar = Progress(shown[0], shown[1], "fray.map") if shown[1] else None
    indexed = enumerate(items)
    in_flight: deque[tuple[int, ObjectRef]] = deque()
    try:
        for index, item in itertools.islice(indexed, window):
            in_flight.append((index, ctx.create_task(*task_call(fn, (item,)), None, options)))
        while in_flight:
            index, ref = in_flight[0]
            try:
                value = ctx.get(ref)
            except Exception as exc:
                if bar is not None:
                    bar.advance(1, 1)
                raise note_item(exc, index, "ctx.map") from None
            in_flight.popleft()
            del ref
            # the next item goes out before the caller gets this value: the engine works while the caller does
            for next_index, item in itertools.islice(indexed, 1):
                in_flight.append((next_index, ctx.create_task(*task_call(fn, (item,)), None, options)))
            if bar is not None:
                bar.advance(1)
            yield value
            del value
    finally:
        drop_refs(ctx, [ref for _, ref in in_flight])
        if bar is not None:
            bar.close()


def _as_finished(
    ctx: MapContext,
    fn: Callable[..., Any],
    items: Iterator[Any],
    window: int,
    shown: tuple[int | None, ProgressMode],
    options: TaskOptions,
) -> Iterator[Any]:
    bar = Progress(shown[0], shown[1], "fray.map") if shown[1] else None
    indexed = enumerate(items)
    in_flight: dict[int, ObjectRef] = {}
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()

    def submit(batch: Iterable[tuple[int, Any]]) -> None:
        for index, item in batch:
            ref = ctx.create_task(*task_call(fn, (item,)), None, options)
            in_flight[index] = ref
            outcomes(cast(WatchedContext, ctx), [ref])[0].add_callback(_announce(finished, index))

    try:
        submit(itertools.islice(indexed, window))
        while in_flight:
            index = finished.get()
            try:
                value = ctx.get(in_flight.pop(index))
            except Exception as exc:
                if bar is not None:
                    bar.advance(1, 1)
                raise note_item(exc, index, "ctx.map(ordered=False)") from None
            submit(itertools.islice(indexed, 1))
            if bar is not None:
                bar.advance(1)
            yield value
            del value
    finally:
        drop_refs(ctx, list(in_flight.values()))
        if bar is not None:
            bar.close()


def _announce(finished: queue.SimpleQueue[int], index: int) -> Callable[[Any], None]:
    return lambda _: finished.put(index)


class Canceller(Protocol):
    def cancel(self, ref: ObjectRef) -> None: ...


def drop_refs(ctx: Canceller, refs: list[ObjectRef]) -> None:
    """The map ended early (an error, a break, a closed generator): its tasks' results are not wanted."""
    for ref in refs:
        try:
            ctx.cancel(ref)
        except UnsupportedFeatureError:  # running, and the backend cannot interrupt it: it ends by itself
            pass
        except Exception:  # the context is shut down, or the task ended meanwhile: nothing to stop
            pass
