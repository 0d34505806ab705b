"""A host lost under an SPMD group (issue 19), on namespaced hosts (separate machines to Monarch): every process of
one host is SIGKILLed, its host worker included, while a group of 2 spread over hosts 1 and 2 (one rank on each)
has a restart left. The group comes back on the host that is left, if it can hold both ranks (rank 0's host lost
too: MASTER_ADDR moves with it); if it cannot, the group dies with an error naming the lost host."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _lost_host_driver import marked_line
from _lost_rank_job_driver import assert_lost_then_succeeded
from _netns import Host

HERE = Path(__file__).parent
DRIVER = HERE.parent / "_lost_host_driver.py"
JOB_DRIVER = HERE.parent / "_lost_rank_job_driver.py"
PLAIN_DRIVER = HERE.parent / "_lost_host_plain_driver.py"
SHUTDOWN_WITHIN = 15.0  # seconds a driver's shutdown may take after one of its hosts was lost (~1 s unloaded)
PY = sys.executable


def _lose(host: Host, worker_only: bool = False) -> None:
    """The machine is lost: SIGKILL all that runs there (worker_only: its host worker alone; what runs under it
    then ends itself, its lifeline gone). Then remove the TLS files its fray processes kept in the /tmp this test's
    hosts share (a real machine's go with it; here nothing else would remove them): their paths are in the
    environment of each process there (FRAY_TLS_RUNTIME_DIR, "<owner pid>:<dir>", set by the host worker and
    inherited by what it started)."""
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
    for pid in host.pids() if worker_only else ():
        try:
            if b"fray_monarch.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    if not worker_only:
        host.kill_all()
    for path in dirs:
        if os.path.basename(path).startswith("fray-tls-"):
            shutil.rmtree(path, ignore_errors=True)


def _line(stream: Any, marker: str, log: Path) -> dict[str, Any]:
    found = marked_line(stream, marker)
    assert found is not None, f"the driver never printed {marker}: {log.read_text(errors='replace')[-4000:]}"
    return found


def _ends_soon(driver: Any) -> None:
    """The driver, past its last line, ends within SHUTDOWN_WITHIN: its shutdown waits neither on processes nor on
    job runners of the lost hosts, where a stop is never answered (it waited 20 s for processes; for a job runner
    30 s, then 20 s more)."""
    ended = time.monotonic()
    driver.wait(timeout=120)
    took = time.monotonic() - ended
    assert took < SHUTDOWN_WITHIN, f"the driver took {took:.1f} s"


def _spec(hosts: list[Host], cpus: int = 2) -> str:
    return f"monarch?hosts=tls://{hosts[1].name}:29500,tls://{hosts[2].name}:29500&procs=1&cpus={cpus}"


@contextlib.contextmanager
def _driving(hosts: list[Host], tmp_path: Path, args: list[str], cwd: Path) -> Iterator[tuple[Any, Path]]:
    """Host workers on hosts 1 and 2 (the hosts of `_spec`), and in host 0 the driver `python ARGS...` (stdin and
    stdout piped, stderr to the log): (the driver, its log). On leaving, the driver is killed if it still runs, and
    the workers are."""
    env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state"), "FRAY_TLS_DIR": str(tmp_path / "tls")}
    workers = [
        h.popen(
            [PY, "-m", "fray_monarch.worker", "--address", f"tls://{h.name}:29500"], stdout=subprocess.DEVNULL, env=env
        )
        for h in hosts[1:]
    ]
    log = tmp_path / "driver.log"
    try:
        with open(log, "w") as errors:
            driver = hosts[0].popen(
                [PY, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=cwd, env=env
            )
        assert driver.stdin is not None and driver.stdout is not None
        try:
            yield driver, log
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)


def _run(
    hosts: list[Host], tmp_path: Path, cpus: int, member_cpus: int, lose: str, member_gpus: int = 0
) -> tuple[Any, Any, Host]:
    """Start host workers on hosts 1 and 2, the driver in host 0; once the group answered, SIGKILL every process
    of the host where rank `lose` ("0" or "1") runs, or of both hosts ("all": the driver then runs a task).
    member_gpus: each member asks for that many of 2 GPUs declared per host. What the driver saw before and
    after, and the host left."""
    spec = _spec(hosts, cpus) + ("&gpus=2" if member_gpus else "")
    resources = {**({"CPU": member_cpus} if member_cpus else {}), **({"GPU": member_gpus} if member_gpus else {})}
    args = [str(DRIVER), spec, json.dumps(resources)] + (["task"] if lose == "all" else [])
    with _driving(hosts, tmp_path, args, HERE) as (driver, log):
        before = _line(driver.stdout, "BEFORE", log)
        names = [w["host"] for w in before["where"]] if lose == "all" else [before["where"][int(lose)]["host"]]
        lost = [h for h in hosts if h.name in names]
        left = next((h for h in hosts[1:] if h not in lost), hosts[0])
        for host in lost:
            _lose(host)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        after = _line(driver.stdout, "AFTER", log)
        _ends_soon(driver)
    return before, after, left


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


def _supervisor_host(hosts: list[Host]) -> Host:
    """The host where the job's supervisor (its own first process, under that host's job runner) runs."""
    for host in hosts:
        for pid in host.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"fray.jobs.supervisor" in argv:
                return host
    raise AssertionError("no job supervisor runs in any host")


def _job_run(hosts: list[Host], tmp_path: Path, supervisor: bool) -> tuple[Any, Any, Host, Host]:
    """Run the lost-rank job driver in host 0 over host workers on hosts 1 and 2; once both ranks said where they
    run, SIGKILL the host worker of the host of the job's supervisor (`supervisor`) or of the other host (what ran
    under it ends with it). What the driver saw before and after, the host lost and the host left. The driver's
    cluster then shuts down without waiting for the lost host."""
    work = tmp_path / "work"
    work.mkdir()
    with _driving(hosts, tmp_path, [str(JOB_DRIVER), _spec(hosts), json.dumps({"CPU": 1})], work) as (driver, log):
        before = _line(driver.stdout, "BEFORE", log)
        assert sorted(before["ranks"].values()) == [hosts[1].name, hosts[2].name], before
        beside = _supervisor_host(hosts[1:])
        lost = beside if supervisor else next(h for h in hosts[1:] if h is not beside)
        _lose(lost, worker_only=True)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        after = _line(driver.stdout, "AFTER", log)
        _ends_soon(driver)
    return before, after, lost, next(h for h in hosts[1:] if h is not lost)


def test_a_jobs_attempt_on_a_lost_host_is_lost_and_not_counted_against_max_retries(
    hosts: list[Host], tmp_path: Path
) -> None:
    """A job of 2 ranks spread over hosts 1 and 2 (create_job(..., placement="spread", max_retries=0)) loses the
    host of the rank that is not beside its supervisor. The attempt is "lost", naming that rank; with no failure
    retried, the next attempt runs both ranks on the host left (before the fix it was placed on the lost host again
    and failed, not started, after Monarch's 30 s spawn timeout) and the job succeeds."""
    before, after, lost, beside = _job_run(hosts, tmp_path, supervisor=False)
    rank = next(r for r, name in before["ranks"].items() if name == lost.name)
    assert_lost_then_succeeded(after, f"lost: rank {rank}'s node: ", beside.name)


def test_a_job_whose_supervisors_host_is_lost_runs_again_on_the_host_left(hosts: list[Host], tmp_path: Path) -> None:
    """The same job loses the host of its supervisor (its own first process, under that host's job runner), which
    takes the supervisor and the attempt with it. The cluster's context sees the runner's lifeline close, finds the
    host silent, and starts the job again on the other host's runner: attempt 1 "lost" naming the host (not counted
    against max_retries=0), attempt 2 runs both ranks on the host left and succeeds. Before, nothing ran it again:
    the job was lost with its host. The runners' roots are host-local, so the new log says the earlier output was
    lost with the host."""
    _, after, lost, left = _job_run(hosts, tmp_path, supervisor=True)
    assert_lost_then_succeeded(after, "lost: the job's host ", left.name, naming=lost.name)
    assert "was lost with its host" in after["logs"], after


def test_a_plain_command_on_a_lost_host_fails_naming_it_and_new_jobs_go_to_the_host_left(
    hosts: list[Host], tmp_path: Path
) -> None:
    """Two plain commands (unsupervised: no record to go on from), one on each host; host 2's worker is SIGKILLed.
    Its job ends FAILED naming the host, the other runs on, and a new job runs on the host left."""
    with _driving(hosts, tmp_path, [str(PLAIN_DRIVER), _spec(hosts)], tmp_path) as (driver, log):
        assert _line(driver.stdout, "BEFORE", log) == sorted([hosts[1].name, hosts[2].name])
        _lose(hosts[2], worker_only=True)
        driver.stdin.write(hosts[2].name + "\n")
        driver.stdin.flush()
        after = _line(driver.stdout, "AFTER", log)
        driver.wait(timeout=60)
    assert after["status"] == "FAILED", after
    assert after["message"].startswith("lost: the job's host ") and hosts[2].name in after["message"], after
    assert "a plain command is not run again" in after["message"], after
    assert after["other"] == "RUNNING" and after["new"] == ["SUCCEEDED", hosts[1].name], after
