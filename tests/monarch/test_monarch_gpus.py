"""What monarch's group members see of a host's GPUs, on GPUs the spec declares (gpus=2): a member holding none
sees none, as a general process holding none does (processes.visible_env)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import fray
from fray import ActorOptions


class _Viewer:
    def view(self) -> tuple[str | None, str | None]:
        return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("FRAY_GPUS")


@pytest.fixture(scope="module")
def ctx() -> Iterator[Any]:
    context = fray.init("monarch?procs=2&cpus=4&gpus=2")  # (on a machine without GPUs: declares two)
    yield context
    fray.shutdown()


@pytest.mark.parametrize("distributed", [False, True], ids=["group", "spmd"])
def test_group_members_holding_no_gpu_see_none(ctx: Any, distributed: bool) -> None:
    """Before the fix they saw every device of their host (CUDA_VISIBLE_DEVICES as the host worker had it: here
    unset here), so a CPU-only member reading a CUDA value got it on a device other work holds."""
    group = ctx.create_actor_group(_Viewer, 2, options=ActorOptions(resources={"CPU": 1}), distributed=distributed)
    try:
        assert ctx.get(group.view(), timeout=120) == [("", None), ("", None)]
    finally:
        ctx.kill(group)
    holding = ctx.create_actor_group(_Viewer, 2, options=ActorOptions(resources={"GPU": 1}), distributed=distributed)
    try:
        views = ctx.get(holding.view(), timeout=120)
        assert sorted(mine for _, mine in views) == ["0", "1"], views
    finally:
        ctx.kill(holding)
