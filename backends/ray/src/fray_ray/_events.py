"""Moving the events that Ray workers record (fray.telemetry.events) to the driver, through Ray's GCS key-value store.

Why the GCS KV: every process of a Ray cluster (the driver, each worker, on every node) already holds a
connection to the GCS, in fray's private Ray as in a cluster fray joined. Writing there needs no actor, process
or port of fray's own, and reading it never unpickles anything: a chunk is the JSON of `ProcessEvents.to_json()`.

A worker process (`start_worker`, when its fray context is made): a daemon thread sleeps on a threading.Event
until a task or actor call starts or ends there (`wake`: one attribute read once it is awake, so nothing is paid
per task beyond that and nothing at all while the worker is idle); first it sends what the process recorded
before it ran (its worker.start), a flush not counted in the rate below, so that the process's first task or call
goes at once too (a killed actor's events are lost unless sent before the kill). Woken, it waits out what is left of
FLUSH_PERIOD since its previous flush (at most 1/FLUSH_PERIOD flushes a second however many tasks run) and puts
the events recorded since its cursor, at most CHUNK_EVENTS a chunk, under the namespace `fray-events-<Ray job
id>` (a driver's own: concurrent drivers of a cluster never read each other's) and the key
`<host>/<pid>/<chunk number>`. At most WINDOW of its chunks wait unread: past that it writes nothing until the
driver reads (it tries again every FLUSH_PERIOD, doubling up to MAX_RETRY seconds, one existence check a try);
its ring keeps the events meanwhile and, once it overflows, the next chunk says how many were lost.

The driver (`pull`): lists the job's keys, reads the chunks (MAX_PULL at most, in multi-gets of a few MB),
deletes what it read, and gives the batches, each worker's in order. A task's end event is in its worker's ring
before `get` returns its result, and in the KV at most FLUSH_PERIOD (plus a put) after that (unless its worker
is blocked, above): so `settle` waits, before a pull, until FLUSH_PERIOD + MARGIN has passed since the driver's
last get or wait returned (0.3 s at most, and nothing when that is past). A worker that dies before its flush
loses the events it had not sent (a killed actor's last call), which the driver's own events (the kill, with
its reason) stand in for.

FRAY_EVENTS=0 in the driver also turns recording off in workers that did not inherit its environment (a
cluster fray joined): the driver puts DISABLED_KEY in its namespace, and a worker's thread, seeing it at start,
turns its recorder off and ends.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ray.experimental import internal_kv

from fray.backend import RECORDER, ProcessEvents

__all__ = ["FLUSH_PERIOD", "namespace", "pull", "settle", "start_worker", "wake"]

FLUSH_PERIOD = 0.2  # a worker flushes at most this often (seconds)
MARGIN = 0.1  # the driver's allowance for a put to land after a flush
CHUNK_EVENTS = 4096  # events per chunk (one KV value of JSON)
WINDOW = 16  # a worker's chunks waiting unread at most
MAX_RETRY = 5.0  # seconds between a blocked worker's tries, at most
MAX_PULL = 256  # chunks the driver reads in one pull, at most (~1M events: twice its store's capacity)
_READ_BATCH = 8  # chunks in one multi-get
DISABLED_KEY = b"disabled"
_PREFIX = b"w/"


def namespace(job_id: str) -> str:
    return f"fray-events-{job_id}"


# --------------------------------------------------------------------------------------- in a worker
def _never() -> None:
    return None


wake: Callable[[], None] = _never  # this process's flusher's wake (a no-op until one is started)
_flusher: _Flusher | None = None
_start_lock = threading.Lock()


def start_worker(job_id: str, label: str = "ray worker") -> None:
    """In a Ray worker process (once): label its events and start the thread that sends them to the driver."""
    global _flusher, wake
    with _start_lock:
        if _flusher is not None or not RECORDER.enabled:
            return
        RECORDER.label = label
        _flusher = _Flusher(namespace(job_id))
        wake = _flusher.wake
        _flusher.start()


class _Flusher:
    def __init__(self, ns: str) -> None:
        self._ns = ns
        self._woken = threading.Event()
        self._prefix = f"w/{socket.gethostname()}/{os.getpid()}/"
        self._chunk = 0
        self._last = 0.0

    def start(self) -> None:
        threading.Thread(target=self._run, name="fray-ray-events", daemon=True).start()

    def wake(self) -> None:
        woken = self._woken
        if not woken.is_set():
            woken.set()

    def _run(self) -> None:
        try:
            if internal_kv._internal_kv_exists(DISABLED_KEY, namespace=self._ns):
                RECORDER.enabled = False  # the driver runs with FRAY_EVENTS=0
                return
        except Exception:  # Ray going away
            return
        try:  # what the process recorded before this thread ran (its worker.start): at once, and not counted as a
            self.flush()  # flush (the first task's or call's events then go at once too, as a killed actor's must)
        except Exception:
            pass
        retry: float | None = None  # while something is left unsent: when to try again without a wake
        while True:
            self._woken.wait(retry)
            pause = self._last + FLUSH_PERIOD - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._woken.clear()
            self._last = time.monotonic()
            try:
                sent = self.flush()
            except Exception:  # the GCS did not take it: the events stay in the ring for the next flush
                sent = False
            # the driver is not reading (or the GCS failed): try again, less and less often
            retry = None if sent else min(MAX_RETRY, 2 * retry if retry else FLUSH_PERIOD)

    def flush(self) -> bool:
        """Put what is new; False if the driver is not reading (WINDOW chunks wait): the ring keeps the events
        meanwhile (and counts what falls out of it before it is taken)."""
        if not RECORDER.untaken:
            return True
        if self._chunk >= WINDOW and internal_kv._internal_kv_exists(
            self._key(self._chunk - WINDOW), namespace=self._ns
        ):
            return False
        batch = RECORDER.take()  # (each event once, in seq order; a late append waits for the next flush)
        for start in range(0, len(batch.events), CHUNK_EVENTS):
            part = ProcessEvents(
                batch.host,
                batch.pid,
                batch.label,
                batch.threads,
                batch.events[start : start + CHUNK_EVENTS],
                batch.dropped,
            )
            value = json.dumps(part.to_json(), separators=(",", ":"), default=str).encode()
            internal_kv._internal_kv_put(self._key(self._chunk), value, overwrite=True, namespace=self._ns)
            self._chunk += 1
        return not RECORDER.untaken

    def _key(self, chunk: int) -> bytes:
        return f"{self._prefix}{chunk:09d}".encode()


# --------------------------------------------------------------------------------------- in the driver
def disable_workers(ns: str) -> None:
    """The driver records nothing (FRAY_EVENTS=0): neither do its workers."""
    internal_kv._internal_kv_put(DISABLED_KEY, b"1", overwrite=True, namespace=ns)


def settle(last_result_at: float) -> None:
    """Wait until the workers have flushed what they recorded before `last_result_at` (time.monotonic() when the
    driver's last get or wait returned): at most FLUSH_PERIOD + MARGIN."""
    pause = last_result_at + FLUSH_PERIOD + MARGIN - time.monotonic()
    if pause > 0:
        time.sleep(min(pause, FLUSH_PERIOD + MARGIN))


def pull(ns: str) -> list[ProcessEvents]:
    """The chunks the workers put in `ns` (MAX_PULL at most, each worker's oldest first; the rest next time),
    read and deleted, as batches (each worker's in its order). A chunk that does not parse is dropped."""
    keys = internal_kv._internal_kv_list(_PREFIX, namespace=ns)
    if not keys:
        return []
    keys = sorted(keys, key=_chunk_order)[:MAX_PULL]
    client: Any = internal_kv.internal_kv_get_gcs_client()  # type: ignore[no-untyped-call]
    out = []
    for i in range(0, len(keys), _READ_BATCH):  # one multi-get of a few MB at most
        batch = keys[i : i + _READ_BATCH]
        values = client.internal_kv_multi_get(batch, ns.encode())
        for key in batch:
            value = values.get(key)
            internal_kv._internal_kv_del(key, namespace=ns)
            if value is None:
                continue
            try:
                out.append(ProcessEvents.from_json(json.loads(value)))
            except ValueError:
                continue
    return out


def _chunk_order(key: bytes) -> tuple[int, bytes]:
    """(chunk number, worker): each worker's oldest chunks first, its own in order."""
    worker, _, number = key.rpartition(b"/")
    try:
        return int(number), worker
    except ValueError:
        return 0, key


def forget(ns: str) -> None:
    """Delete whatever is left in `ns` (at the driver's shutdown: nothing lingers in a cluster it joined)."""
    internal_kv._internal_kv_del(b"", del_by_prefix=True, namespace=ns)
