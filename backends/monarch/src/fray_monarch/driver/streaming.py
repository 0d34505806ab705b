"""The streams of one context: the items of a streaming task or actor method, each an object of the directory,
handed to the consumer in order as the producer reports them.

A producer (a task thread in a worker, or an actor host) runs the generator and reports every item as a
`StreamItem` through its process's report FIFO (the same path as task results and ref holds, so an item's holds
are never overtaken). A large item stays in the producer's store, like any result. The consumer reads through an
`ObjectRefStream` whose source is `DriverStream` in the driver, or `RemoteStream` (workers/runtime.py) in a
worker, which asks the coordinator for the next item. Closing the stream tells the producer's process to stop
the generator at its next item (WorkerHost.stop_stream).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from fray.backend import ActorState, ObjectRef
from fray.errors import ActorDiedError, FrayError, GetTimeoutError
from fray_monarch.core import runtime
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import BACKEND, Reply, StreamItem, send_reply
from fray_monarch.driver.actor_rec import ActorRec
from fray_monarch.driver.directory import ObjectDirectory
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.orphaned_calls import stream_failure
from fray_monarch.driver.proc_rec import Proc
from fray_monarch.driver.processes import ProcessPool


class StreamRec:
    """One stream in the controller: items produced and not yet handed to the consumer (None = the end).
    `producer()` is the process its generator runs in (a streaming task's, or its actor's; None before it is
    placed)."""

    def __init__(self, sid: str, producer: Callable[[], Proc | None]) -> None:
        self.id = sid
        self.producer = producer
        self.cond = threading.Condition()
        self.items: deque[RefPayload | None] = deque()
        self.received = 0  # items reported by the producer so far
        self.ended = False  # the end is queued: nothing more will come
        self.closed = False  # the consumer has gone
        self.keep: list[Any] = []  # what the call's arguments need until the producer has them
        self.listener: Callable[[], None] | None = None  # a worker's pending request for the next item
        self.stop_sent = False

    def push(self, payload: RefPayload | None) -> None:
        with self.cond:
            self.items.append(payload)
            self.cond.notify_all()
            listener, self.listener = self.listener, None
        if listener is not None:
            listener()

    def take(self) -> tuple[bool, RefPayload | None]:
        """(True, next item or None at the end) if there is one now; (False, None) if the consumer must wait."""
        with self.cond:
            if not self.items:
                return False, None
            payload = self.items.popleft()
            if payload is None:
                self.items.appendleft(None)  # stays ended
            return True, payload

    def wait(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: bool(self.items), timeout)


class DriverStream:
    """The StreamSource of a stream consumed in the driver; close(sid) tells the controller its consumer has
    gone."""

    def __init__(self, rec: StreamRec, close: Callable[[str], None]) -> None:
        self.rec = rec
        self._close = close

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        if not self.rec.wait(None if timeout is None else max(0.0, timeout)):
            raise GetTimeoutError(f"no next item of the stream within {timeout} s")
        _, payload = self.rec.take()
        return None if payload is None else ObjectRef(payload, BACKEND)

    def close(self) -> None:
        self._close(self.rec.id)


class StreamRegistry:
    """The open streams of one context, under the controller's lock."""

    def __init__(self, lock: threading.RLock, ids: Ids, directory: ObjectDirectory, pool: ProcessPool) -> None:
        self.lock = lock
        self.ids = ids
        self.directory = directory
        self.pool = pool
        self.by_id: dict[str, StreamRec] = {}

    def open(self, sid: str, producer: Callable[[], Proc | None]) -> StreamRec:
        """Under the lock: a stream whose items are made in the process producer() says."""
        rec = self.by_id[sid] = StreamRec(sid, producer)
        return rec

    def get(self, sid: str) -> StreamRec:
        return self.by_id[sid]

    def call_actor(self, actor: ActorRec, method: str, args: Any, deps: list[str], keep: list[Any]) -> str:
        """A call of an actor's generator method: its items come as a stream; returns the stream's id."""
        with self.lock:
            sid = self.ids.object()
            rec = self.open(sid, lambda: actor.proc)
            if actor.state == ActorState.DEAD:
                self.end(rec, ActorDiedError(f"actor {actor.label} is dead: {actor.reason}"))
                return sid
            rec.keep = keep
            fut = actor.mesh.call_stream.call_one(sid, method, args, deps)
            actor.streams[sid] = (rec, actor.restarts)
        runtime.on_done(fut, partial(self.actor_failed, rec, actor, actor.restarts))
        return sid

    def actor_failed(
        self, rec: StreamRec, actor: ActorRec, restarts: int, _value: Any, exc: BaseException | None
    ) -> None:
        """The actor's answer to the stream call: only its failure matters (items and the end come through the
        report FIFO); a process that died mid-stream ends the stream with the actor's error."""
        with self.lock:
            actor.streams.pop(rec.id, None)
            if exc is None or rec.ended:
                return
            self.end(rec, stream_failure(actor, restarts))  # (restarts: the actor's when it began)

    def item(self, proc_key: str, item: StreamItem) -> None:
        """Under the lock: the producer in proc_key reported one item (or the end)."""
        rec = self.by_id.get(item.stream)
        if item.end:
            if rec is not None:
                self.end(rec)
            return
        try:  # its owner is the producer (a large value stays there)
            entry, payload = self.directory.register(item.oid, proc_key, item.value.value if item.value else None)
        except FrayError:
            runtime.log.error("fray: a stream item was refused", exc_info=True)
            return
        if item.error is not None:
            self.directory.complete(entry, None, item.error)
        elif item.value is not None:
            self.directory.complete(entry, item.value.value, None, item.value.contained)
        if rec is None or rec.ended:
            return  # nobody reads it any more: dropping the payload frees it
        rec.received += 1
        rec.keep = []  # the producer has its arguments
        if not rec.closed:
            rec.push(payload)
        elif not rec.stop_sent:  # closed before it started: stop it now
            self.stop_producer(rec, self.pool.by_key(proc_key))

    def end(self, rec: StreamRec, error: Any = None) -> None:
        """Under the lock: no more items; with `error`, one last item that raises it."""
        if rec.ended:
            return
        if error is not None and not rec.closed:
            entry, payload = self.directory.new(self.ids.object())
            self.directory.complete(entry, None, error)
            rec.push(payload)
        rec.ended = True
        rec.keep = []
        rec.push(None)
        if rec.closed:
            self.by_id.pop(rec.id, None)

    def task_failed(self, sid: str, error: Any) -> None:
        """Under the lock: a streaming task ended without reporting its end (cancelled, crashed, deps failed)."""
        rec = self.by_id.get(sid)
        if rec is not None:
            self.end(rec, error)

    def started(self, sid: str) -> bool:
        rec = self.by_id.get(sid)
        return rec is not None and rec.received > 0

    def consumer_gone(self, sid: str) -> StreamRec | None:
        """Under the lock: drop what the consumer did not read. The stream if its producer may still run (to be
        stopped), else None."""
        rec = self.by_id.get(sid)
        if rec is None or rec.closed:
            return None
        rec.closed = True
        with rec.cond:
            unread = [p for p in rec.items if p is not None]
            rec.items = deque([None]) if rec.ended else deque()
        del unread  # their objects are freed
        if rec.ended:
            self.by_id.pop(sid, None)
            return None
        return rec

    def stop_producer(self, rec: StreamRec, proc: Proc | None) -> None:
        """Under the lock: tell the producer's process to stop the generator at its next item."""
        if proc is None or not proc.alive:
            return
        rec.stop_sent = True
        try:
            proc.worker.stop_stream.broadcast(rec.id)
        except Exception:
            runtime.log.debug("fray: stop of stream %s not sent", rec.id, exc_info=True)

    def next_remote(self, port: Any, proc_key: str, sid: str, timeout: float | None) -> None:
        """A worker's next_ref: answer with the next item's id (the worker's hold counted), None at the end, or
        timed_out."""
        rec = self.by_id.get(sid)
        if rec is None:
            send_reply(port, Reply(None))
            return
        once = threading.Lock()  # whoever takes it answers: an item, or the timeout

        def answer() -> None:
            with rec.cond:
                if not rec.items:
                    rec.listener = answer  # called again by the next push
                    return
            if not once.acquire(blocking=False):
                return
            _, payload = rec.take()
            if payload is not None:
                with self.lock:
                    entry = self.directory.entries.get(payload.id)
                    if entry is not None:
                        entry.remote[proc_key] = entry.remote.get(proc_key, 0) + 1
            send_reply(port, Reply(None if payload is None else payload.id))

        def timed_out() -> None:
            if once.acquire(blocking=False):
                with rec.cond:
                    if rec.listener is answer:
                        rec.listener = None
                send_reply(port, Reply(timed_out=True))

        answer()
        if timeout is not None:
            runtime.call_later(timeout, timed_out)

    def close_all(self, error: Any) -> None:
        """Under the lock, at shutdown: every stream ends with `error`."""
        for rec in list(self.by_id.values()):
            self.end(rec, error)
        self.by_id.clear()
