"""Connecting this process to Ray: a private local instance, or an existing cluster.

Ray keeps one connection per process, so several RayJobContexts in one process share it: the connection is
reference-counted and released when the last context that made it shuts down. A private instance is started
with address="local" (never silently joining someone's `ray start` cluster) in its own temp dir, its processes
in one process group watched by fray.host.watchdog, listening on loopback only (fray_ray._local); it is stopped (and
its temp dir removed) at that point. A cluster we merely joined is only disconnected from.

The driver's auth mode is the cluster's (fray_ray._auth): set in RAY_AUTH_MODE for the life of the connection,
the previous value restored when it is released.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import ray

from fray.backend import Identity, watchdog
from fray_ray._auth import auth_state, join_auth_mode, restore_auth, set_auth_mode, user_auth_mode
from fray_ray._forwarded_output import settle, this_nodes_logs
from fray_ray._local import (
    LOOPBACK,
    GroupedSpawn,
    LocalOnly,
    WithoutHeadExtras,
    driver_path_vars,
    is_loopback_address,
    short_tmp,
    stop_private,
    with_worker_preload,
)
from fray_ray._tokens import cluster_token, new_token_file
from fray_ray._tokens import remove as remove_token
from fray_ray._tokens import restore as restore_tokens
from fray_ray._tokens import use as use_token

__all__ = ["acquire", "dashboard_url", "http_link", "on_a_private_instance", "release"]

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
    tokens: dict[str, str | None] | None = None  # where Ray's token came from before we connected (restored after)
    token_file: Path | None = None  # the private instance's own token (removed with it)
    forwards_output: bool = False  # log_to_driver: the workers' lines are relayed to this process's console


_conn: _Connection | None = None


def _on_a_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


# In every worker of this job: work given no GPU sees none (Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the worker
# inherited it for such work, every device of the node, unless this is set), so CUDA in a CPU-only task or actor
# never starts on a device that other work holds, and a CUDA value read there arrives on the CPU
# (fray.runtime.cuda_values).
_WORKERS_ENV = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}


def acquire(
    address: str | None,
    namespace: str | None,
    init_kwargs: dict[str, Any],
    log_to_driver: bool,
) -> None:
    """Connect (or reuse this process's connection). Raises ValueError on a conflicting namespace."""
    global _conn
    if "RAY_COLOR_PREFIX" not in os.environ and not _on_a_terminal():
        # Ray colours the prefixes of the lines it relays ("(raylet)", "(task pid=N)") even into a file or a pipe,
        # where the codes are noise; on a terminal they stay.
        os.environ["RAY_COLOR_PREFIX"] = "0"
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
        workers_env = dict(_WORKERS_ENV)
        if address and address != "local":
            if init_kwargs:
                log.warning("joining the Ray cluster at %s: ignoring sizing options %s", address, sorted(init_kwargs))
            saved = auth_state()
            mode = join_auth_mode(address)
            if mode is not None:
                set_auth_mode(mode)
            # (a cluster fray started: its own token)
            tokens: dict[str, str | None] | None = use_token(cluster_token(address))
            try:
                if is_loopback_address(address):
                    # A private head of fray's (or any node on loopback): Ray would rewrite 127.0.0.1 to this
                    # machine's outward address, where such a node does not listen.
                    with LocalOnly():
                        ray.init(address=address, runtime_env={"env_vars": workers_env}, **common)
                else:
                    ray.init(address=address, runtime_env={"env_vars": workers_env}, **common)
            except BaseException:
                if ray.is_initialized():
                    ray.shutdown()
                restore_tokens(tokens)
                restore_auth(saved)
                raise
            _conn = _Connection(
                started_here=False,
                connected_here=True,
                temp_dir=None,
                users=1,
                auth=saved,
                tokens=tokens,
                forwards_output=log_to_driver,
            )
            return
        saved = auth_state()
        temp_dir = tempfile.mkdtemp(prefix="fray-ray-", dir=short_tmp())
        watchdog.watch_path(temp_dir)
        tokens, token = None, None
        if (user_auth_mode() or "token").lower() == "token":  # token, as Ray for a new cluster: one of its own
            set_auth_mode("token")
            token = new_token_file(owned=True)
            tokens = use_token(token)  # (its processes inherit RAY_AUTH_TOKEN_PATH)
        # The workers' environment is the raylet's (GroupedSpawn), not a job runtime_env: see GroupedSpawn.
        spawn = GroupedSpawn({**workers_env, **driver_path_vars()})
        try:
            with spawn, WithoutHeadExtras():
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _temp_dir=temp_dir,
                    _node_ip_address=LOOPBACK,
                    **with_worker_preload(init_kwargs),
                    **common,
                )
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            stop_private(spawn.leader, temp_dir)
            remove_token(token, owned=True)
            restore_tokens(tokens)
            restore_auth(saved)
            raise
        _conn = _Connection(
            started_here=True,
            connected_here=True,
            temp_dir=temp_dir,
            users=1,
            leader=spawn.leader,
            auth=saved,
            tokens=tokens,
            token_file=token,
            forwards_output=log_to_driver,
        )


def on_a_private_instance() -> bool:
    """This process runs on a private Ray instance fray started: its one node is on loopback, so every worker
    is a process of this host."""
    with _lock:
        return _conn is not None and _conn.started_here


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
            if conn.forwards_output:
                settle(this_nodes_logs())
            ray.shutdown()
        if conn.started_here and conn.temp_dir:
            stop_private(conn.leader, conn.temp_dir)
        remove_token(conn.token_file, owned=True)
        if conn.tokens is not None:
            restore_tokens(conn.tokens)
        if conn.auth is not None:
            restore_auth(conn.auth)


def http_link(url: str | None) -> str | None:
    """`url` as a link to show: http(s) only (a bare host:port is http), with no credentials, query or fragment
    (a token never goes on a page); None otherwise."""
    if not url:
        return None
    parsed = urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    return urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))


def dashboard_url() -> str | None:
    """The URL of the dashboard of the Ray cluster this process is connected to, None if it runs none (fray's
    private Ray: include_dashboard=False): Ray's RAY_OVERRIDE_DASHBOARD_URL where set (as ray.init shows it),
    else the address the dashboard put in the GCS KV (Ray's own source for it; empty without a dashboard)."""
    override = os.environ.get("RAY_OVERRIDE_DASHBOARD_URL")
    if override:
        return http_link(override)
    try:
        from ray.experimental import internal_kv

        value = internal_kv._internal_kv_get("webui:url", namespace="dashboard")
    except Exception:  # not connected, or the GCS did not answer
        return None
    return http_link(value.decode() if value else None)
