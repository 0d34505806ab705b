"""The device-share protocol's CUDA layer (fray.runtime.device_shares.cuda_memory) with real processes: a CUDA tensor
serialized in `shared` mode is read by another process of this host through a CUDA IPC share of its own
(`cuda-ipc`), staged where the reader cannot open it (`cuda-ipc-staged`), ObjectLostError once its producer is
gone; device memory comes back once the value and its leases are."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from typing import Any

import pytest

from fray.errors import ObjectLostError
from fray.runtime.device_shares import SHARED, share_server
from fray.runtime.serialization import dumps, loads_data

# A reader in another process: loads a serialized value's in-band bytes, reports its device, sum and paths.
READER = r"""
import pickle, sys, os
if sys.argv[1] == "no-cuda":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch
from fray.runtime.serialization import loads_data
from fray.telemetry.transfers import device_stats
data = pickle.loads(sys.stdin.buffer.read())
try:
    t = loads_data(data, [], "a value")
    print(pickle.dumps((True, t.device.type, float(t.double().sum().item()), sorted(device_stats.snapshot()))).hex())
except Exception as exc:
    print(pickle.dumps((False, f"{type(exc).__name__}: {exc}", 0.0, [])).hex())
"""

PRODUCER_ENDS = r"""
import sys, torch
from fray.runtime.device_shares.values import SHARED
from fray.runtime.serialization import dumps
blob = dumps(torch.ones(1 << 20, device="cuda"), device_mode=SHARED)
sys.stdout.write(blob.data.hex())
"""


def _torch() -> Any:
    import torch

    return torch


def _read_elsewhere(data: bytes, mode: str = "cuda") -> tuple[bool, Any, float, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", READER, mode], input=pickle.dumps(data), capture_output=True, timeout=120, check=True
    )
    return pickle.loads(bytes.fromhex(done.stdout.decode().strip()))  # type: ignore[no-any-return]


def _eventually(check: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_cuda_tensor_is_read_by_another_process_through_a_share_of_its_own() -> None:
    torch = _torch()
    t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    blob = dumps(t, device_mode=SHARED)
    assert not blob.buffers
    t.zero_()  # a value sent stays a snapshot
    for _ in range(2):  # two readers one after the other: each its own share
        ok, device, total, paths = _read_elsewhere(blob.data)
        assert ok, device
        assert device == "cuda" and total == float(sum(range(1 << 22))) and paths == ["cuda-ipc"]
    server = share_server()
    _eventually(lambda: server.leases() == 0, "the readers' leases released")
    del blob
    _eventually(lambda: server.held() == 0, "the snapshot freed with its value")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before


def test_a_reader_without_cuda_gets_it_staged_on_the_cpu_and_the_device_memory_comes_back() -> None:
    torch = _torch()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    server = share_server()
    granted = server.granted()
    blob = dumps(torch.ones(1 << 20, device="cuda"), device_mode=SHARED)
    ok, device, total, paths = _read_elsewhere(blob.data, "no-cuda")
    assert ok, device
    assert device == "cpu" and total == float(1 << 20) and paths == ["cuda-ipc-staged"]
    assert server.granted() == granted, "a reader without CUDA asked for a share"  # (torch would keep it counted)
    _eventually(lambda: server.leases() == 0, "the staging lease released")
    del blob
    _eventually(lambda: server.held() == 0, "the snapshot freed with its value")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before


def test_a_cuda_value_whose_producer_ended_is_object_lost() -> None:
    done = subprocess.run([sys.executable, "-c", PRODUCER_ENDS], capture_output=True, timeout=120, check=True)
    with pytest.raises(ObjectLostError, match="gone"):
        loads_data(bytes.fromhex(done.stdout.decode()), [], "a value")
