"""The service worker processes call (through the Coordinator actor in the driver): get and wait on objects,
register their own values, report results and ref holds. A part of the Controller.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fray.outcome import first_failure
from fray_monarch import _runtime
from fray_monarch.directory import ObjectDirectory
from fray_monarch.protocol import Reply, StreamItem, TaskResult, WireValue
from fray_monarch.scheduler import Proc


def _send(port: Any, message: Any) -> None:
    """Reply to a worker; it may have died meanwhile (nothing to tell then)."""
    try:
        port.send(message)
    except Exception:
        _runtime.log.debug("fray: reply to a gone worker dropped", exc_info=True)


class _Once:
    """Whoever takes it first answers (a completion, or the timeout)."""

    __slots__ = ("_lock", "taken")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = False

    def take(self) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        self.taken = True
        return True


class WorkerService:
    """Requests from worker processes (mixed into the Controller)."""

    lock: threading.RLock
    objects: ObjectDirectory
    procs: list[Proc]

    if TYPE_CHECKING:  # provided by the Controller or its other parts

        def _pump(self) -> None: ...
        def _task_result(self, proc_key: str, result: TaskResult) -> None: ...
        def _stream_item(self, proc_key: str, item: StreamItem) -> None: ...

    def _blocked(self, proc_key: str, delta: int) -> None:
        for proc in self.procs:
            if proc.key == proc_key:
                proc.blocked += delta
                if delta < 0:
                    self._pump()

    def get_remote(self, port: Any, proc_key: str, oids: list[str], timeout: float | None) -> None:
        """A worker's get: the values' locators once all are done, or the first failure in list order as soon as
        one has failed (as the driver's get), or timed_out."""
        entries = [self.objects.get(o) for o in oids]
        once = _Once()

        def reply() -> None:
            if not once.take():
                return
            with self.lock:
                self._blocked(proc_key, -1)
            failed = first_failure([e.outcome for e in entries])
            if failed is not None:
                _send(port, Reply(error=entries[failed].error))
            else:
                _send(port, Reply([e.value for e in entries]))

        def timed_out() -> None:
            if once.take():
                cancel()
                with self.lock:
                    self._blocked(proc_key, -1)
                _send(port, Reply(timed_out=True))

        with self.lock:
            self._blocked(proc_key, +1)
            self._pump()
        cancel = self.objects.when(entries, len(entries), reply, stop_on_failure=True)
        if timeout is not None and not once.taken:
            _runtime.call_later(timeout, timed_out)

    def wait_remote(self, port: Any, proc_key: str, oids: list[str], num_returns: int, timeout: float | None) -> None:
        entries = [self.objects.get(o) for o in oids]
        once = _Once()

        def reply() -> None:
            if once.take():
                with self.lock:
                    self._blocked(proc_key, -1)
                _send(port, Reply([i for i, e in enumerate(entries) if e.outcome.done()]))

        def timed_out() -> None:
            cancel()
            reply()

        with self.lock:
            self._blocked(proc_key, +1)
            self._pump()
        cancel = self.objects.when(entries, num_returns, reply)
        if timeout is not None and not once.taken:
            _runtime.call_later(timeout, timed_out)

    def put_remote(self, proc_key: str, oid: str, wire: WireValue) -> str:
        """A value made by a worker (its put, or large call arguments), under the id the worker chose."""
        with self.lock:
            entry, _ = self.objects.new(oid)
            entry.remote[proc_key] = 1
            self.objects.complete(entry, wire.value, None, wire.contained)
            return oid

    def on_worker_report(self, proc_key: str, results: list[TaskResult], holds: list[str], releases: list[str]) -> None:
        with self.lock:
            self.objects.hold(proc_key, holds)
            for result in results:
                try:
                    if isinstance(result, StreamItem):
                        self._stream_item(proc_key, result)
                    else:
                        self._task_result(proc_key, result)
                except Exception:
                    _runtime.log.exception("fray: bad report %s", result)
            self.objects.release(proc_key, releases)
            self._pump()
