"""Resource accounting and threads for the kit's backends (fray.kit).

Work waits until its resources are free, then runs on a worker thread. A worker that finishes a task and frees
resources runs the next ready work itself (no queue hop, no thread wake-up), which is most of in_memory's
throughput. A task blocked in get/wait hands its resources back while it waits (as Ray releases a blocked
task's CPU), so nested work cannot deadlock: a new thread is started whenever work is ready and none is idle.

One lock guards the ledger and the workers' counts (a task's state has a lock of its own), and a worker takes it
once a task, to release; a thread submitting while every CPU is taken stages its work without it (Ledger.submit).
Under the GIL a contended lock is a hand-over of the interpreter: a lock that also guarded the tasks' states,
taken several times a task, would convoy the submitting thread and the workers on it, and tiny tasks would run at
a fraction of a ThreadPoolExecutor's rate.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Optional

from fray.runtime.gpus import DevicePool
from fray.runtime.resources import EPS

Signature = tuple[tuple[str, float], ...]
Devices = tuple[int, ...]  # the GPUs a unit of work holds (fray.runtime.gpus)
# Told, under the ledger's lock, when a unit of work's resources are taken, and which GPUs it was given.
OnDispatch = Callable[[Devices], None]
# A unit of work returns the next unit to run on the same thread, if it freed resources that let one start.
Work = Callable[[], Optional["Work"]]

_IDLE_SECONDS = 30.0  # an idle worker thread exits after this long
_STOP: Any = object()  # queued once per thread at close: the thread exits


class Workers:
    """Threads pulling work from one queue. A new thread starts when queued work outnumbers the threads that are
    idle or finishing (a worker is marked finishing, in Ledger.release, before it publishes a result, so the
    caller's next submit, which that result wakes, does not start a thread the finishing one is about to free)."""

    def __init__(self, name: str, lock: threading.Lock) -> None:
        self._queue: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._lock = lock  # shared with the Ledger: one lock per scheduling step, not two
        self._idle = 0
        self._finishing = 0
        self._queued = 0
        self._name = name
        self._local = threading.local()
        self._closed = False
        self._alive = 0  # threads started and not exited

    def submit(self, work: Work) -> None:
        with self._lock:
            spawn = self.count_queued()
        self.put(work, spawn)

    def count_queued(self) -> bool:
        """(The caller holds the shared lock.) Count one more unit of work about to be put; True if it needs a new
        thread."""
        self._queued += 1
        return self._needs_thread()

    def _needs_thread(self) -> bool:  # holds the lock
        return self._queued > self._idle + self._finishing and not self._closed

    def put(self, work: Work, spawn: bool) -> None:
        """(Without the lock.) Queue work counted by count_queued, starting a thread if it said so."""
        self._queue.put(work)
        if spawn:
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._alive += 1
        threading.Thread(target=self._loop, name=self._name, daemon=True).start()

    def mark_finishing(self) -> None:
        """(The caller holds the shared lock.) This worker's work is done but for publishing it."""
        if not getattr(self._local, "finishing", False):
            self._local.finishing = True
            self._finishing += 1

    def _not_finishing(self) -> None:  # holds self._lock
        if getattr(self._local, "finishing", False):
            self._local.finishing = False
            self._finishing -= 1

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._not_finishing()
                self._idle += 1
            try:
                work = self._queue.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                work = _STOP
            if work is _STOP:
                with self._lock:
                    self._idle -= 1
                    self._alive -= 1
                return
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            while work is not None:  # (release marks this worker finishing only when it returns no next work)
                work = work()

    def close(self) -> None:
        """No new threads; every thread exits once its current work is done (idle ones at once)."""
        with self._lock:
            self._closed = True
            alive = self._alive
        for _ in range(alive):
            self._queue.put(_STOP)


class Ledger:
    """Free resources, and FIFO queues of work waiting for them (one queue per distinct request). A request for
    GPUs also needs devices that can hold it (`devices`: whole ones, or room on one for a fraction)."""

    def __init__(self, totals: Mapping[str, float], devices: DevicePool | None = None) -> None:
        self.totals = dict(totals)
        self._free = dict(totals)
        self.devices = devices if devices is not None else DevicePool(range(round(totals.get("GPU", 0.0))))
        self._queues: dict[Signature, deque[tuple[Work, OnDispatch | None]]] = {}
        self.lock = threading.Lock()  # also guards the state of the tasks it schedules (see InMemoryJobContext)
        self._lock = self.lock
        self.workers = Workers("fray-kit-worker", self._lock)
        self._closed = False
        # Work submitted while its resources were all taken, not yet in a queue: appended without the lock (see
        # submit), moved into the queues by the next release (or by submit itself, if they freed meanwhile).
        self._staged: deque[tuple[Signature, Work, OnDispatch | None]] = deque()

    def _fits(self, request: Signature) -> bool:
        free = self._free
        for key, qty in request:  # a loop, not all() over a generator: it runs twice a submit
            if free.get(key, 0.0) + EPS < qty:  # fray.runtime.resources' tolerance
                return False
            if key == "GPU" and self.devices.choose(qty) is None:  # enough in all, but not on devices that fit
                return False
        return True

    def _take(self, request: Signature) -> Devices:
        devices: Devices = ()
        for key, qty in request:
            self._free[key] = self._free.get(key, 0.0) - qty
            if key == "GPU":
                devices = self.devices.take(qty) or ()
        return devices

    def submit(self, request: Signature, work: Work, on_dispatch: OnDispatch | None = None) -> None:
        """Run `work` on a worker once `request` fits; the work must call release(request, devices) when done.
        `on_dispatch(devices)` runs under the ledger's lock at the moment the resources are taken for it, with
        the GPUs it holds (() without any)."""
        if self._closed:
            raise RuntimeError("the context is shut down")
        if not self._fits(request):
            # Its resources are all taken, so a worker will release some: leave the work for that release
            # instead of taking the lock, which the workers take several times a task. A thread submitting
            # thousands of tiny tasks otherwise queues behind them for the lock (a lock convoy: many of the
            # acquisitions block, each a hand-over of the GIL). Checked again once staged: a release
            # that freed them meanwhile may have come before the work was staged.
            self._staged.append((request, work, on_dispatch))
            if self._fits(request):
                self._kick()
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("the context is shut down")
            self._unstage()
            if self._queues.get(request) or not self._fits(request):
                self._queues.setdefault(request, deque()).append((work, on_dispatch))
                return
            devices = self._take(request)
            if on_dispatch is not None:
                on_dispatch(devices)
            spawn = self.workers.count_queued()
        self.workers.put(work, spawn)

    def release(self, request: Signature, finishing: bool = False, devices: Devices = ()) -> Work | None:
        """Give resources (and the GPUs `devices`) back; return one unit of work that can now start, for the
        caller to run itself. finishing=True also marks the calling worker as about to be free (see Workers)."""
        with self._lock:
            for key, qty in request:
                self._free[key] = self._free.get(key, 0.0) + qty
                if key == "GPU" and devices:
                    self.devices.give(devices, qty)
            ready = self._drain() if self._queues or self._staged else []
            if finishing and not ready:  # (a worker that runs the next work itself stays busy: not finishing)
                self.workers.mark_finishing()
            spawns = [self.workers.count_queued() for _ in ready[1:]]
        for work, spawn in zip(ready[1:], spawns, strict=True):
            self.workers.put(work, spawn)
        return ready[0] if ready else None

    def give_back(self, request: Signature, devices: Devices = ()) -> None:
        """Release from a thread that will not run the next work itself (it is about to block, or is no worker)."""
        work = self.release(request, devices=devices)
        if work is not None:
            self.workers.submit(work)

    def reacquire(self, request: Signature) -> None:
        """Take resources back after a blocking get, even past the total for a moment (no waiting, as in Ray)."""
        with self._lock:
            self._take(request)

    def _kick(self) -> None:
        """Start whatever fits now (staged work whose resources were freed while it was staged)."""
        with self._lock:
            ready = self._drain()
            spawns = [self.workers.count_queued() for _ in ready]
        for work, spawn in zip(ready, spawns, strict=True):
            self.workers.put(work, spawn)

    def _unstage(self) -> None:  # holds the lock: staged work joins the queues, in the order it came
        while self._staged:
            request, work, on_dispatch = self._staged.popleft()
            self._queues.setdefault(request, deque()).append((work, on_dispatch))

    def _drain(self) -> list[Work]:
        self._unstage()
        ready = []
        for request, waiting in list(self._queues.items()):
            while waiting and self._fits(request):
                devices = self._take(request)
                work, on_dispatch = waiting.popleft()
                if on_dispatch is not None:
                    on_dispatch(devices)
                ready.append(work)
            if not waiting:
                del self._queues[request]
        return ready

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queues.clear()
            self._staged.clear()
        self.workers.close()


def signature(resources: Mapping[str, float]) -> Signature:
    return tuple(sorted(resources.items()))


def lendable(request: Signature) -> Signature:
    """What work blocked in get/wait hands back while it waits: all but its GPUs (as Ray keeps a blocked task's
    GPUs: its device memory is still in use)."""
    return tuple(item for item in request if item[0] != "GPU")
