"""What the worker-environment tests run in the processes fray starts (tests/unit/test_worker_env.py,
tests/monarch/test_monarch_worker_env.py): the variables fray.runtime.worker_env sets, as the process sees them."""

from __future__ import annotations

import os

NAMES = ("OMP_NUM_THREADS", "THP_MEM_ALLOC_ENABLE")


def worker_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in NAMES}


class Member:
    def env(self) -> dict[str, str | None]:
        return worker_env()
