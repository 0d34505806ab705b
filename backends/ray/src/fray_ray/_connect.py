"""Connecting this process to Ray: a private local instance, or an existing cluster; and token auth.

Ray keeps one connection per process, so several RayJobContexts in one process share it: the connection is
reference-counted and released when the last context that made it shuts down. A private instance is started
with address="local" (never silently joining someone's `ray start` cluster) in its own temp dir, and is stopped
(and its temp dir removed) at that point. A cluster we merely joined is only disconnected from.
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

log = logging.getLogger("fray_ray")

_lock = threading.Lock()


@dataclass
class _Connection:
    started_here: bool  # we started a private Ray instance (so we stop it)
    connected_here: bool  # we called ray.init (so we call ray.shutdown)
    temp_dir: str | None
    users: int = 0


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
            ray.init(address=address, **common)
            _conn = _Connection(started_here=False, connected_here=True, temp_dir=None, users=1)
            return
        temp_dir = tempfile.mkdtemp(prefix="fray-ray-", dir=_short_tmp())
        try:
            ray.init(
                address="local",
                include_dashboard=False,
                _temp_dir=temp_dir,
                runtime_env=_driver_path_env(),
                **init_kwargs,
                **common,
            )
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        _conn = _Connection(started_here=True, connected_here=True, temp_dir=temp_dir, users=1)


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
        if conn.temp_dir:
            shutil.rmtree(conn.temp_dir, ignore_errors=True)


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


def _short_tmp() -> str:
    # Ray puts unix sockets in the temp dir; their paths must stay under ~107 bytes.
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return base if len(base) < 40 else "/tmp"
