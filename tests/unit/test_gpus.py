"""fray.runtime.gpus: finding a host's GPUs, holding them (whole and fractional), and what in_memory tells the work."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fray
from fray import ActorOptions
from fray.runtime.gpus import (
    DevicePool,
    HostGpus,
    _parse_nvidia_smi,
    _parse_visible,
    follow_host_order,
    host_gpus,
    process_env,
)


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


def test_uuid_and_mig_entries_keep_the_hosts_ids_in_the_processes_fray_starts() -> None:
    """A process shown a device by UUID or MIG name cannot tell its host id from its own CUDA_VISIBLE_DEVICES (the
    entry's position there is 0): before the fix, a member holding host device 1 ("MIG-bbb") took its device to be
    0, so use_held_device found no ordinal for FRAY_GPUS=1 and a CUDA value it wrote said it came from device 0."""
    host = _parse_visible("GPU-aaa,MIG-bbb/1/0,GPU-ccc")
    assert host.ids == (0, 1, 2) and host.visible([1]) == "MIG-bbb/1/0"
    env = process_env((1,), host, visible=[2, 1])
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-ccc,MIG-bbb/1/0",
        "FRAY_GPU_IDS": "GPU-ccc=2,MIG-bbb/1/0=1",
        "FRAY_GPUS": "1",
    }
    child = _parse_visible(env["CUDA_VISIBLE_DEVICES"], env["FRAY_GPU_IDS"])
    assert child.ids == (2, 1) and child.ordinal(1) == 1 and child.ordinal(2) == 0
    # numbers name themselves; a map left from another view (a worker's view widened since) is ignored
    assert process_env((5,), _parse_visible("3,5")) == {"CUDA_VISIBLE_DEVICES": "5", "FRAY_GPUS": "5"}
    assert _parse_visible("0,1", "GPU-ccc=2").ids == (0, 1)
    assert _parse_visible("GPU-aaa,GPU-zzz", "GPU-aaa=4").ids == (0, 1)  # one unnamed: positions, as before


def test_the_host_view_shows_every_device_after_the_works_own() -> None:
    """gpu_view=host: the host's other devices after the work's own (so `cuda:0` and LOCAL_RANK still name its
    own), each once, UUIDs and MIG names kept, their host ids told; the process finds its own device first."""
    host = dataclasses.replace(_parse_visible("GPU-aaa,MIG-bbb/1/0,GPU-ccc,GPU-ddd"), view="host")
    env = process_env((2,), host)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-ccc,GPU-aaa,MIG-bbb/1/0,GPU-ddd" and env["FRAY_GPUS"] == "2"
    child = _parse_visible(env["CUDA_VISIBLE_DEVICES"], env["FRAY_GPU_IDS"])
    assert child.ids == (2, 0, 1, 3) and child.ordinal(2) == 0 and child.ordinal(1) == 2
    member = process_env((1,), host, visible=[2, 1])  # an SPMD member of rank 1: its group's devices first
    assert member["CUDA_VISIBLE_DEVICES"].split(",")[:2] == ["GPU-ccc", "MIG-bbb/1/0"]
    declared = dataclasses.replace(HostGpus.numbered(4, "declared"), view="host")
    assert process_env((3,), declared) == {"CUDA_VISIBLE_DEVICES": "3,0,1,2", "FRAY_GPUS": "3"}
    assert declared.visible([1, 1]) == "1,0,2,3"  # (two members sharing device 1: named once)
    with pytest.raises(ValueError, match=r"'held'.*'host'"):
        host_gpus(None, "all")


def test_nvidia_smi_ids_are_in_pci_bus_order_and_so_is_cuda_where_fray_starts_it() -> None:
    """nvidia-smi's index follows the PCI bus, CUDA's default order is fastest first: a process started with
    CUDA_VISIBLE_DEVICES=1 from nvidia-smi's index could get another device than nvidia-smi's 1."""
    host = _parse_nvidia_smi("0\n1\n2\n")
    assert host.ids == (0, 1, 2) and host.order == "PCI_BUS_ID"
    assert process_env((1,), host) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "FRAY_GPUS": "1"}
    environ: dict[str, str] = {}
    follow_host_order(host, environ)
    assert environ == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    chosen = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    with pytest.warns(RuntimeWarning, match="CUDA_DEVICE_ORDER=FASTEST_FIRST"):
        follow_host_order(host, chosen)
    assert chosen == {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}  # (the driver's own choice stays)


_FAKE_NVIDIA_SMI = "#!/bin/sh\nprintf '0\\n1\\n'\n"


def test_a_driver_finding_gpus_with_nvidia_smi_numbers_them_in_its_order(tmp_path: Path) -> None:
    """Discovery in a driver without CUDA_VISIBLE_DEVICES (nvidia-smi: a stand-in printing two indexes) sets
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so that its own threads' devices (in_memory) are nvidia-smi's."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(_FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["PATH"] = f"{tmp_path}{os.pathsep}{env.get('PATH', '')}"
    code = "import os; from fray.runtime.gpus import discover; g = discover(); "
    code += "print(g.ids, g.source, os.environ['CUDA_DEVICE_ORDER'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.stdout.strip() == "(0, 1) nvidia-smi PCI_BUS_ID", out.stdout + out.stderr


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
