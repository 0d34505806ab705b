"""What runs inside each Monarch worker process, whatever runs there (tasks, actors): its store, its reports
to the controller (one FIFO: results, stream items, ref holds and releases), and the generators it streams.
Its task runner is tasks.py, its job context's client client.py; process.py puts them
together."""

from __future__ import annotations

import itertools
import os
import queue
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

# Loaded before any task: a worker's threads race in the first import of a package their values need, and numpy's
# cannot be retried once it failed halfway (its C module loads once per process), so a value of numpy's
# would fail to load there for good. Its BLAS sizes its threads now, from OMP_NUM_THREADS: a process on this
# machine starts with fray's default in its environment (ProcessPool.boot).
import numpy  # noqa: F401

from fray.backend import RECORDER, Blob, PathStats, capture_exception, device_stats, dumps, merge
from fray_monarch.core import import_path
from fray_monarch.core.calls import contained_ids
from fray_monarch.core.objects import RefPayload, Tracker, set_tracker
from fray_monarch.core.protocol import Inline, StreamItem, TaskResult, Value, WireValue, WorkerSetup
from fray_monarch.data.arena import reclaim_dead_segments, remove_segments, segment_prefix
from fray_monarch.data.store import ObjectStore
from fray_monarch.net import lifeline, network

# The release of a ref that left this process in an actor's reply waits this long before being sent: the reply goes
# through the caller's response port, not the report FIFO, and the release must not overtake the keep that the
# reply's registration adds. Every other release goes at once (the FIFO orders it after whatever carried the ref).
RELEASE_DELAY = 0.05
PUSH_EVENTS = ("events", None)  # an outbox item that only wakes the sender (an actor's call recorded events)
EVENTS_PUSH = 0.05  # seconds between pushes of a busy process's events
REPLY_MARGIN = 30.0  # a coordinator reply may take this long past the caller's own timeout before we give up

Report = TaskResult | StreamItem


def open_private_log(path: str) -> int:
    """The log file in the driver's private directory, for appending; /dev/null where that directory is not a
    private one of this user's (another host, where the same path may be anyone's) or the file is a symlink."""
    try:
        info = os.lstat(os.path.dirname(path))
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError:
        pass
    return os.open(os.devnull, os.O_WRONLY)


def _route_output(log_file: str | None) -> None:
    """Once per worker process. Its output goes to the driver's console (the fds it inherited), line-buffered so
    lines arrive as printed; with log_to_driver=false, fds 1 and 2 go to the context's log file instead (on a
    host where the driver's directory does not exist, nowhere)."""
    if log_file is not None:
        fd = open_private_log(log_file)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            pass


