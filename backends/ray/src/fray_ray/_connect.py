"""Connecting this process to Ray: a private local instance, or an existing cluster; and token auth.

Ray keeps one connection per process, so several RayJobContexts in one process share it: the connection is
reference-counted and released when the last context that made it shuts down. A private instance is started
with address="local" (never silently joining someone's `ray start` cluster) in its own temp dir, and is stopped
(and its temp dir removed) at that point. A cluster we merely joined is only disconnected from.

A private instance's processes (GCS, raylet, its agents, dashboard, monitors) are started in one new process
group, and that group and the temp dir are handed to fray.watchdog: if this process ends without shutdown (even
by SIGKILL), the watchdog kills the group and removes the dir. Ray's workers put themselves in groups of their
own; they exit by themselves within a few seconds of their raylet. The instance listens on loopback only.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
import ray._private.services as ray_services

from fray import watchdog

log = logging.getLogger("fray_ray")

_lock = threading.Lock()


@dataclass
class _Connection:
    started_here: bool  # we started a private Ray instance (so we stop it)
    connected_here: bool  # we called ray.init (so we call ray.shutdown)
    temp_dir: str | None
    users: int = 0
    pgid: int | None = None  # the process group of a private instance's processes


_conn: _Connection | None = None


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return Path(path).expanduser().is_file()
    return (Path.home() / ".ray" / "auth_token").is_file()


def enable_token_auth() -> None:
    """Ray 2.60 clusters have token auth ON; a client connecting by address must opt in (RAY_AUTH_MODE=token)
    and find the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token). We opt in when a token is
    available and the user has not chosen a mode; clusters started with RAY_AUTH_MODE=disabled still accept us."""
    if "RAY_AUTH_MODE" in os.environ or not token_available():
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # refresh Ray's cached config so this process observes token mode
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    except Exception:  # pragma: no cover - older/newer Ray without this hook
        pass


def acquire(
    address: str | None,
    namespace: str | None,
    init_kwargs: dict[str, Any],
    log_to_driver: bool,
) -> None:
    """Connect (or reuse this process's connection). Raises ValueError on a conflicting namespace."""
    global _conn
    with _lock:
        if ray.is_initialized():
            if namespace and ray.get_runtime_context().namespace != namespace:
                raise ValueError(
                    f"this process is already connected to Ray in namespace "
                    f"{ray.get_runtime_context().namespace!r}; cannot switch to {namespace!r} (one Ray connection "
                    "per process): shut the other fray/Ray context down first"
                )
            if _conn is None:  # the user called ray.init themselves: use it, never shut it down
                _conn = _Connection(started_here=False, connected_here=False, temp_dir=None)
            _conn.users += 1
            return
        if address is None:
            address = os.environ.get("RAY_ADDRESS") or None
        common: dict[str, Any] = {"namespace": namespace, "log_to_driver": log_to_driver}
        if address and address != "local":
            if init_kwargs:
                log.warning("joining the Ray cluster at %s: ignoring sizing options %s", address, sorted(init_kwargs))
            enable_token_auth()
            if _is_loopback(address):
                # A private head of fray's (or any node on loopback): Ray would rewrite 127.0.0.1 to this
                # machine's outward address, where such a node does not listen.
                with _LocalOnly():
                    ray.init(address=address, **common)
            else:
                ray.init(address=address, **common)
            _conn = _Connection(started_here=False, connected_here=True, temp_dir=None, users=1)
            return
        temp_dir = tempfile.mkdtemp(prefix="fray-ray-", dir=short_tmp())
        watchdog.watch_path(temp_dir)
        spawn = _GroupedSpawn()
        try:
            with spawn:
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _temp_dir=temp_dir,
                    _node_ip_address=LOOPBACK,
                    runtime_env=_driver_path_env(),
                    **init_kwargs,
                    **common,
                )
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            _stop_private(spawn.pgid, temp_dir)
            raise
        _conn = _Connection(started_here=True, connected_here=True, temp_dir=temp_dir, users=1, pgid=spawn.pgid)


def release() -> None:
    global _conn
    with _lock:
        if _conn is None:
            return
        _conn.users -= 1
        if _conn.users > 0:
            return
        conn, _conn = _conn, None
        if conn.connected_here:
            ray.shutdown()
        if conn.started_here and conn.temp_dir:
            _stop_private(conn.pgid, conn.temp_dir)


