"""A job holding GPUs gets devices of its own (fray.jobs.local.LocalJobs with a DevicePool), and its ranks split them
(fray.jobs.supervisor): on this machine without GPUs, with GPUs declared (in_memory?gpus=4) and named by
CUDA_VISIBLE_DEVICES as they would be on a GPU host."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _job_gpus import SHOW, seen_devices

import fray
from fray import JobStatus


def test_each_job_and_each_rank_hold_their_own_gpus() -> None:
    with fray.cluster("in_memory?gpus=4") as cluster:
        wait = "import time; time.sleep(2)"
        first = cluster.create_job([sys.executable, "-c", f"{SHOW}; {wait}"], replicas=2, resources={"GPU": 1})
        second = cluster.create_job([sys.executable, "-c", f"{SHOW}; {wait}"], replicas=2, resources={"GPU": 1})
        third = cluster.create_job([sys.executable, "-c", SHOW], resources={"GPU": 2})
        time.sleep(0.5)
        assert cluster.get_job(third).status is JobStatus.PENDING  # the 4 devices are held by the first two
        infos = fray.wait_jobs([first, second, third], timeout=120)
        assert all(info.status is JobStatus.SUCCEEDED for info in infos)
        seen = [seen_devices(job.logs()) for job in (first, second)]
        assert sorted([*seen[0].values(), *seen[1].values()]) == ["0", "1", "2", "3"]  # one device each, none shared
        assert set(seen[0]) == set(seen[1]) == {"0", "1"}
        assert third.logs().split()[-1] in ("0,1", "2,3")  # a two-GPU job's one rank sees both, whole
        with pytest.raises(fray.InfeasibleResourcesError):
            cluster.create_job("true", replicas=5, resources={"GPU": 1})


def test_the_supervisor_slices_what_the_job_sees() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}
    argv = [sys.executable, "-m", "fray.jobs.supervisor", "--replicas", "2", "--gpus-per-rank", "2", "--",
            sys.executable, "-c", SHOW]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert seen_devices(done.stdout) == {"0": "GPU-a,GPU-b", "1": "GPU-c,GPU-d"}
    env["CUDA_VISIBLE_DEVICES"] = "0"
    short = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "need 4 GPUs" in short.stderr and "shows the job 1" in short.stderr
