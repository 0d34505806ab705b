"""A host lost under an SPMD group (issue 19), on namespaced hosts (separate machines to Monarch): every process of
one host is SIGKILLed, its host worker included, while a group of 2 spread over hosts 1 and 2 (one rank on each)
has a restart left. The group comes back on the host that is left, if it can hold both ranks (rank 0's host lost
too: MASTER_ADDR moves with it); if it cannot, the group dies with an error naming the lost host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _lost_host_driver import marked_line
from _netns import Host, namespaced_hosts, require_namespaced_hosts

HERE = Path(__file__).parent
DRIVER = HERE.parent / "_lost_host_driver.py"
PY = sys.executable


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[Host]]:
    require_namespaced_hosts()
    with namespaced_hosts(3) as made:
        yield made


def _lose(host: Host) -> None:
    """The machine is lost: SIGKILL all that runs there. Then remove the TLS files its fray processes kept in the
    /tmp this test's hosts share (a real machine's go with it; here nothing else would remove them): their paths
    are in the environment of each process there (FRAY_TLS_RUNTIME_DIR, "<owner pid>:<dir>", set by the host
    worker and inherited by what it started)."""
    dirs = set()
    for pid in host.pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            name, _, value = item.partition(b"=")
            if name == b"FRAY_TLS_RUNTIME_DIR":
                dirs.add(value.decode().partition(":")[2])
    host.kill_all()
    for path in dirs:
        if os.path.basename(path).startswith("fray-tls-"):
            shutil.rmtree(path, ignore_errors=True)


def _line(stream: Any, marker: str, log: Path) -> dict[str, Any]:
    found = marked_line(stream, marker)
    assert found is not None, f"the driver never printed {marker}: {log.read_text(errors='replace')[-4000:]}"
    return found


def _run(
    hosts: list[Host], tmp_path: Path, cpus: int, member_cpus: int, lose: str, member_gpus: int = 0
) -> tuple[Any, Any, Host]:
    """Start host workers on hosts 1 and 2, the driver in host 0; once the group answered, SIGKILL every process
    of the host where rank `lose` ("0" or "1") runs, or of both hosts ("all": the driver then runs a task).
    member_gpus: each member asks for that many of 2 GPUs declared per host. What the driver saw before and
    after, and the host left."""
    env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state"), "FRAY_TLS_DIR": str(tmp_path / "tls")}
    workers = [
        h.popen(
            [PY, "-m", "fray_monarch.worker", "--address", f"tls://{h.name}:29500"], stdout=subprocess.DEVNULL, env=env
        )
        for h in hosts[1:]
    ]
    spec = f"monarch?hosts=tls://{hosts[1].name}:29500,tls://{hosts[2].name}:29500&procs=1&cpus={cpus}"
    spec += "&gpus=2" if member_gpus else ""
    resources = {**({"CPU": member_cpus} if member_cpus else {}), **({"GPU": member_gpus} if member_gpus else {})}
    log = tmp_path / "driver.log"
    try:
        with open(log, "w") as errors:
            driver = hosts[0].popen(
                [PY, str(DRIVER), spec, json.dumps(resources)] + (["task"] if lose == "all" else []),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                cwd=HERE,
                env=env,
            )
        assert driver.stdin is not None and driver.stdout is not None
        try:
            before = _line(driver.stdout, "BEFORE", log)
            names = [w["host"] for w in before["where"]] if lose == "all" else [before["where"][int(lose)]["host"]]
            lost = [h for h in hosts if h.name in names]
            left = next((h for h in hosts[1:] if h not in lost), hosts[0])
            for host in lost:
                _lose(host)
            driver.stdin.write("go\n")
            driver.stdin.flush()
            after = _line(driver.stdout, "AFTER", log)
            driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        return before, after, left
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)


@pytest.mark.parametrize("lose", ["1", "0"])  # rank 0's host lost: the new rendezvous is on the host left
def test_a_group_on_a_lost_host_comes_back_on_the_hosts_left(hosts: list[Host], tmp_path: Path, lose: str) -> None:
    before, after, left = _run(hosts, tmp_path, cpus=2, member_cpus=0, lose=lose)
    assert [w["host"] for w in before["where"]] == [hosts[1].name, hosts[2].name] and before["reduce"] == [2.0, 2.0]
    assert {w["MASTER_ADDR"] for w in before["where"]} == {hosts[1].address}  # across hosts: rank 0's host address
    assert "error" not in after, after
    assert after["reduce"] == [2.0, 2.0], after
    ranks = after["where"]
    assert [r["host"] for r in ranks] == [left.name, left.name], ranks
    assert [r["restarts"] for r in ranks] == [1, 1]
    assert [(r["RANK"], r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    # every member on the host left: the rendezvous store listens on its loopback alone (fray.runtime.rendezvous)
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
    old = {w["pid"] for w in before["where"] if w["host"] == left.name}
    assert not old & {r["pid"] for r in ranks}, "the ranks on the host left run on fresh processes"
    assert after["seconds"] < 60, after  # the loss is seen through the lifelines at once, not after 30 s


def test_a_group_holding_gpus_placed_again_sees_its_new_hosts_devices(hosts: list[Host], tmp_path: Path) -> None:
    """On 2 declared GPUs per host: rank 1 comes back on rank 0's host, on the device rank 0 does not hold, and
    both see that host's two devices in rank order (LOCAL_RANK indexes each one's own). Before the fix the
    restart rewrote LOCAL_RANK but not CUDA_VISIBLE_DEVICES: rank 1 held device 1 and still saw "0", its view on
    the lost host, so CUDA (and set_device(LOCAL_RANK)) put it on rank 0's device."""
    before, after, left = _run(hosts, tmp_path, cpus=2, member_cpus=0, lose="1", member_gpus=1)
    assert [(w["CUDA_VISIBLE_DEVICES"], w["FRAY_GPUS"]) for w in before["where"]] == [("0", "0"), ("0", "0")], before
    assert "error" not in after, after
    ranks = after["where"]
    assert [r["host"] for r in ranks] == [left.name, left.name], ranks
    assert [(r["LOCAL_RANK"], r["CUDA_VISIBLE_DEVICES"], r["FRAY_GPUS"]) for r in ranks] == [
        ("0", "0,1", "0"),
        ("1", "0,1", "1"),
    ], ranks


def test_a_group_the_hosts_left_cannot_hold_dies_naming_the_lost_host(hosts: list[Host], tmp_path: Path) -> None:
    _, after, _ = _run(hosts, tmp_path, cpus=1, member_cpus=1, lose="1")
    error = after.get("error", "")
    assert error.startswith("ActorDiedError"), after
    assert f"tls://{hosts[2].name}:29500 is lost" in error and "cannot hold its 2 members" in error, error


def test_with_every_host_lost_a_task_fails_naming_them(hosts: list[Host], tmp_path: Path) -> None:
    _, after, _ = _run(hosts, tmp_path, cpus=2, member_cpus=0, lose="all")
    error = after["error"]
    assert error.startswith("WorkerCrashedError") and "every host is lost" in error, after
    assert f"tls://{hosts[1].name}:29500 is lost" in error and f"tls://{hosts[2].name}:29500 is lost" in error
    assert after["seconds"] < 60, after
