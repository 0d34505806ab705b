"""Environment defaults of the processes fray starts (fray.runtime.worker_env), and in_memory's child processes getting
them: OMP_NUM_THREADS from the CPUs their actor holds (1 for tasks), THP_MEM_ALLOC_ENABLE=1, a user's value winning."""

from __future__ import annotations

from _worker_env_probe import Member, worker_env

import fray
from fray import ActorOptions, RuntimeEnv, TaskOptions
from fray.runtime.worker_env import worker_env_defaults


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


def test_in_memory_gives_its_own_process_the_huge_page_default_unless_it_is_set() -> None:
    """in_memory's tasks and actors are threads of the driver: torch allocating their tensors reads the variable."""
    import os
    import subprocess
    import sys

    code = "import os, fray; fray.init('in_memory'); print(os.environ.get('THP_MEM_ALLOC_ENABLE')); fray.shutdown()"
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    for given, expected in ((None, "1"), ("0", "0")):
        run_env = env if given is None else {**env, "THP_MEM_ALLOC_ENABLE": given}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == expected, out.stdout + out.stderr
