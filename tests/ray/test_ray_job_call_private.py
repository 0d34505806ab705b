"""A callable job's pickle (FRAY_JOB_CALL, which holds whatever its arguments and closure hold) stays out of the
job record of a Ray cluster fray started, which Ray shows to whoever reaches the cluster's dashboard or Job API:
it travels in a private file of the user's state directory that the job's supervisor reads and removes. What stays
in the record (a job's --env values) is said in docs/security.md. A real private Ray head."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fray
from fray.jobs.call import CALL_FILE_VAR, CALL_VAR
from fray.testing import workloads as w
from fray.types import RuntimeEnv
from fray_ray.cluster import RayClusterContext


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RayClusterContext]:
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))
    with fray.cluster("ray?num_cpus=1") as context:
        assert isinstance(context, RayClusterContext)
        yield context


def test_a_callable_jobs_pickle_is_not_in_the_ray_job_record(cluster: RayClusterContext, tmp_path: Path) -> None:
    job = cluster.create_job(w.add, RuntimeEnv(env={"KEPT": "in the record"}), args=(2,), kwargs={"b": 5})
    info = job.wait(120)
    assert info.status == "SUCCEEDED" and info.result == 7, info
    shown = cluster._client.get_job_info(job.id).runtime_env.get("env_vars", {})
    assert CALL_VAR not in shown, "the callable's pickle is in the job record the cluster shows"
    assert shown.get("KEPT") == "in the record" and CALL_FILE_VAR in shown
    stash = tmp_path / "state" / "ray-job-calls"
    assert stash.is_dir() and oct(stash.stat().st_mode & 0o777) == oct(0o700)
    assert list(stash.iterdir()) == [], "the supervisor removes the call's file once read"
