"""An in_memory SPMD group member: the actor's instance lives in a child process of its own, with the group's
torch.distributed environment (threads share one os.environ and one torch.distributed world, so SPMD members
cannot be threads). The in_memory actor machinery calls this proxy as it would the instance; each call travels
over a socket pair (cloudpickle), one at a time.

The child is in its own process group, watched by fray.watchdog, so it dies with its owner however the owner
ends; kill() ends it at once.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from fray import watchdog
from fray.current import ActorInfo, set_process_actor
from fray.errors import ActorDiedError, SerializationError
from fray.remote_errors import RemoteError, capture_exception

__all__ = ["ProcessMember"]


class ProcessMember:
    """Stands in for the instance: `proxy.method(*args)` runs the method in the member's process."""

    def __init__(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], info: ActorInfo, env: dict[str, str]
    ) -> None:
        self._label = info.name or f"rank {info.rank} of {klass.__name__} x{info.size}"
        self._lock = threading.Lock()
        parent_sock, child_sock = socket.socketpair()
        path = os.pathsep.join(p for p in sys.path if p)  # the child imports what this process can
        child_env = {**os.environ, **env, "PYTHONPATH": path}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "fray.in_memory._process_member", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                env=child_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child_sock.close()
        watchdog.watch_group(self._proc.pid)
        self._conn = Connection(parent_sock.detach())
        self._exchange((klass, args, kwargs, info), "__init__")

    def _exchange(self, message: Any, what: str) -> Any:
        try:
            data = cloudpickle.dumps(message)
        except Exception as exc:
            raise SerializationError(f"the arguments of {what} of {self._label} cannot be pickled: {exc}") from exc
        with self._lock:
            try:
                self._conn.send_bytes(data)
                reply = self._conn.recv_bytes()
            except (EOFError, OSError):
                code = self._proc.wait(timeout=10)
                raise ActorDiedError(
                    f"actor {self._label} died: its process exited with code {code} during {what}"
                ) from None
        ok, value = cloudpickle.loads(reply)
        if not ok:
            assert isinstance(value, RemoteError)
            raise value.rebuild()
        return value

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._exchange((method, args, kwargs), method)

        return call

    def _fray_close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=10)
        watchdog.forget_group(self._proc.pid)


def _reply(conn: Connection, ok: bool, value: Any) -> None:
    try:
        data = cloudpickle.dumps((ok, value))
    except Exception as exc:  # an unpicklable return value fails this call, not the member
        data = cloudpickle.dumps((False, capture_exception(SerializationError(f"the result cannot be pickled: {exc}"))))
    conn.send_bytes(data)


def _main(fd: int) -> None:
    conn = Connection(fd)
    klass, args, kwargs, info = cloudpickle.loads(conn.recv_bytes())
    set_process_actor(info)
    try:
        instance = klass(*args, **kwargs)
    except BaseException as exc:
        _reply(conn, False, capture_exception(exc))
        return
    _reply(conn, True, None)
    loop: asyncio.AbstractEventLoop | None = None
    while True:
        try:
            method, args, kwargs = cloudpickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            value = getattr(instance, method)(*args, **kwargs)
            if inspect.iscoroutine(value):
                loop = loop or asyncio.new_event_loop()
                value = loop.run_until_complete(value)
            elif inspect.isgenerator(value):
                value.close()
                raise TypeError(f"{method} is a generator: SPMD members on in_memory cannot stream its items")
            _reply(conn, True, value)
        except BaseException as exc:
            _reply(conn, False, capture_exception(exc))


if __name__ == "__main__":
    _main(int(sys.argv[1]))
