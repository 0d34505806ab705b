"""A job submitted while the head's job agent is not there (a fresh head on a loaded machine starts it last).

Real Ray: the agent's address is taken out of the head's GCS (where Ray's job head looks it up), so Ray's own
Job API answers what it answers when the agent is slow to start ('No available agent to submit job'); putting
the address back is the agent coming up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from fray.errors import FrayError
from fray_ray import cluster as ray_cluster
from fray_ray.cluster import RayClusterContext

_KV_TOOL = textwrap.dedent(
    """
    import base64, json, sys, time
    from ray._raylet import GcsClient
    from ray._private import ray_constants
    from ray.dashboard import consts

    ns, gcs = ray_constants.KV_NAMESPACE_DASHBOARD, GcsClient(address=sys.argv[1])
    prefix = consts.DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX.encode()
    if sys.argv[2] == "take":  # once the agent has written its address
        for _ in range(240):
            keys = gcs.internal_kv_keys(prefix, namespace=ns)
            if keys:
                break
            time.sleep(0.25)
        taken = {k.decode(): base64.b64encode(gcs.internal_kv_get(k, namespace=ns)).decode() for k in keys}
        for key in keys:
            gcs.internal_kv_del(key, False, namespace=ns)
        print(json.dumps(taken))
    else:
        for key, value in json.loads(sys.stdin.read()).items():
            gcs.internal_kv_put(key.encode(), base64.b64decode(value), True, namespace=ns)
    """
)


def _kv(cluster: RayClusterContext, verb: str, given: str = "") -> str:
    assert cluster.gcs_address is not None
    token = cluster._head.token_file  # type: ignore[attr-defined]  # (fray's own head: a token of its own)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    done = subprocess.run(
        [sys.executable, "-c", _KV_TOOL, cluster.gcs_address, verb],
        env=env,
        input=given,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def cluster() -> Iterator[RayClusterContext]:
    context = RayClusterContext(num_cpus=1)
    yield context
    context.shutdown()


def test_a_job_waits_for_the_agent_and_runs(cluster: RayClusterContext) -> None:
    taken = _kv(cluster, "take")
    assert taken.strip() not in ("", "{}"), "the agent's address was never written"
    back = threading.Timer(12.0, lambda: _kv(cluster, "put", taken))  # (past Ray's own 10 s wait)
    back.start()
    try:
        job = cluster.create_job("echo agent-came-back")
        assert job.wait(timeout=120).status.value == "SUCCEEDED"
    finally:
        back.join()


def test_an_agent_that_never_comes_is_a_clear_error(
    cluster: RayClusterContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_cluster, "AGENT_WAIT", 5.0)
    taken = _kv(cluster, "take")
    start = time.monotonic()
    try:
        with pytest.raises(FrayError, match="job agent is not up") as info:
            cluster.create_job("echo never")
        assert cluster.address in str(info.value)
        assert time.monotonic() - start < 60  # (Ray's own 10 s a try, then the bound)
    finally:
        _kv(cluster, "put", taken)
