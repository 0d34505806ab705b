"""A Ray head node on this machine with the dashboard (and so the Job API), and a Job API client for an address.

`LocalHead` is `ray start --head --block` in a process group of its own, on ports chosen free, with a temp dir of
its own, listening on loopback unless told otherwise: a private head of a RayClusterContext (owned: handed to
fray.host.watchdog, it ends with this process however it ends) or the head of `fray cluster start` (not owned: it
outlives its starter, fray_ray.persistent). It is ready once `ray start` says its node is up; its own Job API client
(`OwnHeadClient`) turns a request the dashboard does not take into a FrayError saying what ended, with the logs' ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from requests.exceptions import ConnectionError as RequestConnectionError

from fray.backend import Identity, free_ports, stop_group, watchdog
from fray.errors import FrayError
from fray_ray._auth import (
    is_own_job_api,
    note_own_cluster,
    note_own_job_api,
    own_cluster_mode,
    token_chosen,
    token_headers,
    token_path,
    user_auth_mode,
)
from fray_ray._local import LOCAL_ONLY_ENV, LOOPBACK, is_loopback_address, short_tmp
from fray_ray._ray_start import WITHOUT_RAY_CLIENT
from fray_ray._tokens import TOKEN_VARS, new_token_file, note_cluster_token
from fray_ray._tokens import remove as remove_token

__all__ = ["START_TIMEOUT", "LocalHead", "OwnHeadClient", "job_client"]

START_TIMEOUT = 90.0
STOP_WAIT = 30.0  # seconds `ray start --block` has after SIGTERM to stop what it started, before SIGKILL
KILL_WAIT = 10.0  # seconds a SIGKILLed child may take to be reaped before stop goes on without it


class LocalHead:
    """A Ray head node on this machine with the dashboard (and so the Job API). Owned by this process (it ends
    with it, however it ends) unless `owned=False` (`fray cluster start`: it outlives its starter). It listens
    on loopback unless `listen` names another address of this machine."""

    def __init__(
        self,
        num_cpus: float | None = None,
        resources: dict[str, float] | None = None,
        num_gpus: float | None = None,
        object_store_memory: int | None = None,
        owned: bool = True,
        listen: str = LOOPBACK,
    ) -> None:
        self.owned = owned
        self.temp_dir = tempfile.mkdtemp(prefix="fray-rayc-", dir=short_tmp())
        if owned:
            watchdog.watch_path(self.temp_dir)
        local_only = is_loopback_address(listen)
        host = LOOPBACK if local_only else listen
        # Every fixed default port (agent 52365, metrics, runtime env agent, ...) may be held by another Ray on
        # this machine (a private ray.init in the same process, say); then the job agent never comes up. The ports
        # are distinct: `ray start` refuses two components on one port.
        port_flags: tuple[str, ...] = (
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "node-manager-port",
            "object-manager-port",
        )
        # A head of fray's own context serves fray's drivers alone, which join through the GCS: no Ray Client
        # server (a port more, and a process) there. The head of `fray cluster start` keeps Ray's default.
        if not owned:
            port_flags += ("ray-client-server-port",)
        self.port, self.dashboard_port, *other_ports = free_ports(2 + len(port_flags))
        cmd = [
            sys.executable,
            "-m",
            "fray_ray._ray_start",  # (`ray start`, its workers with a runtime env set up without importing Ray)
            *([WITHOUT_RAY_CLIENT] if owned else []),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            f"--port={self.port}",
            f"--node-ip-address={host}",
            f"--dashboard-host={host}",
            f"--dashboard-port={self.dashboard_port}",
            f"--temp-dir={self.temp_dir}",
        ]
        cmd += [f"--{flag}={port}" for flag, port in zip(port_flags, other_ports, strict=True)]
        if num_cpus is not None:
            cmd.append(f"--num-cpus={num_cpus}")
        if num_gpus is not None:
            cmd.append(f"--num-gpus={num_gpus}")
        if object_store_memory is not None:
            cmd.append(f"--object-store-memory={object_store_memory}")
        if resources:
            import json

            cmd.append(f"--resources={json.dumps(resources)}")
        env = dict(os.environ)
        # token auth unless the user chose a mode; the clients send the token. On loopback, a token of its own
        # (fray_ray._tokens: a leaked one opens this cluster alone); beyond, the user's, which other nodes join with.
        self.token_file: Path | None = None
        if local_only and (user_auth_mode() or "token").lower() == "token":
            mode = "token"
            self.token_file = new_token_file(owned)
            for name in TOKEN_VARS:
                env.pop(name, None)
            env["RAY_AUTH_TOKEN_PATH"] = str(self.token_file)
        else:
            mode = own_cluster_mode()
        env["RAY_AUTH_MODE"] = mode
        # Jobs run `python ...` from the head's PATH: make that this interpreter, so fray and Ray are importable.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env.pop("RAY_ADDRESS", None)
        # On SIGTERM a 2.60 node first drains, up to 30 s, for its work (Serve replicas) to move to other nodes: the
        # head's cluster goes away with it, so there is nowhere to move to, and now and then (1 stop in 3 here) the
        # drain never finishes and `stop` waited out all 30 s. A user's own setting is kept.
        env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
        if local_only:
            env.update(LOCAL_ONLY_ENV)  # every server of the node on loopback (see _local)
        # Ray's processes make temp files of their own (the dashboard's multiprocessing forkserver: pymp-*, left
        # behind at every stop): under the head's temp dir, they go with it.
        env["TMPDIR"] = self.temp_dir
        self.log_path = os.path.join(self.temp_dir, "ray-start.log")
        # (a head that outlives us holds no directory of ours)
        self._command = (cmd, env, os.getcwd() if owned else self.temp_dir)
        self._start()
        self.address = f"http://{host}:{self.dashboard_port}"
        self.gcs_address = f"{host}:{self.port}"
        note_own_cluster(self.gcs_address)  # drivers of this process join it in token mode without asking
        if mode.lower() == "token":
            note_own_job_api(self.address)  # the user's token may go to its Job API
        if self.token_file is not None:
            note_cluster_token(self.token_file, self.gcs_address, self.address)

    def _start(self) -> None:
        """`ray start` (again, after a start that timed out), its output in log_path, its group watched."""
        cmd, env, cwd = self._command
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=cwd,
            )
        self.leader = Identity.of(self.proc.pid, zombie_ok=True)  # our child: nothing reaps it before we do
        if self.owned:
            watchdog.watch_group(self.proc.pid)

    def _said(self, words: bytes) -> bool:
        with open(self.log_path, "rb") as f:
            return words in f.read()

    def wait_ready(self, client_factory: Any) -> Any:
        """The head's Job API client once `ray start` says the node started and the Job API answers. The Job API
        answers first: the head's raylet may still be registering then, and `ray start` gives up on it after a
        fixed 30 s, which a loaded machine can miss; such a start is made once more, START_TIMEOUT again."""
        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        started_again = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if started_again or not self._said(_START_TIMED_OUT):
                    break
                log.warning("Ray's start of a private head timed out waiting for its raylet; starting it again")
                self._stop_group()
                self._start()
                started_again, deadline = True, time.monotonic() + START_TIMEOUT
                continue
            if self._said(_STARTED):
                try:
                    client = client_factory(self.address)
                    client.list_jobs()
                    return OwnHeadClient(client, self)
                except Exception as exc:  # dashboard not up yet
                    last = exc
            time.sleep(0.5)
        tail = _tail(self.log_path)
        self.stop()
        raise RuntimeError(
            f"the private Ray head node did not start ({last or 'not in time'}); ray start said:\n{tail}"
        )

    def unreachable(self, exc: Exception) -> FrayError:
        """The error for a request its dashboard did not take: the whole head ended (`ray start --block` stops it
        when its dashboard ends), or the dashboard alone and `ray start` has not seen it yet, with the end of the
        logs that say why."""
        try:  # (`ray start --block` looks for ended processes about once a second)
            code: int | None = self.proc.wait(timeout=UNREACHABLE_WAIT)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            what = (
                f"the dashboard of this private Ray head does not answer at {self.address} ({exc}), though the "
                "head still runs; its Job API went with it. Shut this context down and start another"
            )
        else:
            what = f"this private Ray head has stopped (`ray start` exited with {code}), and its Job API with it"
        logs = os.path.join(self.temp_dir, "session_latest", "logs")
        tails = [_tail(self.log_path)] + [_tail(os.path.join(logs, name)) for name in _DASHBOARD_LOGS]
        return FrayError(f"{what}. The end of its logs:\n" + "\n".join(t for t in tails if t))

    def _stop_group(self) -> None:
        end_child(self.proc, "ray start --block")  # (on SIGTERM, Ray stops every process it started)
        if self.leader is not None:  # whatever is left of exactly this process group, until it is gone
            stop_group(self.leader, grace=2.0)
        if self.owned:
            watchdog.forget_group(self.proc.pid)

    def stop(self) -> None:
        self._stop_group()
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # only now: Ray's processes write there while they stop
        remove_token(self.token_file, self.owned)
        if self.owned:
            watchdog.forget_path(self.temp_dir)


_STARTED = b"Ray runtime started."  # what `ray start` prints once its node is up
_START_TIMED_OUT = b"The current node timed out during startup"  # (ray._private.node: its raylet not seen in 30 s)
UNREACHABLE_WAIT = 3.0  # seconds a head whose dashboard is unreachable may take to end, before it is called alive
_DASHBOARD_LOGS = ("dashboard.log", "dashboard.err")
_TAIL_CHARS = 1500


def _tail(path: str) -> str:
    """The end of a log file of the head, headed by its path ("" when there is none, or it is empty)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - _TAIL_CHARS))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return f"--- {path}:\n{text}" if text.strip() else ""


