"""What the worker-environment tests run in the processes fray starts (tests/unit/test_worker_env.py,
tests/monarch/test_monarch_worker_env.py): the variables fray.runtime.worker_env sets, as the process sees them."""

from __future__ import annotations

import os

NAMES = ("OMP_NUM_THREADS", "THP_MEM_ALLOC_ENABLE")


def worker_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in NAMES}


def blas_threads() -> list[int]:
    """The thread count of each BLAS library loaded in this process (numpy's, loaded in every monarch worker)."""
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


class Member:
    def env(self) -> dict[str, str | None]:
        return worker_env()

    def blas_threads(self) -> list[int]:
        return blas_threads()
