"""Monarch's worker processes start with fray.runtime.worker_env's defaults: OMP_NUM_THREADS from the CPUs their actor
holds (1 for task processes), THP_MEM_ALLOC_ENABLE=1; a variable the user set wins."""

from __future__ import annotations

import os

import pytest
from _worker_env_probe import Member, blas_threads, worker_env

import fray
from fray import ActorOptions, RuntimeEnv, TaskOptions


def test_worker_processes_get_the_defaults_and_a_users_values_win() -> None:
    ctx = fray.init("monarch?procs=1&cpus=2")
    try:
        defaults = {"OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
        assert ctx.get(ctx.create_task(worker_env), timeout=120) == defaults
        group = ctx.create_actor_group(Member, 1, options=ActorOptions(resources={"CPU": 2}), distributed=True)
        assert ctx.get(group.env(), timeout=120) == [{"OMP_NUM_THREADS": "2", "THP_MEM_ALLOC_ENABLE": "1"}]
        mine = TaskOptions(runtime_env=RuntimeEnv(env={"THP_MEM_ALLOC_ENABLE": "0"}))
        assert ctx.get(ctx.create_task(worker_env, options=mine), timeout=120) == {
            "OMP_NUM_THREADS": "1",
            "THP_MEM_ALLOC_ENABLE": "0",
        }
    finally:
        fray.shutdown()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="on one core, BLAS starts one thread whatever the default")
def test_numpys_blas_in_a_worker_process_starts_with_the_processs_thread_count() -> None:
    """numpy is loaded as a worker process starts (its BLAS reads OMP_NUM_THREADS then, never again): the process
    must have its default by then, or its BLAS runs a thread per core of the machine in every process."""
    ctx = fray.init("monarch?procs=1&cpus=2")
    try:
        assert ctx.get(ctx.create_task(blas_threads), timeout=120) == [1]
        group = ctx.create_actor_group(Member, 1, options=ActorOptions(resources={"CPU": 2}), distributed=True)
        assert ctx.get(group.blas_threads(), timeout=120) == [[2]]
    finally:
        fray.shutdown()