class OwnHeadClient:
    """The Job API client of a head this process started: a request its dashboard does not take is a FrayError
    saying whether the head or its dashboard alone has ended, and why (LocalHead.unreachable)."""

    def __init__(self, client: Any, head: LocalHead) -> None:
        self._client = client
        self._head = head

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        head = self._head

        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except RequestConnectionError as exc:
                raise head.unreachable(exc) from exc

        return checked


log = logging.getLogger("fray_ray")


def end_child(proc: subprocess.Popen[bytes], what: str) -> None:
    """SIGTERM this child, STOP_WAIT seconds, then SIGKILL (a child not reaped yet: its pid is its own), and wait
    KILL_WAIT seconds more at most: stopping a head never waits without bound."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT)
        return
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not end %.0f s after SIGTERM: SIGKILL", what, proc.pid, STOP_WAIT)
    proc.kill()
    try:
        proc.wait(timeout=KILL_WAIT)
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not end after SIGKILL either; going on without it", what, proc.pid)


_ADDRESS_VARS = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
_env_lock = threading.Lock()


@contextmanager
def _explicit_address() -> Iterator[None]:
    """Ray's JobSubmissionClient takes RAY_API_SERVER_ADDRESS or RAY_ADDRESS over the address it is given: hide
    them while it is made, so the address fray was given (or its own head's) is the one used."""
    with _env_lock:
        saved = {name: os.environ.pop(name) for name in _ADDRESS_VARS if name in os.environ}
        try:
            yield
        finally:
            os.environ.update(saved)


def job_client(address: str, own: bool = False) -> Any:
    """A JobSubmissionClient for exactly this dashboard address. The user's Ray token goes only to a cluster fray
    started (`own`, or its record: `is_own_job_api`) or, when the user chose token mode (RAY_AUTH_MODE=token), to
    any, as Ray's own client sends it then; sent over plain http beyond loopback, with a warning that whoever sees
    the traffic can read it. Elsewhere it is never sent, not even to a Job API that refuses the client without
    it (a stale RAY_ADDRESS whose port another user took, a colleague's cluster, a relay): FrayError naming the
    choice."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    with _explicit_address():
        if own:
            return JobSubmissionClient(address, headers=token_headers(address))
        if is_own_job_api(address) or token_chosen():
            headers = token_headers(address)
            if headers:
                _warn_if_plain_http(address)
            return JobSubmissionClient(address, headers=headers)
        try:
            return JobSubmissionClient(address)
        except AuthenticationError:
            raise FrayError(
                f"the Ray Job API at {address} asks for a token; fray sends your Ray token ({token_path()}) only to "
                "clusters it started or recorded (`fray cluster start`), since whoever answers there would get it. "
                "If this cluster is yours and uses that token, choose token mode: RAY_AUTH_MODE=token (the token "
                "then goes to every Ray cluster this process reaches, as with Ray's own client)"
            ) from None


def _warn_if_plain_http(address: str) -> None:
    parsed = urlparse(address if "://" in address else f"http://{address}")
    if parsed.scheme == "http" and not is_loopback_address(parsed.hostname or ""):
        log.warning(
            "sending your Ray token to %s over plain http: whoever can see that traffic can read it and use the "
            "cluster as you. Reach its dashboard over https, an ssh tunnel or a private network.",
            address,
        )
