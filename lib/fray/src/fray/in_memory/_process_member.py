"""An in_memory SPMD group member: the actor's instance lives in a child process of its own, with the group's
torch.distributed environment (threads share one os.environ and one torch.distributed world, so SPMD members
cannot be threads). The in_memory actor machinery calls this proxy as it would the instance; each call travels
over a socket pair, one at a time, its large buffers through shared memory (fray.in_memory._channel).

The child is in its own process group, watched by fray.host.watchdog, so it dies with its owner however the owner
ends; kill() ends it at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from fray.backend import (
    LOST_PEER_GRACE,
    RECORDER,
    SHARED,
    ActorInfo,
    Blob,
    Kind,
    RemoteError,
    capture_exception,
    driver_import_path,
    exiting,
    heartbeat_interval,
    keep_driver_view,
    loads,
    lost_peer,
    serve_store,
    set_process_actor,
    use_held_device,
    watchdog,
    worker_env_defaults,
)
from fray.errors import ActorDiedError, ActorUnavailableError
from fray.in_memory._channel import Channel
from fray.in_memory._gang import Gang
from fray.kit import Serialized

__all__ = ["ProcessMember"]


class ProcessMember:
    """Stands in for the instance: `proxy.method(*args)` runs the method in the member's process. With a `gang`
    (its SPMD group's Gang) it fails and restarts with the group's other members."""

    def __init__(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        info: ActorInfo,
        env: dict[str, str],
        gang: Gang | None = None,
        cpus: float | None = None,
    ) -> None:
        self._label = info.name or f"rank {info.rank} of {klass.__name__} x{info.size}"
        self._lock = threading.Lock()  # one call at a time, and no call while the process is replaced
        self._init = (klass, args, kwargs, info)
        self._env = {**worker_env_defaults(cpus), **env}  # (the defaults of a process holding `cpus` CPUs)
        self._gang = gang
        self._generation = 0  # the life of its group its current process belongs to
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        with self._lock:
            self._start(info, 0)
        if gang is not None:
            gang.joined(info.rank, self)

    def _start(self, info: ActorInfo, generation: int) -> None:
        """Under the lock: a fresh child process with the member's environment, its __init__ run there."""
        parent_sock, child_sock = socket.socketpair()
        beats, beat_out = os.pipe()  # the child's heartbeats (a gang watches them)
        interval = heartbeat_interval(self._gang.hang_timeout if self._gang is not None else math.inf)
        path = os.pathsep.join(driver_import_path())  # the child imports what this process can
        child_env = {**os.environ, **self._env, "PYTHONPATH": path}
        command = [sys.executable, "-m", "fray.in_memory._process_member", str(child_sock.fileno())]
        try:
            proc = subprocess.Popen(
                [*command, str(beat_out), str(interval)],
                pass_fds=(child_sock.fileno(), beat_out),
                env=child_env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child_sock.close()
            os.close(beat_out)
        watchdog.watch_group(proc.pid)
        RECORDER.record(Kind.WORKER_START, proc.pid, f"process of {self._label}", {"pid": proc.pid})
        self._proc, self._channel, self._generation = proc, Channel(parent_sock, SHARED), generation
        if self._gang is not None:
            self._gang.watch(info.rank, proc, generation, beats)
        else:
            os.close(beats)
        klass, args, kwargs, _ = self._init
        self._outcome(self._send_receive((klass, args, kwargs, info), "__init__", call=False), generation)
        if self._gang is not None:
            self._gang.up(info.rank, generation)

    def respawn(self, env: dict[str, str], restarts: int, generation: int) -> None:
        """The group restarts: this member on a fresh process (the old one was stopped), __init__ again."""
        with self._lock:
            if self._closed:
                raise ActorDiedError(f"actor {self._label} was killed during its group's restart")
            self._close_connection()
            self._env.update(env)
            info = dataclasses.replace(self._init[3], restarts=restarts)
            self._start(info, generation)

    def _send_receive(self, message: Any, what: str, call: bool = True) -> tuple[bool, Blob] | None:
        """Under the lock: the reply to one message (a method call, by send_call; else the class and its
        arguments), (ok, the result or a RemoteError, serialized); None if the process is gone."""
        try:
            if call:
                self._channel.send_call(message, f"the arguments of {what} of {self._label}")
            else:
                self._channel.send(message, f"the arguments of {what} of {self._label}")
            return self._channel.recv_outcome(f"the result of {what} of {self._label}")
        except (EOFError, OSError):
            return None

    def _outcome(self, reply: tuple[bool, Blob] | None, generation: int, what: str = "__init__") -> Serialized:
        """The value of a reply, or the error to raise: a group's failure replaces both a lost process and a
        collective's error about a lost peer (the peer's death may reach fray a moment after that error)."""
        gang = self._gang
        if reply is None:
            failure = gang.failure_since(generation, 30.0) if gang is not None else None
            if failure is not None:
                raise failure from None
            assert self._proc is not None
            code = self._proc.wait(timeout=10)
            if gang is None:  # (a group member's death is recorded by its group's watcher)
                why = f"it exited with code {code} during {what}"
                data = {"reason": why, "exit_code": code}
                RECORDER.record(Kind.WORKER_DIED, self._proc.pid, f"process of {self._label}", data)
            raise ActorDiedError(f"actor {self._label} died: its process exited with code {code} during {what}")
        ok, blob = reply
        if ok:
            return Serialized(blob)
        value = loads(blob, f"the error of {what} of {self._label}")
        assert isinstance(value, RemoteError)
        error = value.rebuild()
        if gang is not None and lost_peer(error):
            failure = gang.failure_since(generation, LOST_PEER_GRACE)
            if failure is not None:
                raise failure from None
        raise error

    def _exchange(self, message: Any, what: str, life: int | None = None) -> Any:
        """One call, sent in its group's life `life` (the one current when it was submitted): a call submitted
        while the group restarts waits for the restart; one submitted before a death fails with it."""
        generation = 0
        if self._gang is not None:
            generation = self._gang.life() if life is None else life
            self._gang.ready(generation)
        with self._lock:
            if self._gang is not None and generation != self._generation:  # the group failed since the check
                failure = self._gang.failure_since(generation, 0)
                raise failure if failure is not None else ActorUnavailableError(f"actor {self._label} restarted")
            reply = self._send_receive(message, what)
        return self._outcome(reply, generation, what)

    def _fray_call(self, life: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`method(*args, **kwargs)`, a call submitted in its group's life `life` (Gang.life)."""
        return self._exchange((method, args, kwargs), method, life)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._exchange((method, args, kwargs), method)

        return call

    def exiting(self) -> bool:
        """Its process has begun to exit (or has ended), though its group may not have seen the death yet."""
        proc = self._proc
        return proc is not None and exiting(proc.pid)

    def stop_process(self) -> None:
        """SIGKILL its process (not waiting: a call may hold the lock, blocked on the process's answer)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close_connection(self) -> None:
        try:
            self._channel.close()
        except OSError:
            pass
        if self._proc is not None:
            self.stop_process()
            self._proc.wait(timeout=10)
            watchdog.forget_group(self._proc.pid)

    def _fray_close(self) -> None:
        self._closed = True
        if self._gang is not None:  # a killed member takes its group down: the others' collectives need it
            self._gang.died(self._init[3].rank, self._generation, "it was killed", restart=False)
        self._close_connection()


def _beat(fd: int, interval: float) -> None:
    """Tell the parent this process is alive, every `interval` seconds, until it stops reading."""
    while True:
        try:
            os.write(fd, b".")
        except OSError:
            return
        time.sleep(interval)


def _main(fd: int, beat_fd: int, interval: float) -> None:
    keep_driver_view(os.environ.get("PYTHONPATH", "").split(os.pathsep))  # (its parent's path: _start)
    threading.Thread(target=_beat, args=(beat_fd, interval), name="fray-heartbeat", daemon=True).start()
    conn = Channel(socket.socket(fileno=fd), SHARED)  # (a member lives on: its values are served from here)
    klass, args, kwargs, info = conn.recv("the actor's class and arguments")
    set_process_actor(info)
    try:
        use_held_device()  # (a member holding GPUs starts on its own device, as LOCAL_RANK would pick it)
        serve_store(os.environ)  # rank 0 of an SPMD group: its rendezvous, bound to MASTER_ADDR only
        instance = klass(*args, **kwargs)
    except BaseException as exc:
        conn.send_outcome(False, capture_exception(exc), "the error")
        return
    conn.send_outcome(True, None, "__init__")
    loop: asyncio.AbstractEventLoop | None = None
    while True:
        try:
            method, args, kwargs = conn.recv_call("a call's arguments")
        except (EOFError, OSError):
            return
        except Exception as exc:  # arguments that do not load here fail this call, not the member
            conn.send_outcome(False, capture_exception(exc), "the error")
            continue
        try:
            value = getattr(instance, method)(*args, **kwargs)
            del args, kwargs  # (arguments lent by the parent and dropped now are returned with this reply)
            if inspect.iscoroutine(value):
                loop = loop or asyncio.new_event_loop()
                value = loop.run_until_complete(value)
            elif inspect.isgenerator(value):
                value.close()
                raise TypeError(f"{method} is a generator: SPMD members on in_memory cannot stream its items")
            conn.send_outcome(True, value, "the result")
        except BaseException as exc:
            conn.send_outcome(False, capture_exception(exc), "the error")


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
