"""fray.gpus: finding a host's GPUs, holding them (whole and fractional), and what in_memory tells the work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fray
from fray import ActorOptions
from fray.gpus import DevicePool, _parse_visible, host_gpus, process_env


def test_whole_devices_are_held_by_one_holder_each() -> None:
    pool = DevicePool([0, 1, 2])
    assert pool.take(2) == (0, 1)
    assert pool.choose(2) is None and pool.take(1) == (2,)
    assert pool.take(0.1) is None
    pool.give((0, 1), 2)
    assert pool.take(2) == (0, 1)


def test_fractions_pack_onto_the_fullest_device_and_leave_whole_ones_whole() -> None:
    pool = DevicePool([0, 1])
    assert pool.take(0.5) == (0,)
    assert pool.take(0.25) == (0,)  # the fullest device it fits on
    assert pool.take(1) == (1,)  # device 1 stayed whole
    assert pool.take(0.5) is None and pool.take(0.25) == (0,)
    pool.give((0,), 0.5)
    assert pool.choose(0.5) == (0,)


def test_among_limits_the_devices_a_holder_may_get() -> None:
    pool = DevicePool([0, 1])
    assert pool.take(1, among=[1]) == (1,)
    assert pool.choose(1, among=[1]) is None


def test_room_counts_the_requests_that_fit_now() -> None:
    pool = DevicePool([0, 1, 2])
    assert pool.room(0) == float("inf") and pool.room(1) == 3 and pool.room(2) == 1 and pool.room(0.5) == 6
    pool.take(0.5)
    assert pool.room(1) == 2 and pool.room(0.5) == 5 and pool.room(0.25) == 10


def test_declared_gpus_and_their_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine shows no device: gpus= declares them
    assert host_gpus(2).ids == (0, 1) and host_gpus(2).source == "declared"
    with pytest.raises(ValueError, match="whole devices"):
        host_gpus(1.5)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert host_gpus().ids == (3, 5) and host_gpus(1).ids == (3,)
    with pytest.raises(ValueError, match="this host has 2 GPU"):
        host_gpus(4)


def test_visible_devices_keep_uuids_and_hide_all_with_minus_one() -> None:
    gpus = _parse_visible("GPU-aaa,GPU-bbb")
    assert gpus.ids == (0, 1) and gpus.visible([1]) == "GPU-bbb"
    assert _parse_visible("-1").ids == ()
    assert process_env((5,), _parse_visible("3,5")) == {"CUDA_VISIBLE_DEVICES": "5", "FRAY_GPUS": "5"}


def test_gpu_requests_above_one_must_be_whole() -> None:
    with pytest.raises(ValueError, match="whole number of devices"):
        ActorOptions(resources={"GPU": 2.5})
    ActorOptions(resources={"GPU": 0.25})


class _Member:
    def env(self) -> tuple[str | None, str | None, str | None]:
        return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("FRAY_GPUS"), os.environ.get("LOCAL_RANK")


def test_in_memory_spmd_members_see_their_groups_devices_in_rank_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """So that torch.cuda.set_device(LOCAL_RANK) picks each member's own device, as under torchrun."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ctx = fray.init("in_memory?cpus=4&gpus=2")
    try:
        group = ctx.create_actor_group(
            _Member, 2, options=ActorOptions(resources={"CPU": 1, "GPU": 1}), distributed=True
        )
        envs = ctx.get(group.env(), timeout=120)
        held = sorted(int(e[1] or -1) for e in envs)
        assert held == [0, 1]
        for visible, mine, local_rank in envs:
            assert visible == "0,1" or visible == "1,0"
            assert visible.split(",")[int(local_rank or -1)] == mine
    finally:
        fray.shutdown()


_FRESH_GROUP = """
import sys
import fray
from fray import ActorOptions

class Member:
    def __init__(self):
        import torch  # this thread imports torch while its peers' threads do too
        self.ok = torch.ones(1).item() == 1.0

    def ok_(self):
        return self.ok

assert "torch" not in sys.modules
ctx = fray.init("in_memory?gpus=2")
group = ctx.create_actor_group(Member, 6, options=ActorOptions(resources={"GPU": 0.25}))
print(ctx.get(group.ok_(), timeout=120))
fray.shutdown()
"""


def test_in_memory_members_holding_gpus_start_while_torch_is_first_imported() -> None:
    """Each member's thread makes its device current, which needs torch: before the fix, a member whose thread saw
    another thread's half-imported torch died with "partially initialized module 'torch' has no attribute 'cuda'"
    (seen on an H100: bench_rlhf --device cuda's rollout group on in_memory)."""
    pytest.importorskip("torch", reason="needs torch (the race is in importing it)")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_GROUP], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str([True] * 6), proc.stdout
