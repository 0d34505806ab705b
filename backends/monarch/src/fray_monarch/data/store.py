"""The per-process object store: large values live in shared memory with the process that made them.

Owner side: arena.py. Reader on the same fray host: mappings.py (zero-copy, read-only or copy-on-write). Reader
on another fray host: the bytes are pulled from the owner (transfer.py: direct TCP, split over parallel streams
when large, each part tagged or the whole over TLS, or Monarch's RDMABuffer) into an allocation of the reader's
own arena, private to that reader.
Every read is counted by path in `stats` (fray.telemetry.transfers).
"""

from __future__ import annotations

import ctypes
import hmac
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fray.backend import SHARED, STAGED, Blob, TransferStats, loads, loads_data
from fray.backend import align as _align
from fray.errors import ObjectLostError, ObjectStoreFullError
from fray_monarch.core.protocol import Inline, Span, Stored, Value
from fray_monarch.data import transfer_tls
from fray_monarch.data.arena import Arena, Lease, open_segment
from fray_monarch.data.mappings import map_table
from fray_monarch.data.transfer import (
    IO_TIMEOUT,
    STREAM_MIN,
    STREAMS,
    Connections,
    TransferServer,
    choose_transport,
    fetch,
    pickle_digest,
    value_rdma_path,
    why,
)

# A pickle stream up to this size rides in the locator (a numpy array's or a tensor's is a few hundred bytes);
# a larger one (a large value pickled in band) stays in the allocation, its digest in the locator.
PICKLE_IN_LOCATOR = 64 * 1024

log = logging.getLogger("fray_monarch")