LOOPBACK = "127.0.0.1"
# Ray replaces a node address of 127.0.0.1 with the machine's outward address, and then its servers listen on
# every interface, unless "clusters are disabled" (what Ray does on Windows/macOS): then the node address is
# 127.0.0.1 and every server of the instance listens on loopback only. The flag is read from Ray's constants in
# this process and from the environment in the processes Ray starts.
LOCAL_ONLY_ENV = {ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _LocalOnly:
    """While active, Ray in this process treats the node as local-only: 127.0.0.1 stays 127.0.0.1."""

    def __enter__(self) -> None:
        self._flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False

    def __exit__(self, *exc_info: object) -> None:
        ray_constants.ENABLE_RAY_CLUSTER = self._flag


class _GroupedSpawn:
    """While active, every process Ray starts from this process (GCS, raylet, dashboard, monitors; the raylet's
    agents inherit it) joins one new process group, watched by fray.watchdog from its first member on; and Ray
    treats this node as local-only (loopback addresses). Used around ray.init under the module lock."""

    def __init__(self) -> None:
        self.pgid: int | None = None

    def __enter__(self) -> _GroupedSpawn:
        original = self._original = ray_services.ConsolePopen
        spawn = self

        class GroupedPopen(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                group, then = spawn.pgid or 0, kwargs.get("preexec_fn")

                def join_group() -> None:  # in the child, before exec (Popen's process_group needs 3.11)
                    os.setpgid(0, group)
                    if then is not None:
                        then()

                kwargs["preexec_fn"] = join_group
                kwargs["env"] = {**(kwargs.get("env") or os.environ), **LOCAL_ONLY_ENV}
                super().__init__(*args, **kwargs)
                if spawn.pgid is None:
                    spawn.pgid = self.pid
                    watchdog.watch_group(self.pid)

        ray_services.ConsolePopen = GroupedPopen  # type: ignore[misc]
        self._cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        return self

    def __exit__(self, *exc_info: object) -> None:
        ray_services.ConsolePopen = self._original  # type: ignore[misc]
        ray_constants.ENABLE_RAY_CLUSTER = self._cluster_flag


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def stop_group(pgid: int, grace: float = 5.0) -> None:
    """SIGTERM what is left of process group pgid, SIGKILL it after `grace` seconds, and wait until it is gone."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if group_members(pgid):
        log.warning("process group %d of a private Ray did not end", pgid)


def _stop_private(pgid: int | None, temp_dir: str) -> None:
    """After ray.shutdown(): end whatever of the instance's group is left, then remove its temp dir (only once
    nothing writes there any more), and take both off the watchdog's list."""
    if pgid is not None:
        stop_group(pgid)
        watchdog.forget_group(pgid)
    shutil.rmtree(temp_dir, ignore_errors=True)
    watchdog.forget_path(temp_dir)


def _driver_path_env() -> dict[str, Any] | None:
    """Workers of a private local Ray see the modules this driver sees: its sys.path entries outside the Python
    installation (a script's directory, a test directory pytest inserted) go to the workers' PYTHONPATH.
    Installed packages are left out, so a task's pip runtime_env is never shadowed."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    extra: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path == p or path.startswith(p + os.sep) for p in prefixes):
            continue
        if path not in extra:
            extra.append(path)
    if os.environ.get("PYTHONPATH"):
        extra.append(os.environ["PYTHONPATH"])
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(extra)}} if extra else None


# Ray puts unix sockets under the temp dir, and a unix socket path has at most 107 bytes. The longest one, with
# fray's temp dir under `base`: base + "/fray-rayc-XXXXXXXX" (19) + "/session_YYYY-MM-DD_HH-MM-SS_ffffff_PID"
# (42 with a 7-digit pid) + "/sockets/" (9) + the socket's name: the dashboard's "dash_<ModuleName>"
# ("dash_TaskEventsHead", 19, in Ray 2.60; a margin of 5 for modules to come).
_SOCKET_PATH_MAX = 107
_UNDER_BASE = 19 + 42 + 9 + 24


def short_tmp() -> str:
    """The directory for a private Ray's temp dir: RAY_TMPDIR or the usual temp dir if Ray's longest socket path
    fits under it, else /tmp."""
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return base if len(base.rstrip("/")) + _UNDER_BASE <= _SOCKET_PATH_MAX else "/tmp"
