"""Driver for test_join_default_auth.py, run in its own process (Ray allows one connection per process).

Starts a one-node Ray cluster with ray.cluster_utils.Cluster in Ray's default mode for nodes started that way
(no token auth: RAY_AUTH_MODE unset), in a private temp dir, while a token IS available to the driver
(RAY_AUTH_TOKEN_PATH): the situation in which fray used to switch its driver to token mode, after which the
cluster could not reach the driver and every non-detached actor was cancelled ("Actor creation cancelled").
A fray driver joins it by address= and by RAY_ADDRESS, creates an ordinary actor and an actor group and calls
them; a driver whose user set RAY_AUTH_MODE=token only connects (and is warned). The cluster listens on this
machine's outward address, so joining it is warned about (anyone who can reach it can run code there). Then
exactly this cluster is stopped. Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile

TEMP_DIR = tempfile.mkdtemp(prefix="fray-da-", dir="/tmp")
os.environ["RAY_TMPDIR"] = TEMP_DIR  # sessions and the "current cluster" file stay private
os.makedirs(os.path.join(TEMP_DIR, "ray"))
os.environ.pop("RAY_AUTH_MODE", None)  # the nodes and the driver: Ray's default, nobody chose a mode
os.environ.pop("RAY_ADDRESS", None)
TOKEN = os.path.join(TEMP_DIR, "auth_token")
with open(TOKEN, "w") as f:
    f.write("fray-default-auth-test-token-0123456789abcdef")
os.environ["RAY_AUTH_TOKEN_PATH"] = TOKEN  # a token is available, as on any machine that ran Ray 2.60

import ray  # noqa: E402
from ray._private.authentication.authentication_utils import get_authentication_mode_name  # noqa: E402
from ray._raylet import get_authentication_mode  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import fray  # noqa: E402
from fray_ray import _auth, _local  # noqa: E402


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def bump(self) -> int:
        self.n += 1
        return self.n


class Rank:
    def rank(self) -> int:
        info = fray.current_actor()
        return -1 if info is None or info.rank is None else info.rank


def work(ctx: fray.JobContext) -> dict[str, object]:
    """An ordinary (non-detached, unnamed) actor, an actor group, a task; the driver's auth mode meanwhile."""
    seen: dict[str, object] = {"driver_mode": get_authentication_mode_name(get_authentication_mode())}
    try:
        counter = ctx.create_actor(Counter)
        ctx.get(counter.bump(), timeout=60)
        seen["actor"] = ctx.get(counter.bump(), timeout=60)
        group = ctx.create_actor_group(Rank, 2)
        seen["group"] = ctx.get(group.rank(), timeout=60)
        ctx.kill(group)
        seen["task"] = ctx.get(ctx.create_task(sum, args=([1, 2],)), timeout=60)
    except Exception as exc:  # reported, not raised: the cluster must still be stopped
        seen["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return seen


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": 80_000_000,
            "temp_dir": os.path.join(TEMP_DIR, "ray"),
            "include_dashboard": False,
        },
    )
    out: dict[str, object] = {}
    joins = Warnings()
    logging.getLogger("fray_ray").addHandler(joins)
    try:
        address = cluster.address
        out["address_is_loopback"] = _local.is_loopback_address(address)
        out["probe"] = _auth.cluster_auth_mode(address)
        ctx = fray.init(f"ray?address={address}&namespace=fray-da&log_to_driver=false")
        try:
            out["by_address"] = work(ctx)
        finally:
            fray.shutdown()
        out["mode_after"] = os.environ.get("RAY_AUTH_MODE")  # restored: nobody had chosen one
        os.environ["RAY_ADDRESS"] = address
        ctx = fray.init("ray?namespace=fray-da&log_to_driver=false")
        try:
            out["by_env"] = work(ctx)
        finally:
            fray.shutdown()
            del os.environ["RAY_ADDRESS"]
        # joined twice: a cluster that answers without a token is warned about once, on loopback too
        out["open_warnings"] = [m for m in joins.messages if "can run code on it as the user it runs as" in m]
        out["address"] = address
        # The user's explicit choice is kept, with a warning that this cluster cannot create their actors.
        os.environ["RAY_AUTH_MODE"] = "token"
        caught = Warnings()
        logging.getLogger("fray_ray").addHandler(caught)
        fray.init(f"ray?address={address}&log_to_driver=false")
        out["user_token_mode"] = get_authentication_mode_name(get_authentication_mode())
        fray.shutdown()
        out["user_token_warned"] = any("runs without token auth" in m for m in caught.messages)
        out["user_mode_after"] = os.environ.get("RAY_AUTH_MODE")
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(TEMP_DIR, ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
