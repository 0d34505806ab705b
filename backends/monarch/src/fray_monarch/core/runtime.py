"""Process-wide Monarch setup: environment defaults, fray's fault hook, and one background asyncio loop.

Imported before anything else touches Monarch, so the environment it sets is what Monarch reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from fray.backend import procfs
from fray_monarch.core.monarch_log import claim_monarch_log_dir
from fray_monarch.net import tls  # imports no Monarch

# Defaults only: a user who sets these keeps their value.
os.environ.setdefault("MONARCH_FILE_LOG", "error")  # the internal log file otherwise grows forever
# Monarch's supervision poll (its default 10 s) is a backstop: fray sees a worker process end through a pidfd here
# and its lifeline from another host, and fails what was pending on it then (driver/orphaned_calls.py). Every poll
# asks every process about every actor, so its frequency is what an idle context costs in CPU.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")
os.environ.setdefault("RUST_LOG", "error")
# HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE keeps Monarch's default (30 s): a process whose agent is silent that long
# is reported crashed, and a shorter bound took live processes for dead (paused, or slow on a loaded machine).
# Deaths on this machine are seen at once through pidfds (_PidWatch), whatever that bound.

tls.runtime_paths()  # Monarch reads its TLS variables once, at import: they name files written when TLS is used
claim_monarch_log_dir()  # Monarch opens /tmp/<user>/monarch_log.log as it is imported: that directory must be ours

import monarch.actor as _monarch_actor  # noqa: E402

log = logging.getLogger("fray_monarch")

_fault_listeners: list[Callable[[Any], None]] = []


def _fray_fault_hook(failure: Any) -> None:
    """Replaces Monarch's default hook, which exits the client process on any unhandled mesh failure.

    Fray learns about dead processes through its own watch calls (and tells the affected refs); here the
    failure is only logged and offered to listeners."""
    log.debug("monarch mesh failure: %s", failure)
    for listener in list(_fault_listeners):
        try:
            listener(failure)
        except Exception:  # a hook must never raise: that would count as unhandled and kill the process
            log.exception("fray fault listener failed")


def install_fault_hook() -> None:
    _monarch_actor.unhandled_fault_hook = _fray_fault_hook


install_fault_hook()


def _own_address_transport() -> None:
    """In a process Monarch started on another host: listen on this host's own address.

    A driver whose processes span machines listens on one address of its own (network.use_tcp), and Monarch
    hands that same setting to every process it spawns, on every host: a process on another machine then fails
    to make its client context ("listen: tcp:<driver's address>:0 Cannot assign requested address"). So a
    process given an explicit address that is not its machine's takes its own address that routes there."""
    import socket

    from monarch._rust_bindings.monarch_hyperactor.config import configure, get_global_config

    spec = str(get_global_config().get("default_transport", ""))  # "tcp:10.0.0.1:0", "tls:10.0.0.1:0", "unix"...
    scheme = spec.split(":", 1)[0]
    if scheme not in ("tcp", "tls") or ":" not in spec:
        return
    host = spec[len(scheme) + 1 :].rsplit(":", 1)[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, 0))
            return  # that address is this machine's: keep it
        except OSError:
            pass
        try:
            probe.connect((host, 9))  # no packet is sent: the kernel picks the route
        except OSError:
            return
        own = probe.getsockname()[0]
    configure(default_transport=f"{scheme}://[{own}]:0" if family == socket.AF_INET6 else f"{scheme}://{own}:0")


_own_address_transport()


class _Loop:
    """One asyncio loop in a daemon thread, to turn Monarch futures into completion callbacks."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="fray-monarch-loop", daemon=True).start()
                self._loop = loop
            return self._loop


_loop = _Loop()


def loop() -> asyncio.AbstractEventLoop:
    return _loop.get()


def on_done(fut: Any, callback: Callable[[Any, BaseException | None], None]) -> concurrent.futures.Future[None]:
    """Call callback(value, None) or callback(None, exc) when the Monarch future `fut` completes."""

    async def watch() -> None:
        try:
            value = await fut.as_asyncio()
        except BaseException as exc:
            callback(None, exc)
        else:
            callback(value, None)

    return asyncio.run_coroutine_threadsafe(watch(), loop())


def stop_client_controller() -> None:
    """Stop the actor Monarch 0.7 spawns in every client process when its context is first made (its controller
    of controllers, a sync actor), which its own shutdown leaves running: the actor's thread waits in Monarch's
    native code, and one that wakes while the interpreter finalizes aborts the process. For the exit hook, after
    fray's own actors here have stopped; a Monarch without that internal is left as it is."""
    try:
        from monarch._src.actor import proc_mesh  # internal: see above

        mesh = getattr(getattr(proc_mesh, "_controller_controller", None), "_val", None)
        if mesh is not None:
            mesh.stop().get(timeout=5)  # joins its thread
    except Exception as exc:  # (the program is exiting: nothing is left to report it to)
        log.debug("fray: Monarch's client controller did not stop at exit: %r", exc)


RECEIVE_FAILURES = 10  # receive errors in a row after which a port counts as gone


