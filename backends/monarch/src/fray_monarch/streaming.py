"""Streams, a part of the Controller: the items of a streaming task or actor method, each an object of the
directory, handed to the consumer in order as the producer reports them.

A producer (a task thread in a worker, or an actor host) runs the generator and reports every item as a
`StreamItem` through its process's report FIFO (the same path as task results and ref holds, so an item's holds
are never overtaken). A large item stays in the producer's store, like any result. The consumer reads through an
`ObjectRefStream` whose source is `DriverStream` in the driver, or `RemoteStream` (worker_runtime.py) in a
worker, which asks the coordinator for the next item. Closing the stream tells the producer's process to stop
the generator at its next item (WorkerHost.stop_stream).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fray.errors import ActorDiedError, ActorUnavailableError, GetTimeoutError
from fray.refs import ObjectRef
from fray.states import ActorState, TaskState
from fray_monarch import _runtime
from fray_monarch.directory import ObjectDirectory
from fray_monarch.objects import RefPayload
from fray_monarch.protocol import Reply, StreamItem

if TYPE_CHECKING:
    from fray_monarch.actor_registry import ActorRec
    from fray_monarch.scheduler import Proc, Task

BACKEND = "monarch"


class StreamRec:
    """One stream in the controller: items produced and not yet handed to the consumer (None = the end)."""

    def __init__(self, sid: str) -> None:
        self.id = sid
        self.cond = threading.Condition()
        self.items: deque[RefPayload | None] = deque()
        self.received = 0  # items reported by the producer so far
        self.ended = False  # the end is queued: nothing more will come
        self.closed = False  # the consumer has gone
        self.task: Task | None = None  # the streaming task, or
        self.actor: ActorRec | None = None  # the actor whose method streams
        self.actor_restarts = 0
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
    """The StreamSource of a stream consumed in the driver."""

    def __init__(self, ctl: Any, rec: StreamRec) -> None:
        self.ctl = ctl
        self.rec = rec

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        if not self.rec.wait(None if timeout is None else max(0.0, timeout)):
            raise GetTimeoutError(f"no next item of the stream within {timeout} s")
        _, payload = self.rec.take()
        return None if payload is None else ObjectRef(payload, BACKEND)

    def close(self) -> None:
        self.ctl.close_stream(self.rec.id)


class StreamRegistry:
    """The stream half of the Controller (mixed into it; `streams` is set by Controller.__init__)."""

    lock: threading.RLock
    objects: ObjectDirectory
    streams: dict[str, StreamRec]
    procs: list[Proc]
    tasks: dict[str, Task]
    queue: deque[Task]

    if TYPE_CHECKING:  # provided by the Controller or its other parts

        def new_oid(self) -> str: ...
        def actor(self, aid: str) -> ActorRec: ...
        def _finish_task(self, task: Task, value: Any, error: Any, contained: tuple[str, ...] = ()) -> None: ...

    def open_stream(self, sid: str) -> StreamRec:
        """Under the lock."""
        rec = self.streams[sid] = StreamRec(sid)
        return rec

    def stream_source(self, sid: str) -> DriverStream:
        return DriverStream(self, self.streams[sid])

    def _producer(self, rec: StreamRec) -> Proc | None:
        if rec.task is not None:
            return rec.task.proc
        if rec.actor is not None:
            return rec.actor.proc
        return None

    def _stream_item(self, proc_key: str, item: StreamItem) -> None:
        """Under the lock: the producer in proc_key reported one item (or the end)."""
        rec = self.streams.get(item.stream)
        if item.end:
            task = rec.task if rec is not None else self.tasks.get(item.stream)
            if task is not None and task.proc is not None and task.proc.key == proc_key:
                task.proc.outstanding.discard(task.id)
                self._finish_task(task, None, None)
            if rec is not None:
                self._end_stream(rec)
            return
        entry, payload = self.objects.new(item.oid)  # its owner is the producer (a large value stays there)
        if item.error is not None:
            self.objects.complete(entry, None, item.error)
        elif item.value is not None:
            self.objects.complete(entry, item.value.value, None, item.value.contained)
        if rec is None or rec.ended:
            return  # nobody reads it any more: dropping the payload frees it
        rec.received += 1
        rec.keep = []  # the producer has its arguments
        if not rec.closed:
            rec.push(payload)
        elif not rec.stop_sent:  # closed before it started: stop it now
            self._stop_producer(rec, next((p for p in self.procs if p.key == proc_key), None))

    def _end_stream(self, rec: StreamRec, error: Any = None) -> None:
        """Under the lock: no more items; with `error`, one last item that raises it."""
        if rec.ended:
            return
        if error is not None and not rec.closed:
            entry, payload = self.objects.new(self.new_oid())
            self.objects.complete(entry, None, error)
            rec.push(payload)
        rec.ended = True
        rec.keep = []
        rec.push(None)
        if rec.closed:
            self.streams.pop(rec.id, None)

    def _stream_task_failed(self, task: Task, error: Any) -> None:
        """Under the lock: a streaming task ended without reporting its end (cancelled, crashed, deps failed)."""
        rec = self.streams.get(task.id)
        if rec is not None:
            self._end_stream(rec, error)

    def stream_started(self, sid: str) -> bool:
        rec = self.streams.get(sid)
        return rec is not None and rec.received > 0

    def close_stream(self, sid: str) -> None:
        """The consumer has gone: drop what it did not read, and stop the producer at its next item."""
        with self.lock:
            rec = self.streams.get(sid)
            if rec is None or rec.closed:
                return
            rec.closed = True
            with rec.cond:
                unread = [p for p in rec.items if p is not None]
                rec.items = deque([None]) if rec.ended else deque()
            del unread  # their objects are freed
            if rec.ended:
                self.streams.pop(sid, None)
                return
            task = rec.task
            if task is not None and task.state in (TaskState.WAITING, TaskState.QUEUED):  # never started: it never will
                if task in self.queue:
                    self.queue.remove(task)
                self._finish_task(task, None, None)
                self._end_stream(rec)
                return
            self._stop_producer(rec, self._producer(rec))

    def _stop_producer(self, rec: StreamRec, proc: Proc | None) -> None:
        """Under the lock: tell the producer's process to stop the generator at its next item."""
        if proc is None or not proc.alive:
            return
        rec.stop_sent = True
        try:
            proc.worker.stop_stream.broadcast(rec.id)
        except Exception:
            _runtime.log.debug("fray: stop of stream %s not sent", rec.id, exc_info=True)

    # ------------------------------------------------------------ actor streams
    def call_actor_stream(
        self, aid: str, method: str, args: Any, deps: list[str], keep: list[Any], proc_key: str | None = None
    ) -> str:
        with self.lock:
            actor = self.actor(aid)
            sid = self.new_oid()
            rec = self.open_stream(sid)
            rec.actor = actor
            rec.actor_restarts = actor.restarts
            if actor.state == ActorState.DEAD:
                self._end_stream(rec, ActorDiedError(f"actor {actor.label} is dead: {actor.reason}"))
                return sid
            rec.keep = keep
            fut = actor.mesh.call_stream.call_one(sid, method, args, deps)
        _runtime.on_done(fut, lambda _v, exc, r=rec: self._actor_stream_reply(r, exc))
        return sid

    def call_actor_stream_remote(self, proc_key: str, aid: str, method: str, args: Any, deps: list[str]) -> str:
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.call_actor_stream(aid, method, args, deps, keep, proc_key)

    def _actor_stream_reply(self, rec: StreamRec, exc: BaseException | None) -> None:
        """The actor's answer to the stream call: only its failure matters (items and the end come through the
        report FIFO); a process that died mid-stream ends the stream with the actor's error."""
        if exc is None:
            return
        with self.lock:
            if rec.ended:
                return
            actor = rec.actor
            assert actor is not None
            restarted = actor.restarts > rec.actor_restarts
            if not restarted and (actor.state == ActorState.DEAD or not actor.can_restart):
                error: Exception = ActorDiedError(f"actor {actor.label} died: {actor.reason or 'its process crashed'}")
            else:
                error = ActorUnavailableError(
                    f"actor {actor.label}: its process crashed during this stream; it is restarting"
                )
            self._end_stream(rec, error)

    # ------------------------------------------------------------ consumers in workers
    def stream_next_remote(self, port: Any, proc_key: str, sid: str, timeout: float | None) -> None:
        """A worker's next_ref: answer with the next item's id (the worker's hold counted), None at the end, or
        timed_out."""
        from fray_monarch.service import _send

        rec = self.streams.get(sid)
        if rec is None:
            _send(port, Reply(None))
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
                    entry = self.objects.entries.get(payload.id)
                    if entry is not None:
                        entry.remote[proc_key] = entry.remote.get(proc_key, 0) + 1
            _send(port, Reply(None if payload is None else payload.id))

        def timed_out() -> None:
            if once.acquire(blocking=False):
                with rec.cond:
                    if rec.listener is answer:
                        rec.listener = None
                _send(port, Reply(timed_out=True))

        answer()
        if timeout is not None:
            _runtime.call_later(timeout, timed_out)
