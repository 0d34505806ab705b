"""Token auth for Ray: which mode a driver must use, and the token for HTTP clients.

A driver's auth mode must match the cluster's (see `join_auth_mode`). A cluster fray starts (the private
instance, a private or `fray cluster start` head) runs in token mode, as Ray does by default; a cluster joined by
address is asked which mode it enforces. The mode is set in RAY_AUTH_MODE for the life of a connection
(fray_ray._connect) and the previous value restored when it is released.

The token is the key to every cluster started with it: whoever reads it can run code there. The token file fray
makes is private to this user (0600, its directory 0700 when fray makes it); one that other users can read is
warned about, with the fix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray._private.services as ray_services

from fray_ray._local import is_loopback_address
from fray_ray._tokens import address_key, cluster_token, header_for, running_head_record

__all__ = [
    "AUTH_MODE_ENV",
    "auth_state",
    "cluster_auth_mode",
    "is_own_cluster",
    "is_own_job_api",
    "join_auth_mode",
    "note_own_cluster",
    "note_own_job_api",
    "own_cluster_mode",
    "restore_auth",
    "set_auth_mode",
    "token_available",
    "token_chosen",
    "token_headers",
    "token_path",
    "user_auth_mode",
    "warn_if_open",
    "warn_if_token_shared",
    "write_new_token",
]

log = logging.getLogger("fray_ray")

AUTH_MODE_ENV = "RAY_AUTH_MODE"
_fray_auth_mode: str | None = None  # the RAY_AUTH_MODE value fray itself last wrote into os.environ
_own_clusters: set[str] = set()  # GCS addresses (host:port) of the heads this process started
_own_job_apis: set[str] = set()  # Job API (dashboard) addresses of the token-mode heads this process started
_PROBE_TIMEOUT = 5.0  # seconds the auth probe waits for the cluster's GCS to answer
_warned_token_files: set[str] = set()  # token files open to other users, warned about once each
_warned_open: set[str] = set()  # GCS addresses (host:port) of clusters without token auth, warned about once each


def token_path() -> Path:
    """The token file Ray reads when RAY_AUTH_TOKEN is unset: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(path).expanduser() if path else Path.home() / ".ray" / "auth_token"


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = token_path()
    if not path.is_file():
        return False
    warn_if_token_shared(path)
    return True


def warn_if_token_shared(path: Path) -> None:
    """Warn (once per file) when other users may read or replace the token file at `path`."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077 and str(path) not in _warned_token_files:
        _warned_token_files.add(str(path))
        log.warning(
            "the Ray auth token file %s is open to other users (mode %03o): whoever reads it can run code on every "
            "Ray cluster that uses this token. Make it private: chmod 600 %s",
            path,
            mode & 0o777,
            path,
        )


def write_new_token() -> None:
    """Make a new token where Ray reads it (`token_path`), as `ray.init` does for a new local cluster, but
    private: the file is created 0600, never over an existing file or through a symlink, and a directory made
    for it is 0700 (Ray's own writes it 0644 into a 0755 ~/.ray). A file another process made meanwhile is
    used as it is."""
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    path = token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        warn_if_token_shared(path)
        return
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    log.info("made a new Ray auth token in %s", path)


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


def auth_state() -> tuple[str | None, str | None]:
    """(RAY_AUTH_MODE, the value fray last wrote there): saved before a connection, restored after it."""
    return os.environ.get(AUTH_MODE_ENV), _fray_auth_mode


def restore_auth(saved: tuple[str | None, str | None]) -> None:
    global _fray_auth_mode
    if auth_state() == saved:
        return
    set_auth_mode(saved[0])
    _fray_auth_mode = saved[1]


def own_cluster_mode() -> str:
    """The auth mode of a cluster fray starts itself: "token" (Ray's default for a new cluster), with a token
    made (`write_new_token`: ~/.ray/auth_token, as ray.init does for a new local cluster) if none is
    available; unless the user chose a mode in RAY_AUTH_MODE."""
    chosen = user_auth_mode()
    if chosen is not None:
        return chosen
    if not token_available():
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        write_new_token()
        AuthenticationTokenLoader.instance().reset_cache()
    return "token"


def token_headers(address: str | None = None) -> dict[str, str]:
    """For a client of a cluster's HTTP APIs (Job API, dashboard) at `address`: the header carrying that
    cluster's own token where fray started it (fray_ray._tokens), else the user's, whatever this process's mode
    (it may be joined to a cluster without token auth meanwhile); {} if no token is available or the user chose
    RAY_AUTH_MODE=disabled. A dashboard without token auth ignores the header."""
    own = cluster_token(address) if address else None
    if own is not None:
        return header_for(own)
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


def note_own_job_api(address: str) -> None:
    """Record the Job API (dashboard) address of a head this process started in token mode."""
    _own_job_apis.add(address_key(address))


def is_own_job_api(address: str) -> bool:
    """The Job API of a head fray started in token mode (in this process), or of the cluster `fray cluster start`
    recorded (still running): the clusters the user's token may go to without being asked for."""
    if address_key(address) in _own_job_apis:
        return True
    record = running_head_record()
    return record is not None and address_key(str(record.get("address", ""))) == address_key(address)


def token_chosen() -> bool:
    """The user chose token mode (RAY_AUTH_MODE=token): their token goes to every cluster, as Ray's own clients
    send it in that mode."""
    return (user_auth_mode() or "").lower() == "token"


def is_own_cluster(address: str) -> bool:
    """A head fray started: in this process, or the one `fray cluster start` recorded (still running)."""
    if address in _own_clusters:
        return True
    record = running_head_record()
    return record is not None and record.get("gcs_address") == address


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
    (GetClusterId, one round trip): "token" if it refuses the request (UNAUTHENTICATED), "disabled" if it answers it,
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
    A cluster found answering without a token is warned about (`warn_if_open`), on loopback too.
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
            warn_if_open(address)
        return None
    if is_own_cluster(address):
        return "token"
    mode = cluster_auth_mode(address)
    if mode == "disabled":
        warn_if_open(address)
    if mode is None and token_available():
        return "token"
    return mode


def warn_if_open(address: str) -> None:
    """Warn, once per address, that the cluster at `address` (found to answer without a token) runs code for
    anyone who can reach it: on loopback that is every user of this machine, so it is warned about too. Not when
    the user chose RAY_AUTH_MODE=disabled: that choice is theirs, and Ray does not warn about it either."""
    target = _gcs_target(address) or address
    if target in _warned_open:
        return
    _warned_open.add(target)
    who = "every user of this machine" if is_loopback_address(target) else "anyone who can reach that address"
    log.warning(
        "the Ray cluster at %s runs without token auth: %s can run code on it as the user it runs as (and read its "
        "data). Start it with token auth (RAY_AUTH_MODE=token and a token, `ray get-auth-token --generate`; see "
        "https://docs.ray.io/en/latest/ray-security/token-auth.html)%s.",
        target,
        who,
        "" if is_loopback_address(target) else ", or keep it on a private network",
    )
