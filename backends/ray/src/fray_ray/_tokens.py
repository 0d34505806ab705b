"""A token of its own for each cluster fray starts on this machine, so that whoever reads one reaches one cluster.

A head fray starts on loopback (a private one, or `fray cluster start` without `--listen`) and the private
instance of a job context are given a fresh token in a directory of its own (0600 in 0700: not in the cluster's
temp dir, which Ray makes writable by every user), which their processes read through RAY_AUTH_TOKEN_PATH, set in
the environment they start with (their jobs and workers inherit it). This process reads it while connected to that
cluster (`use`) and sends it to that cluster's Job API alone (`header_for`); the `fray cluster start` record names
it for later commands. A head that listens beyond loopback keeps the user's own token (~/.ray/auth_token): other
machines' nodes join it with theirs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fray.backend import Identity, watchdog
from fray_ray._local import short_tmp

__all__ = [
    "TOKEN_VARS",
    "address_key",
    "cluster_token",
    "header_for",
    "new_token_file",
    "note_cluster_token",
    "remove",
    "restore",
    "running_head_record",
    "use",
]

TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # where Ray looks for its token, in that order
TOKEN_FILE = "auth_token"
_tokens: dict[str, Path] = {}  # GCS addresses and Job API addresses of clusters this process started -> token


def address_key(address: str) -> str:
    """One spelling of an address (a Job API URL, or a GCS host:port): `http://host:port`, in lower case."""
    return (address if "://" in address else f"http://{address}").rstrip("/").lower()


def running_head_record() -> dict[str, Any] | None:
    """The record of the head `fray cluster start` made, while its process still runs (else None)."""
    try:
        from fray.backend import state_dir

        record = state_dir.read_cluster("ray")
        leader = Identity.from_record(record.get("leader")) if record else None
        return record if record and leader is not None and leader.running() else None
    except Exception:  # no readable record
        return None


def new_token_file(owned: bool) -> Path:
    """A fresh token for one cluster, 0600 in a new directory of its own (0700). An `owned` one's directory goes
    when this process ends, however it ends (fray.host.watchdog); else `remove` it with its cluster."""
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    directory = tempfile.mkdtemp(prefix="fray-raytoken-", dir=short_tmp())
    if owned:
        watchdog.watch_path(directory)
    path = Path(directory) / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    return path


def remove(path: Path | None, owned: bool) -> None:
    """A token file and its directory, once its cluster is stopped; and from the addresses it was noted for."""
    if path is None:
        return
    for address in [a for a, p in _tokens.items() if p == path]:
        del _tokens[address]
    shutil.rmtree(path.parent, ignore_errors=True)
    if owned:
        watchdog.forget_path(str(path.parent))


def note_cluster_token(path: Path, *addresses: str) -> None:
    """The token of a cluster this process started, reached at these addresses (its GCS, its Job API)."""
    for address in addresses:
        _tokens[address_key(address)] = path


def cluster_token(address: str) -> Path | None:
    """The token file of the cluster at `address` if fray started it: in this process, or the one `fray cluster
    start` recorded (still running)."""
    found = _tokens.get(address_key(address))
    if found is not None:
        return found
    record = running_head_record()
    if not record or not record.get("token_file"):
        return None
    ours = {address_key(str(record.get("address", ""))), address_key(str(record.get("gcs_address", "")))}
    return Path(str(record["token_file"])) if address_key(address) in ours else None


def use(path: Path | None) -> dict[str, str | None]:
    """Make Ray in this process read its token from `path` (None: as the environment says); returns what the
    environment said before, for `restore`."""
    saved = {name: os.environ.get(name) for name in TOKEN_VARS}
    if path is not None:
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
        _reload()
    return saved


def restore(saved: dict[str, str | None] | None) -> None:
    if saved is None or all(os.environ.get(name) == value for name, value in saved.items()):
        return
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _reload()


def header_for(path: Path) -> dict[str, str]:
    """The HTTP header that carries the token in `path`, as Ray's own clients send it (read from the file, not
    through Ray's loader, whose one cached token this process's connection may be using meanwhile)."""
    from ray._private.authentication.authentication_constants import (
        AUTHORIZATION_BEARER_PREFIX,
        AUTHORIZATION_HEADER_NAME,
    )

    return {AUTHORIZATION_HEADER_NAME: AUTHORIZATION_BEARER_PREFIX + path.read_text().strip()}


def _reload() -> None:
    """Ray caches the token it loaded: drop it, so the next use reads the one the environment names now."""
    try:
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # pragma: no cover - a Ray without the loader: nothing cached
        pass
