"""Shared by the tests of a job's GPUs (tests/unit/test_job_gpus.py, tests/ray/test_ray_job_gpus.py): a rank that
says which devices it sees, and reading that back from the job's log."""

from __future__ import annotations

SHOW = "import os; print('sees', os.environ.get('RANK'), os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)"


def seen_devices(logs: str) -> dict[str, str]:
    """rank -> CUDA_VISIBLE_DEVICES, from the "sees RANK DEVICES" lines (after a "[rank N] " prefix or not)."""
    seen = {}
    for line in logs.splitlines():
        words = line.split()
        if "sees" in words:
            at = words.index("sees")
            seen[words[at + 1]] = words[at + 2]
    return seen
