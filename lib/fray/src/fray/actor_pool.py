"""`ctx.actor_pool(cls, size)`: stateful workers (a model loaded once per worker) fed like `ctx.map`.

`map` sends each item to the least busy member, keeps at most `max_in_flight` items submitted or waiting to be
yielded, reads its items lazily and yields in order (or as they finish). A member whose process dies: where the
actors may restart (ActorOptions.max_restarts != 0) the backend brings it back and its in-flight items are sent
again, once each; else the map raises `PoolMemberLostError` naming the items that were lost.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, cast

from fray.bounded_map import check_window, drop_refs, note_item
from fray.errors import ActorDiedError, ActorUnavailableError
from fray.runtime.completion import WatchedContext, outcomes
from fray.runtime.refs import ActorHandle, ObjectRef
from fray.types import ActorOptions

__all__ = ["ActorPool", "PoolContext", "PoolMemberLostError"]

Target = str | Callable[[ActorHandle, Any], ObjectRef]


class PoolContext(Protocol):
    """What an actor pool needs of a job context."""

    def create_actor(
        self,
        klass: type,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: ActorOptions | None = None,
    ) -> ActorHandle: ...

    def get(self, refs: ObjectRef, timeout: float | None = None) -> Any: ...

    def cancel(self, ref: ObjectRef) -> None: ...

    def kill(self, actor: ActorHandle) -> None: ...

    def _future_of(self, ref: ObjectRef) -> Future[Any]: ...


class PoolMemberLostError(ActorDiedError):
    """A pool member died with items in flight and could not be brought back (or an item was lost twice):
    `lost_items` are those items' indices in the map's input, `member` the member's index."""

    def __init__(self, message: str, member: int, lost_items: list[int]) -> None:
        super().__init__(message)
        self.member = member
        self.lost_items = lost_items

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.member, self.lost_items))


@dataclass
class _Call:
    member: int
    ref: ObjectRef
    item: Any
    retried: bool


class ActorPool:
    """`size` actors of one class; `map` and `submit` spread calls over them (see the module's docstring)."""

    def __init__(
        self,
        ctx: PoolContext,
        klass: type,
        size: int,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        options: ActorOptions,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"actor_pool size must be an int >= 1, got {size!r}")
        if options.name is not None:
            raise ValueError("actor_pool members cannot share one name: leave ActorOptions.name unset")
        self._ctx = ctx
        self.actors: list[ActorHandle] = [ctx.create_actor(klass, args, kwargs, options) for _ in range(size)]
        self._retry_lost = options.max_restarts != 0
        self._busy = [0] * size
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ActorPool({len(self.actors)} x {self.actors[0].class_name})"

    def __len__(self) -> int:
        return len(self.actors)

    # ----------------------------------------------------------------- public
    def submit(self, method: Target, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call `method` (a method name) with these arguments on the least busy member: a concurrent.futures
        Future of its value. A callable instead of a name is called as fn(actor_handle, *args, **kwargs) and
        must return the ObjectRef of a call it made on that handle."""
        member = self._take_member()
        try:
            ref = self._call(method, member, args, kwargs)
        except BaseException:
            self._release(member)
            raise
        future = self._ctx._future_of(ref)
        future.add_done_callback(lambda _: self._release(member))
        return future

    def map(
        self, method: Target, items: Iterable[Any], *, max_in_flight: int | None = None, ordered: bool = True
    ) -> Iterator[Any]:
        """method(item) for each item, over the members (one argument per call; a callable: fn(handle, item)
        returning a ref). At most `max_in_flight` items (default: 2 per member) are submitted or held for the
        caller; results in input order, or as they finish with ordered=False. A failed item raises its own
        exception noted with its index (`exc.item_index`)."""
        if not isinstance(method, str) and not callable(method):
            raise TypeError(f"map needs a method name or a callable, got {type(method).__name__}")
        window = 2 * len(self.actors) if max_in_flight is None else check_window(max_in_flight)
        return self._map(method, iter(items), window, bool(ordered))

    def shutdown(self) -> None:
        """Kill every member (their pending calls fail with ActorDiedError)."""
        for handle in self.actors:
            try:
                self._ctx.kill(handle)
            except Exception:  # already dead, or its context shut down: nothing left to stop
                pass

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- machinery
    def _take_member(self) -> int:
        with self._lock:
            member = min(range(len(self._busy)), key=self._busy.__getitem__)
            self._busy[member] += 1
            return member

    def _release(self, member: int) -> None:
        with self._lock:
            self._busy[member] -= 1

    def _call(self, method: Target, member: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        handle = self.actors[member]
        if isinstance(method, str):
            ref = getattr(handle, method)(*args, **kwargs)
        else:
            ref = method(handle, *args, **kwargs)
            if not isinstance(ref, ObjectRef):
                raise TypeError(
                    f"an actor pool's callable must return the ObjectRef of a call, got {type(ref).__name__}"
                )
        return cast(ObjectRef, ref)

    def _map(self, method: Target, items: Iterator[Any], window: int, ordered: bool) -> Iterator[Any]:
        indexed = enumerate(items)
        in_flight: dict[int, _Call] = {}
        held: dict[int, Any] = {}  # finished, waiting for an earlier item (ordered only)
        finished: queue.SimpleQueue[int] = queue.SimpleQueue()
        next_out = 0
        exhausted = False

        def send(index: int, item: Any, retried: bool) -> None:
            member = self._take_member()
            try:
                ref = self._call(method, member, (item,), {})
            except BaseException:
                self._release(member)
                raise
            in_flight[index] = _Call(member, ref, item, retried)
            outcomes(cast(WatchedContext, self._ctx), [ref])[0].add_callback(lambda _: finished.put(index))

        try:
            while True:
                while not exhausted and len(in_flight) + len(held) < window:
                    batch = list(itertools.islice(indexed, 1))
                    if not batch:
                        exhausted = True
                        break
                    send(batch[0][0], batch[0][1], False)
                if ordered and next_out in held:
                    next_out += 1
                    yield held.pop(next_out - 1)
                    continue
                if not in_flight:
                    return
                index = finished.get()
                call = in_flight.pop(index)
                self._release(call.member)
                try:
                    value = self._ctx.get(call.ref)
                except (ActorDiedError, ActorUnavailableError) as exc:
                    if self._retry_lost and not call.retried:
                        send(index, call.item, True)
                        continue
                    lost = sorted([index, *(i for i, c in in_flight.items() if c.member == call.member)])
                    raise PoolMemberLostError(
                        f"actor pool member {call.member} died and could not be brought back "
                        f"({'its restarts are used up' if self._retry_lost else 'ActorOptions.max_restarts is 0'}): "
                        f"items {lost} of the map's input were lost ({type(exc).__name__}: {exc})",
                        call.member,
                        lost,
                    ) from exc
                except Exception as exc:
                    raise note_item(exc, index, "ActorPool.map") from None
                if not ordered:
                    yield value
                elif index == next_out:
                    next_out += 1
                    yield value
                else:
                    held[index] = value
                del value
        finally:
            for call in in_flight.values():
                self._release(call.member)
            drop_refs(self._ctx, [call.ref for call in in_flight.values()])
