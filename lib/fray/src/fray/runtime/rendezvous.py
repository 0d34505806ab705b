"""The TCPStore of an SPMD group's torch.distributed rendezvous, served by fray in rank 0's process.

torch's own env:// rendezvous makes rank 0 serve a TCPStore on MASTER_PORT of every interface of its host (it
binds the wildcard address): anyone who can reach the host could talk to it for the group's life. So every member
fray starts has TORCHELASTIC_USE_AGENT_STORE=True (fray.runtime.groups.spmd_env), under which torch's env:// and tcp://
rendezvous on every rank is a client only, and rank 0's process serves the store itself before the member's class
is made (`serve_store`), on a socket bound to MASTER_ADDR alone: loopback where every member is on one host, else
rank 0's host address, which the members on other hosts need.

A job's ranks (fray.jobs.supervisor, `--replicas N` on one host) rendezvous the same way: the supervisor, which
is none of them, serves their store on loopback (`serve_job_store`) and gives them TORCHELASTIC_USE_AGENT_STORE.

The socket listens from the start; torch is loaded and its TCPStore made on that socket only when the first
connection is waiting (`LazyStore`), so a group or job whose code never rendezvous does not load torch for it.
Where torch is not installed nothing is served (nothing there can rendezvous). A member whose code names its own
`init_method="tcp://..."` must serve that store itself or unset TORCHELASTIC_USE_AGENT_STORE.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import select
import socket
import threading
import time
import weakref
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from fray.errors import FrayError

__all__ = ["AGENT_STORE_ENV", "LazyStore", "serve_job_store", "serve_store", "served_store"]

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
log = logging.getLogger("fray")
STORE_TIMEOUT = timedelta(minutes=30)  # torch's default for a process group's store operations
EXIT_WAIT = 20.0  # seconds the process's end waits for a store being made (torch's import included)

_served: list[LazyStore] = []  # kept for the life of the process
_live: weakref.WeakSet[LazyStore] = weakref.WeakSet()


def serve_store(env: Mapping[str, str]) -> None:
    """In a member's process, before its class is made: if it is rank 0 of an SPMD group (env: its
    torch.distributed variables), serve the group's TCPStore on MASTER_ADDR:MASTER_PORT only. FrayError, naming
    the address, if it cannot listen there."""
    if env.get(AGENT_STORE_ENV) != "True" or env.get("RANK") != "0" or not env.get("MASTER_ADDR"):
        return
    if _served or importlib.util.find_spec("torch") is None:
        return
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    try:
        _served.append(LazyStore(addr, port, int(env["WORLD_SIZE"])))
    except OSError as exc:
        raise FrayError(
            f"rank 0 of an SPMD group could not listen on MASTER_ADDR {addr} port {port} for the group's "
            f"rendezvous ({exc}): is {addr} an address of this host, and the port free?"
        ) from exc


class LazyStore:
    """A rendezvous store for `size` ranks, listening on `addr` port `port` (0: a free one) from the start
    (OSError if it cannot): torch's TCPStore is made on that socket when the first connection waits there (a
    thread of this process watches for it), not before; `store()` makes it at once."""

    def __init__(self, addr: str, port: int, size: int) -> None:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.listener = socket.create_server((addr, port), family=family, backlog=max(128, size))
        self.size = size
        self._store: Any = None
        self._lock = threading.Lock()  # (held while the store is made)
        self._exiting = False
        _live.add(self)
        threading.Thread(target=self._serve_when_called, name="fray-rendezvous-store", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def store(self) -> Any:
        """torch's TCPStore serving this socket (made now if no rank has connected yet)."""
        with self._lock:
            if self._store is None:
                if self._exiting:
                    raise FrayError("this process is ending: it serves no rendezvous store any more")
                self._store = self._make_store()
            return self._store

    def finish_making(self, deadline: float) -> None:
        """As the process ends: waits (until time.monotonic() `deadline`) for a store being made, and makes none
        after. A daemon thread still in torch's C++ when the interpreter finalizes would abort the process."""
        if self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._exiting = True
            self._lock.release()

    def _make_store(self) -> Any:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # (re-exported from torch._C)

        addr, port = self.listener.getsockname()[:2]
        return TCPStore(
            addr,
            port,
            self.size,
            True,
            timeout=STORE_TIMEOUT,
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=self.listener.fileno(),
        )

    def _serve_when_called(self) -> None:
        # Lives with the process, as the store it makes does: it waits for a connection without taking it (the
        # store accepts it from the backlog), and the socket stays open until the process ends, unless the store
        # could not be made (below).
        readable = select.poll()
        readable.register(self.listener, select.POLLIN)
        readable.poll()
        try:
            self.store()
        except Exception:
            if self._exiting:
                return  # (the process is ending: no rank is served any more)
            addr, port = self.listener.getsockname()[:2]
            log.exception("fray could not serve the rendezvous store on %s port %s", addr, port)
            # A rank's torch client waits for the server's first answer without its timeout, for as long as the
            # socket is open; closed, it refuses them, and each rank fails by its own rendezvous timeout.
            self.listener.close()


@atexit.register
def _finish_making_stores() -> None:
    deadline = time.monotonic() + EXIT_WAIT
    for store in list(_live):
        store.finish_making(deadline)


def serve_job_store(addr: str, size: int) -> LazyStore | None:
    """Serves the rendezvous store of `size` ranks that this process starts (and is none of) on `addr` alone, on a
    port of its choosing (keep it while the ranks run). None where torch cannot serve one here (the ranks then
    rendezvous as torch does by itself)."""
    if importlib.util.find_spec("torch") is None:
        return None
    return LazyStore(addr, 0, size)


def served_store() -> Any:
    """torch's TCPStore this process serves for its group (None: it serves none)."""
    return _served[0].store() if _served else None