def receive_each(receiver: Any, handle: Callable[[Any], None], name: str) -> threading.Thread:
    """Hand every message of a Monarch port receiver to handle(message), in order, on fray's loop, until a
    message is None (the owner sends one to stop it).

    One Monarch coroutine receives them all. A public `receiver.recv().get()` per message makes a Monarch task
    and wakes a Python thread each time, which would make a group call to many members much slower than
    Monarch's own `call` of the same mesh. The loop uses two Monarch 0.7 internals (`Future._from_coro`,
    `PortReceiver._recv`) and falls back to the public way if they are gone. Messages are handled on fray's loop,
    not on the Tokio thread that received them: handlers take the controller's lock, and a Tokio worker must
    never block on it."""
    lp = loop()

    def deliver(message: Any) -> bool:
        if message is None:
            return False
        lp.call_soon_threadsafe(handle, message)
        return True

    async def receive_all() -> None:
        failures = 0
        while True:
            try:
                message = await receiver._recv()
            except Exception:  # one bad message; many in a row: the port is gone (the runtime is stopping)
                failures += 1
                log.debug("fray: receiving a message on %s failed", name, exc_info=True)
                if failures >= RECEIVE_FAILURES:
                    return
                continue
            failures = 0
            if not deliver(message):
                return

    def run() -> None:
        try:
            from monarch._src.actor.future import Future  # internal: see above

            if hasattr(receiver, "_recv"):
                Future._from_coro(receive_all()).get()
                return
        except ImportError:
            pass
        failures = 0
        while failures < RECEIVE_FAILURES:  # the public way
            try:
                message = receiver.recv().get()
            except Exception:
                failures += 1
                log.debug("fray: receiving a message on %s failed", name, exc_info=True)
                continue
            failures = 0
            if not deliver(message):
                return

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def call_later(delay: float, callback: Callable[[], None]) -> Callable[[], None]:
    """Run callback on the loop after delay seconds; returns a function that cancels it."""
    cancelled = threading.Event()

    def fire() -> None:
        if not cancelled.is_set():
            callback()

    lp = loop()
    lp.call_soon_threadsafe(lp.call_later, delay, fire)
    return cancelled.set


def machine_id() -> str:
    """Identifies this machine's boot (same value = same kernel, so the same PIDs)."""
    boot = procfs.boot_id()
    return f"{os.uname().nodename}/{boot}" if boot else ""


class _PidWatch:
    """Calls back when a process on this machine exits, via pidfds (readable at exit; no polling, no need to be
    its parent). A second, faster death signal beside Monarch's supervision, whose poll can take up to
    HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE when it races the death."""

    def __init__(self) -> None:
        import selectors

        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: list[tuple[int, Callable[[], None]]] = []
        threading.Thread(target=self._run, name="fray-monarch-pidwatch", daemon=True).start()

    def add(self, pid: int, callback: Callable[[], None]) -> bool:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            callback()
            return True
        except (OSError, AttributeError):
            return False
        with self._lock:
            self._pending.append((fd, callback))
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        return True

    def _run(self) -> None:
        import selectors

        while True:
            try:
                for key, _ in self._sel.select():
                    if key.data is None:
                        os.read(self._wake_r, 4096)
                        with self._lock:
                            pending, self._pending = self._pending, []
                        for fd, cb in pending:
                            self._sel.register(fd, selectors.EVENT_READ, cb)
                        continue
                    self._sel.unregister(key.fd)
                    os.close(key.fd)
                    try:
                        key.data()
                    except Exception:
                        log.exception("fray: process-exit callback failed")
            except Exception:
                log.exception("fray: pid watch loop error")


_pidwatch: _PidWatch | None = None
_pidwatch_lock = threading.Lock()


def watch_pid(pid: int, callback: Callable[[], None]) -> bool:
    """Call callback (on a fray thread) when local process pid exits. False if it cannot be watched."""
    global _pidwatch
    with _pidwatch_lock:
        if _pidwatch is None:
            _pidwatch = _PidWatch()
    return _pidwatch.add(pid, callback)


# Monarch 0.7 prints this line to stderr once per process, when the process's first client context is made (an
# unconditional eprintln in its HostAgent::init). fray makes that context itself, early, with fd 2 captured.
BANNER = b"Monarch internal logs are being written to "
_client_started = False
_client_lock = threading.Lock()


def without_banner(start: Callable[[], Any]) -> Any:
    """Run start() with this process's fd 2 captured in a temp file, then write back every captured line but
    Monarch's banner. Other threads' stderr lines of that moment come out a few ms late, in order."""
    import sys

    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            return start()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True) if not line.startswith(BANNER)]
            if kept:
                os.write(2, b"".join(kept))


def start_client_context() -> None:
    """In a Monarch process (a worker, an actor's or a job runner's): make its client context now, from a thread
    of its own (a call from an actor thread uses the actor's), so its banner is dropped, not printed later by the
    first report a worker sends."""
    global _client_started
    with _client_lock:
        if _client_started:
            return
        _client_started = True
    thread = threading.Thread(target=lambda: without_banner(_monarch_actor.context), name="fray-monarch-client")
    thread.start()
    thread.join(timeout=30)


def start_monarch_in(path: str) -> None:
    """Start Monarch's runtime of this process (its first `context()`) with TMPDIR = path, so the socket
    directory it makes for its children is in there; TMPDIR is restored at once. A runtime started earlier (by
    the user's own Monarch code) keeps its directory where it is."""
    global _client_started
    from fray_monarch.core import environ

    saved = os.environ.get("TMPDIR")
    environ.publish({"TMPDIR": path})  # Monarch's Rust threads may run already: no setenv (see environ.py)
    try:
        without_banner(_monarch_actor.context)
        _client_started = True
    finally:
        environ.publish({"TMPDIR": saved})


def default_bootstrap_cmd() -> Any:
    return _monarch_actor.default_bootstrap_cmd()
