"""A Ray job that asks for GPUs gets the devices Ray assigns it, and its ranks split them (fray.jobs.supervisor):
on this machine without GPUs, a private head that declares 4 (`ray start --num-gpus 4`), so Ray assigns ids as
it would on a GPU node."""

from __future__ import annotations

import sys

import pytest
from _job_gpus import SHOW, seen_devices

import fray
from fray import JobStatus


def test_a_jobs_ranks_split_the_gpus_ray_assigns_it() -> None:
    with fray.cluster("ray?num_cpus=2&num_gpus=4&object_store_memory=80000000") as cluster:
        job = cluster.create_job([sys.executable, "-c", SHOW], replicas=2, resources={"GPU": 2, "CPU": 0.5})
        info = job.wait(timeout=180)
        assert info.status is JobStatus.SUCCEEDED, job.logs()
        seen = seen_devices(job.logs())
        assert set(seen) == {"0", "1"}, job.logs()
        devices = [d for ids in seen.values() for d in ids.split(",")]
        assert len(devices) == 4 and len(set(devices)) == 4, seen  # two each, none shared
        with pytest.raises(fray.InfeasibleResourcesError, match="GPU"):
            cluster.create_job("true", replicas=3, resources={"GPU": 2})
