"""Connecting this process to Ray: a private local instance, or an existing cluster; and token auth.

Ray keeps one connection per process, so several RayJobContexts in one process share it: the connection is
reference-counted and released when the last context that made it shuts down. A private instance is started
with address="local" (never silently joining someone's `ray start` cluster) in its own temp dir, and is stopped
(and its temp dir removed) at that point. A cluster we merely joined is only disconnected from.

A private instance's processes (GCS, raylet, its agents, dashboard, monitors) are started in one new process
group, and that group and the temp dir are handed to fray.watchdog: if this process ends without shutdown (even
by SIGKILL), the watchdog kills the group and removes the dir. Ray's workers put themselves in groups of their
own; they exit by themselves within a few seconds of their raylet. The instance listens on loopback only.

Token auth: a driver's auth mode must match the cluster's (see `join_auth_mode`). A cluster fray starts (the
private instance, a private or `fray cluster start` head) runs in token mode, as Ray does by default; a cluster
joined by address is asked which mode it enforces. The mode is set in RAY_AUTH_MODE for the life of the
connection and the previous value restored when it is released.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
import ray._private.services as ray_services

from fray import watchdog
from fray.net import is_loopback
from fray.procfs import Identity, stop_group

log = logging.getLogger("fray_ray")

_lock = threading.Lock()


@dataclass
class _Connection:
    started_here: bool  # we started a private Ray instance (so we stop it)
    connected_here: bool  # we called ray.init (so we call ray.shutdown)
    temp_dir: str | None
    users: int = 0
    leader: Identity | None = None  # the leader of a private instance's process group (its first process)
    auth: tuple[str | None, str | None] | None = None  # RAY_AUTH_MODE before we connected (restored after)


_conn: _Connection | None = None


AUTH_MODE_ENV = "RAY_AUTH_MODE"
_fray_auth_mode: str | None = None  # the RAY_AUTH_MODE value fray itself last wrote into os.environ
_own_clusters: set[str] = set()  # GCS addresses (host:port) of the heads this process started
_PROBE_TIMEOUT = 5.0  # seconds the auth probe waits for the cluster's GCS to answer


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return Path(path).expanduser().is_file()
    return (Path.home() / ".ray" / "auth_token").is_file()


def user_auth_mode() -> str | None:
    """RAY_AUTH_MODE as the user chose it: None if it is unset or holds the value fray wrote there."""
    value = os.environ.get(AUTH_MODE_ENV)
    if value is None or value == _fray_auth_mode:
        return None
    return value


def set_auth_mode(mode: str | None) -> None:
    """Put Ray in this process in auth mode `mode` ("token", "disabled"; None: Ray's default for a client, no
    token) and remember that fray chose it. Ray reads the mode from RAY_AUTH_MODE when it (re)loads its config:
    only call this while this process is not connected to Ray."""
    global _fray_auth_mode
    if mode is None:
        os.environ.pop(AUTH_MODE_ENV, None)
    else:
        os.environ[AUTH_MODE_ENV] = mode
    _fray_auth_mode = mode
    try:  # refresh Ray's cached config so this process observes the mode
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    except Exception:  # pragma: no cover - older/newer Ray without this hook
        pass


def _auth_state() -> tuple[str | None, str | None]:
    return os.environ.get(AUTH_MODE_ENV), _fray_auth_mode


def _restore_auth(saved: tuple[str | None, str | None]) -> None:
    global _fray_auth_mode
    if _auth_state() == saved:
        return
    set_auth_mode(saved[0])
    _fray_auth_mode = saved[1]


def own_cluster_mode() -> str:
    """The auth mode of a cluster fray starts itself: "token" (Ray's default for a new cluster), with a token
    made (~/.ray/auth_token, as ray.init does for a new local cluster) if none is available; unless the user
    chose a mode in RAY_AUTH_MODE."""
    chosen = user_auth_mode()
    if chosen is not None:
        return chosen
    if not token_available():
        from ray._private.authentication.authentication_token_setup import generate_and_save_token
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        generate_and_save_token()
        AuthenticationTokenLoader.instance().reset_cache()
    return "token"


def token_headers() -> dict[str, str]:
    """For a client of a cluster's HTTP APIs (Job API, dashboard): the header carrying the token, whatever
    this process's mode (it may be joined to a cluster without token auth meanwhile); {} if no token is
    available or the user chose RAY_AUTH_MODE=disabled. A dashboard without token auth ignores the header."""
    if (user_auth_mode() or "").lower() == "disabled" or not token_available():
        return {}
    try:
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        return dict(AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True))
    except Exception:  # an unreadable token: Ray's own error follows at the first request
        return {}


def note_own_cluster(gcs_address: str) -> None:
    """Record the GCS address of a head this process started (joined in token mode without asking it)."""
    _own_clusters.add(gcs_address)


def is_own_cluster(address: str) -> bool:
    """A head fray started: in this process, or the one `fray cluster start` recorded (still running)."""
    if address in _own_clusters:
        return True
    try:
        from fray import state

        record = state.read_cluster("ray")
        leader = Identity.from_record(record.get("leader")) if record else None
        return bool(record and record.get("gcs_address") == address and leader is not None and leader.running())
    except Exception:  # no readable record
        return False


def _gcs_target(address: str) -> str | None:
    """host:port of the GCS at a ray.init address, or None (Ray Client ray://, another scheme, not found)."""
    if address == "auto":
        try:
            return ray_services.canonicalize_bootstrap_address(address)
        except Exception:
            return None
    if "://" in address:
        return None
    return address


def cluster_auth_mode(address: str, timeout: float = _PROBE_TIMEOUT) -> str | None:
    """What the cluster at `address` enforces, asked of its GCS with one request that carries no token
    (GetClusterId, ~1-5 ms): "token" if it refuses the request (UNAUTHENTICATED), "disabled" if it answers it,
    None if that cannot be told (Ray Client address, unreachable, not a GCS, ...)."""
    target = _gcs_target(address)
    if target is None:
        return None
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        with grpc.insecure_channel(target) as channel:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
            request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]
            stub.GetClusterId(request, timeout=timeout, wait_for_ready=True)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if callable(code) and getattr(code(), "name", None) == "UNAUTHENTICATED":
            return "token"
        log.debug("could not tell the auth mode of the Ray cluster at %s: %s", address, exc)
        return None
    return "disabled"


def join_auth_mode(address: str) -> str | None:
    """The auth mode this process must use to join the cluster at `address` (None: leave RAY_AUTH_MODE as is).

    A driver's mode must be the cluster's: a driver in token mode refuses the cluster's token-less calls to its
    own core worker, and in a cluster without token auth the GCS then cancels every non-detached actor the
    driver owns ("Actor creation cancelled"), while tasks and detached actors still work. So:
    - RAY_AUTH_MODE chosen by the user: kept (a warning if the cluster visibly disagrees with "token");
    - a head fray started (this process's, or the one `fray cluster start` recorded): "token", not asked;
    - otherwise the cluster's GCS is asked (`cluster_auth_mode`): "token" or "disabled";
    - if it cannot be told: "token" when a token is available (Ray's default for new clusters), else unchanged.
    """
    chosen = user_auth_mode()
    if chosen is not None:
        if chosen.lower() == "token" and cluster_auth_mode(address, timeout=1.0) == "disabled":
            log.warning(
                "RAY_AUTH_MODE=token, but the Ray cluster at %s runs without token auth: it cannot reach this "
                "driver, so actors that are not detached will never be created. Unset RAY_AUTH_MODE (fray then "
                "follows the cluster) or set it to 'disabled'.",
                address,
            )
        return None
    if is_own_cluster(address):
        return "token"
    mode = cluster_auth_mode(address)
    if mode is None and token_available():
        return "token"
    return mode


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
            saved = _auth_state()
            mode = join_auth_mode(address)
            if mode is not None:
                set_auth_mode(mode)
            try:
                if _is_loopback(address):
                    # A private head of fray's (or any node on loopback): Ray would rewrite 127.0.0.1 to this
                    # machine's outward address, where such a node does not listen.
                    with _LocalOnly():
                        ray.init(address=address, **common)
                else:
                    ray.init(address=address, **common)
            except BaseException:
                if ray.is_initialized():
                    ray.shutdown()
                _restore_auth(saved)
                raise
            _conn = _Connection(started_here=False, connected_here=True, temp_dir=None, users=1, auth=saved)
            return
        saved = _auth_state()
        if user_auth_mode() is None:  # token, as Ray would for a new cluster, but undone when we disconnect
            set_auth_mode(own_cluster_mode())
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
            _stop_private(spawn.leader, temp_dir)
            _restore_auth(saved)
            raise
        _conn = _Connection(
            started_here=True, connected_here=True, temp_dir=temp_dir, users=1, leader=spawn.leader, auth=saved
        )


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
            _stop_private(conn.leader, conn.temp_dir)
        if conn.auth is not None:
            _restore_auth(conn.auth)


LOOPBACK = "127.0.0.1"
# Ray replaces a node address of 127.0.0.1 with the machine's outward address, and then its servers listen on
# every interface, unless "clusters are disabled" (what Ray does on Windows/macOS): then the node address is
# 127.0.0.1 and every server of the instance listens on loopback only. The flag is read from Ray's constants in
# this process and from the environment in the processes Ray starts.
LOCAL_ONLY_ENV = {ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}


def _is_loopback(address: str) -> bool:
    """The host of a Ray address (`http://h:p`, `h:p`) is this machine's loopback."""
    return is_loopback(address.split("://")[-1].rsplit(":", 1)[0])


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
        self.leader: Identity | None = None

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
                    spawn.leader = Identity.of(self.pid, zombie_ok=True)
                    watchdog.watch_group(self.pid)

        ray_services.ConsolePopen = GroupedPopen  # type: ignore[misc]
        self._cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        return self

    def __exit__(self, *exc_info: object) -> None:
        ray_services.ConsolePopen = self._original  # type: ignore[misc]
        ray_constants.ENABLE_RAY_CLUSTER = self._cluster_flag


def _stop_private(leader: Identity | None, temp_dir: str) -> None:
    """After ray.shutdown(): end whatever of the instance's group is left, then remove its temp dir (only once
    nothing writes there any more), and take both off the watchdog's list."""
    if leader is not None:
        if not stop_group(leader, grace=5.0):
            log.warning("process group %d of a private Ray did not end", leader.pid)
        watchdog.forget_group(leader.pid)
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
