"""Environment defaults of the processes fray starts (fray.worker_env), and in_memory's child processes getting
them: OMP_NUM_THREADS from the CPUs their actor holds (1 for tasks), THP_MEM_ALLOC_ENABLE=1, a user's value winning."""

from __future__ import annotations

from _worker_env_probe import Member, worker_env

import fray
from fray import ActorOptions, RuntimeEnv, TaskOptions
from fray.worker_env import worker_env_defaults


def test_defaults_follow_the_cpus_and_leave_what_is_set() -> None:
    assert worker_env_defaults(None, {}) == {"OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
    assert worker_env_defaults(0.5, {})["OMP_NUM_THREADS"] == "1"
    assert worker_env_defaults(3.0, {})["OMP_NUM_THREADS"] == "3"
    assert worker_env_defaults(2, {"OMP_NUM_THREADS": "8", "PATH": "/bin"}) == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert worker_env_defaults(None, {"THP_MEM_ALLOC_ENABLE": "0", "OMP_NUM_THREADS": "4"}) == {}


def test_in_memory_child_processes_get_the_defaults_and_a_users_values_win() -> None:
    ctx = fray.init("in_memory?cpus=2")
    try:
        group = ctx.create_actor_group(Member, 2, options=ActorOptions(resources={"CPU": 1}), distributed=True)
        assert ctx.get(group.env(), timeout=120) == [{"OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}] * 2
        ctx.kill(group)
        pair = ctx.create_actor_group(Member, 1, options=ActorOptions(resources={"CPU": 2}), distributed=True)
        assert ctx.get(pair.env(), timeout=120) == [{"OMP_NUM_THREADS": "2", "THP_MEM_ALLOC_ENABLE": "1"}]
        ctx.kill(pair)
        mine = TaskOptions(
            runtime_env=RuntimeEnv(env={"OMP_NUM_THREADS": "3"})
        )  # a task with env_vars runs in a child process
        assert ctx.get(ctx.create_task(worker_env, options=mine), timeout=120) == {
            "OMP_NUM_THREADS": "3",
            "THP_MEM_ALLOC_ENABLE": "1",
        }
    finally:
        fray.shutdown()