class WorkerRuntime:
    """One per worker process: its store, and the FIFO of its reports to the controller (results, stream items,
    ref holds and releases, sent in batches by one thread)."""

    def __init__(self, setup: WorkerSetup) -> None:
        import_path.take(setup.sys_path)  # the driver's, so user modules import here too (trusted entries only)
        RECORDER.label = "monarch worker"  # (how the timeline names this process)
        self.ctl_key, self.proc_key, self.coord = setup.ctl_key, setup.proc_key, setup.coord
        self.credential = setup.credential  # what each request to the coordinator carries (not the bare key)
        if setup.lifeline is not None:  # a process on another host: it ends when its driver ends
            prefix = segment_prefix(setup.ctl_key, setup.host_id)

            def driver_gone(address: str) -> None:
                remove_segments(prefix)  # the whole context is gone: every store file of it on this host too
                lifeline.end_process(address)

            lifeline.hold(*setup.lifeline, on_lost=driver_gone, name=setup.proc_key)
        _route_output(setup.log_file)
        self.bind = bind = setup.bind_host or network.route_address([setup.driver_host]) or "127.0.0.1"
        # ` ip=<host>` in output labels only where the context has several hosts (attached ones; local means one)
        self.label_host = bind if setup.host_id != "local" else None
        self.oids = itertools.count()
        reclaim_dead_segments()
        self.store = ObjectStore(
            setup.ctl_key,
            setup.host_id,
            setup.proc_key,
            setup.store_budget,
            bind,
            lambda oid: RefPayload(oid, arrived=True),
            setup.inline_limit,
            setup.transport,
            several_hosts=setup.host_id != "local",  # workers of attached hosts; local ones mean one host
        )
        self.lock = threading.Lock()
        self.outbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.streams: set[str] = set()  # streams producing here
        self.stop_streams: set[str] = set()  # ... whose consumer has gone: stop at the next item
        self.in_replies: set[str] = set()  # ids that left in an actor's reply (their release waits RELEASE_DELAY)
        self.stopped = False
        self.events_due: float | None = None  # when this process's new events are next pushed (fray.telemetry.events)
        self.events_pushed = 0.0  # when they last were
        set_tracker(Tracker(self._first, self._zero))
        threading.Thread(target=self._sender, name="fray-sender", daemon=True).start()

    # ------------------------------------------------------------ refs
    def _first(self, oid: str, arrived: bool) -> None:
        if arrived:
            self.outbox.put(("hold", oid))

    def _zero(self, oid: str) -> None:
        with self.lock:
            in_reply = oid in self.in_replies
            self.in_replies.discard(oid)
        if in_reply:
            self.outbox.put(("release_later", (time.monotonic() + RELEASE_DELAY, oid)))
        else:
            self.outbox.put(("release", oid))

    def _sender(self) -> None:
        releases: deque[tuple[float, str]] = deque()  # delayed ones, in deadline order (one fixed delay)
        while True:
            try:
                if self._send_once(releases):
                    return
            except BaseException:
                pass

    def _send_once(self, releases: deque[tuple[float, str]]) -> bool:
        timeout = max(0.0, releases[0][0] - time.monotonic()) if releases else None
        if self.events_due is not None:  # (wake to push the events of the last work, also if none follows)
            timeout = max(0.0, min(timeout if timeout is not None else EVENTS_PUSH, self.events_due - time.monotonic()))
        try:
            items = [self.outbox.get(timeout=timeout)]
        except queue.Empty:
            items = []
        while True:
            try:
                items.append(self.outbox.get_nowait())
            except queue.Empty:
                break
        results, holds, due, flushes = [], [], [], []
        for kind, value in items:
            if kind == "result":
                results.append(value)
            elif kind == "hold":
                holds.append(value)
            elif kind == "release":
                due.append(value)
            elif kind == "release_later":
                releases.append(value)
            elif kind == "flush":
                flushes.append(value)
            elif kind == "stop":
                _set_all(flushes)
                return True
        now = time.monotonic()
        while releases and releases[0][0] <= now:
            due.append(releases.popleft()[1])
        if self.stopped:  # the process is being stopped: sending now would panic inside Monarch (closed mailbox)
            _set_all(flushes)
            return True
        events = None
        if results and RECORDER.untaken:  # a task's end goes with its result: it arrives even if the process dies
            events = RECORDER.take().to_json()
            self.events_due, self.events_pushed = None, now
        if flushes:  # (someone waits until this batch is applied: sent as a call, answered once applied)
            try:
                self.coord.done.call_one(self.credential, results, holds, due, events).get(timeout=REPLY_MARGIN)
            finally:
                _set_all(flushes)
        elif events is not None:
            self.coord.done.broadcast(self.credential, results, holds, due, events)
        elif results or holds or due:
            self.coord.done.broadcast(self.credential, results, holds, due)
        if events is None:
            self._push_events(now)
        return False

    def _push_events(self, now: float) -> None:
        """The new events of an actor's calls (their replies go another way) go to the controller at most every
        EVENTS_PUSH seconds: a process that dies loses at most that much of them."""
        if not RECORDER.untaken:
            self.events_due = None
            return
        if self.events_due is None:
            self.events_due = max(now, self.events_pushed + EVENTS_PUSH)
        if now >= self.events_due:
            self.events_due, self.events_pushed = None, now
            self.coord.events.broadcast(self.credential, RECORDER.take().to_json())

    def events_recorded(self) -> None:
        """Events were recorded outside any report (an actor's call, whose reply goes another way): the sender
        wakes to push them within EVENTS_PUSH, unless a push is due already."""
        if self.events_due is None:
            self.outbox.put(PUSH_EVENTS)

    def apply_holds_now(self, contained: Sequence[str]) -> None:
        """Where a call's arguments carried refs (`contained`), return once the controller has applied every hold
        and release sent so far: an actor's reply goes through its caller's response port, not this FIFO, and
        must not overtake the holds of refs its call kept (the call's own keep of them ends with the reply)."""
        if not contained:
            return
        applied = threading.Event()
        self.outbox.put(("flush", applied))
        applied.wait(REPLY_MARGIN)

    def report(self, result: Report) -> None:
        """Send a result or stream item to the controller (in order, with the holds and releases around it)."""
        self.outbox.put(("result", result))

    def stop(self) -> None:
        self.stopped = True
        self.outbox.put(("stop", None))

    # ------------------------------------------------------------ values
    def new_oid(self) -> str:
        return f"{self.ctl_key}-{self.proc_key}.{next(self.oids)}"

    def encode(self, blob: Blob, oid: str) -> WireValue:
        """A value made here under `oid` (a task or method result): stored here when large."""
        return WireValue(self.store.encode(blob, oid), contained_ids(blob))

    def encode_reply(self, blob: Blob, oid: str) -> WireValue:
        """An actor method's return value: like encode, and the refs it carries are marked as having left in a
        reply (so their release here waits RELEASE_DELAY)."""
        wire = self.encode(blob, oid)
        if wire.contained:
            with self.lock:
                self.in_replies.update(wire.contained)
        return wire

    def register(self, blob: Blob) -> tuple[RefPayload, WireValue]:
        """A value made here that needs its own object (a put, or large call arguments): stored here when
        large, and entered in the controller's directory under an id chosen here."""
        oid = self.new_oid()
        payload = RefPayload(oid)
        wire = self.encode(blob, oid)
        self.coord.put.call_one(self.credential, oid, wire).get(timeout=REPLY_MARGIN).unwrap()
        return payload, wire

    def encode_call(self, blob: Blob) -> tuple[WireValue, RefPayload | None]:
        """A call's arguments: inline when small, else a registered object the call keeps alive."""
        if blob.nbytes < self.store.inline_limit and not blob.share_tokens():
            return WireValue(Inline.of(blob), contained_ids(blob)), None
        payload, wire = self.register(blob)
        return WireValue(wire.value, (*wire.contained, payload.id)), payload

    def load(self, value: Value, what: str = "a value") -> Any:
        return self.store.load(value, what)

    def transfer_stats(self) -> dict[str, PathStats]:
        return merge(self.store.stats.snapshot(), device_stats.snapshot())  # (CUDA tensors loaded here)

    # ------------------------------------------------------------ streams
    def produce(self, sid: str, make: Callable[[], Any], what: str) -> None:
        """Run a generator (make() returns it), reporting each item as it is produced, in order, through the same
        FIFO as results and ref holds. An exception becomes one last item holding it; then the end. Stops at the
        next item once the consumer has gone (stop_stream)."""
        index = 0
        gen: Any = None
        with self.lock:
            self.streams.add(sid)
        try:
            gen = make()
            if not hasattr(gen, "__next__"):
                if not hasattr(gen, "__iter__"):
                    raise TypeError(f"{what} is streamed but returned {type(gen).__name__}, not a generator")
                gen = iter(gen)
            while sid not in self.stop_streams:
                try:
                    value = next(gen)
                except StopIteration:
                    break
                oid = self.new_oid()
                blob = dumps(value, f"item {index} of {what}", copy=False, device_mode=self.store.device_mode)
                wire = self.encode(blob, oid)
                self.report(StreamItem(sid, index, oid, wire))
                index += 1
        except BaseException as exc:
            self.report(StreamItem(sid, index, self.new_oid(), error=capture_exception(exc)))
            index += 1
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                try:
                    close()  # runs the generator's finally blocks when it was stopped early
                except BaseException:
                    pass
            with self.lock:
                self.streams.discard(sid)
                self.stop_streams.discard(sid)
            self.report(StreamItem(sid, index, end=True))

    def stop_stream(self, sid: str) -> None:
        with self.lock:
            if sid in self.streams:
                self.stop_streams.add(sid)


def _set_all(flags: list[threading.Event]) -> None:
    for flag in flags:
        flag.set()