class ObjectStore:
    """One per process: puts large values in its arena, loads values of any host (and counts how)."""

    def __init__(
        self,
        ctl: str,
        host: str,
        owner: str,
        budget: int,
        bind_host: str,
        pin: Callable[[str], Any],
        inline_limit: int,
        transport: str = "auto",
        several_hosts: bool = False,
    ) -> None:
        self.ctl, self.host, self.owner = ctl, host, owner
        # transport=tls: this process's TLS identity on both ends of the data plane (else a tag on each part)
        self.tls = transfer_tls.contexts() if several_hosts and transport == "tls" else None
        self.arena = Arena(ctl, host, budget)
        self.bind_host = bind_host
        self.pin = pin  # oid -> an object holding a ref to it (kept alive by mappings of that object)
        self.inline_limit = inline_limit
        self.stats = TransferStats()
        self.server: TransferServer | None = None
        self.server_lock = threading.Lock()
        self.conns = Connections(self.tls.client if self.tls is not None else None)
        self.pool: ThreadPoolExecutor | None = None
        # With one fray host (no hosts= spec) every read is shm: nothing to register for RDMA.
        self.rdma = choose_transport(transport) if several_hosts else None
        self.several_hosts = several_hosts  # else no reader is on another host: no transfer server at all
        # How device values are serialized here: with one host every reader is a process of this one, and reads a
        # share of the producer's device snapshot (fray.runtime.device_shares); with several, their bytes travel.
        self.device_mode = STAGED if several_hosts else SHARED
        self.share_tokens: dict[int, list[Any]] = {}  # alloc -> what keeps its value's device snapshots served
        self.rdma_buffers: dict[int, Any] = {}
        self.decided: set[str] = set()

    # ----------------------------------------------------------- owner
    def encode(self, blob: Blob, oid: str | None) -> Value:
        """The value to send for blob: inline below the limit (or without an oid to pin), else stored here. A
        value that refers to device snapshots of this process is stored here whatever its size: its allocation
        keeps them served, until it is freed."""
        if oid is None or (blob.nbytes < self.inline_limit and not blob.share_tokens()):
            return Inline.of(blob)
        return self.put(blob, oid)

    def put(self, blob: Blob, oid: str) -> Stored:
        sizes = [len(blob.data)] + [memoryview(b).nbytes for b in blob.buffers]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += _align(n)
        aid, chunk, base = self.arena.alloc(total)
        tokens = blob.share_tokens()
        if tokens:
            self.share_tokens[aid] = tokens
        view = chunk.view
        view[base : base + sizes[0]] = blob.data
        for off, n, buf in zip(offsets[1:], sizes[1:], blob.buffers, strict=True):
            view[base + off : base + off + n] = memoryview(buf).cast("B")
        spans = [Span(o, n) for o, n in zip(offsets, sizes, strict=True)]
        server = self._server() if self.several_hosts else None
        in_locator = sizes[0] <= PICKLE_IN_LOCATOR
        rdma = None
        if self.rdma is not None:
            from monarch.rdma import RDMABuffer

            rdma = self.rdma_buffers[aid] = RDMABuffer(view[base : base + total])
        return Stored(
            oid=oid,
            host=self.host,
            owner=self.owner,
            address=server.address if server is not None else "",
            capability=server.capability(aid, chunk.name, base, total) if server is not None else b"",
            segment=chunk.name,
            offset=base,
            length=total,
            data=spans[0],
            buffers=tuple(spans[1:]),
            private=blob.private,
            alloc=aid,
            pickle=bytes(blob.data) if in_locator else None,
            digest=pickle_digest(blob.data) if not in_locator and self.several_hosts else b"",
            rdma=rdma,
        )

    def _server(self) -> TransferServer:
        with self.server_lock:
            if self.server is None:
                self.server = TransferServer(self.arena, self.bind_host, self.tls.server if self.tls else None)
            return self.server

    def free(self, allocs: list[int]) -> None:
        for aid in allocs:
            self.share_tokens.pop(aid, None)
            rdma = self.rdma_buffers.pop(aid, None)
            if rdma is not None:
                try:
                    rdma.drop()
                except Exception:
                    log.debug("fray: RDMA buffer drop failed", exc_info=True)
            self.arena.free(aid)

    # ----------------------------------------------------------- reader
    def load_inline(self, data: bytes, what: str) -> Any:
        """load(Inline(data)) of a value with no buffers, without making the Inline (an actor call's arguments)."""
        start = time.perf_counter()
        result = loads_data(data, (), what)
        self.stats.record("inline", len(data), time.perf_counter() - start)
        return result

    def load(self, value: Value, what: str = "a value") -> Any:
        start = time.perf_counter()
        if isinstance(value, Inline):
            result = loads_data(value.data, value.buffers, what)
            self.stats.record("inline", value.nbytes, time.perf_counter() - start)
            return result
        if value.host == self.host:
            blob = self._map(value)
            path = "shm"
        elif value.rdma is not None:
            blob, path = self._read_rdma(value), value_rdma_path()
        else:
            blob, path = self._pull(value), "tcp-direct"
        if path != "shm" and value.host not in self.decided:
            self.decided.add(value.host)
            log.info("fray: host %s reads values of host %s by %s (%s)", self.host, value.host, path, why(path))
        result = loads(blob, what)
        self.stats.record(path, value.nbytes, time.perf_counter() - start, f"{value.host}/{value.owner}")
        return result

    def _map(self, value: Stored) -> Blob:
        pin = self.pin(value.oid)
        try:
            fd = open_segment(value.segment)
        except FileNotFoundError:
            raise ObjectLostError(f"object {value.oid} is lost: its store file is gone (owner process died)") from None
        try:  # (the store file is this user's, in a private directory: its bytes are as trusted as the locator)
            data = value.pickle
            if data is None:
                data = os.pread(fd, value.data.length, value.offset + value.data.offset)
        finally:
            os.close(fd)
        spans = [(value.offset + span.offset, span.length, i in value.private) for i, span in enumerate(value.buffers)]
        views = map_table.views(value.segment, [sp for sp in spans if sp[1] > 0], pin)
        buffers: list[Any] = [views.pop(0) if sp[1] > 0 else b"" for sp in spans]
        return Blob(data, buffers)

    def _pull(self, value: Stored) -> Blob:
        """Copy the whole allocation from its owner into private memory here (parallel streams when large)."""
        if not value.address:
            raise ObjectLostError(f"object {value.oid} is on host {value.host}, whose owner serves no reads")
        target = self._landing(value.length)
        if value.length >= STREAM_MIN:
            step = _align(-(-value.length // STREAMS))
            parts = [(o, min(step, value.length - o)) for o in range(0, value.length, step)]
            if self.pool is None:
                self.pool = ThreadPoolExecutor(STREAMS, thread_name_prefix="fray-pull")
            for fut in [self.pool.submit(fetch, self.conns, value, o, n, target) for o, n in parts]:
                fut.result()
        else:
            fetch(self.conns, value, 0, value.length, target)
        return self._blob_of(value, target)

    def _landing(self, length: int) -> memoryview:
        """Private memory for a copy pulled from another host: an allocation of this process's arena (its pages
        are reused, already faulted in, where fresh memory pays a page fault for each page), freed when the
        last view of it is gone; anonymous memory if the store is full."""
        try:
            aid, chunk, offset = self.arena.alloc(length)
        except ObjectStoreFullError:
            return memoryview(mmap.mmap(-1, max(length, 1)))
        raw = (ctypes.c_ubyte * max(length, 1)).from_buffer(chunk.map, offset)
        raw.lease = Lease(self.arena, aid)  # type: ignore[attr-defined]
        map_table.arenas.add(self.arena)
        return memoryview(raw).cast("B")

    @staticmethod
    def _blob_of(value: Stored, target: memoryview) -> Blob:
        """A value's blob over a private copy of its allocation: torch storages writable, the rest read-only. The
        pickle stream is the locator's, or the copied one once it matches the locator's digest: bytes that came
        over a network are never unpickled unchecked."""
        data = value.pickle
        if data is None:
            data = bytes(target[value.data.offset : value.data.offset + value.data.length])
            if not value.digest or not hmac.compare_digest(pickle_digest(data), value.digest):
                raise ObjectLostError(f"object {value.oid}: its bytes from host {value.host} do not match its digest")
        buffers = []
        for i, span in enumerate(value.buffers):
            view = target[span.offset : span.offset + span.length]
            buffers.append(view if i in value.private else view.toreadonly())
        return Blob(data, buffers)

    def _read_rdma(self, value: Stored) -> Blob:
        """The whole allocation read with Monarch's RDMABuffer (ibverbs, or its TCP fallback) into private memory."""
        target = self._landing(value.length)
        try:
            value.rdma.read_into(target, timeout=int(IO_TIMEOUT)).get()
        except Exception as exc:
            raise ObjectLostError(f"object {value.oid}: RDMA read from host {value.host} failed: {exc}") from exc
        return self._blob_of(value, target)

    # ----------------------------------------------------------- lifetime
    def close(self) -> None:
        self.free(list(self.rdma_buffers))
        self.share_tokens.clear()
        if self.server is not None:
            self.server.close()
        self.conns.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        self.arena.close()
