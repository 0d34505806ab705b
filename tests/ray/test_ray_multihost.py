"""A Ray cluster over two namespaced hosts (tests/_netns.py: each its own network stack, hostname and /dev/shm):
`ray start --head` on host 0, `ray start` of a worker node on host 1, and a fray driver run inside host 0.

The driver (_multihost_driver.py) checks placement by resources, a detached actor seen from a second driver on
host 1, actor groups over the hosts (pack, spread, strict, SPMD with gloo), and work and data crossing between the
hosts. Then it holds actors and stored values on both hosts and is SIGKILLed: no process that ran its code and no
fray process or shared-memory file may be left on either host. The cluster, which the module started, is stopped
by signals to exactly its nodes' process groups, and then no process at all may be left in the hosts.

Which processes are the driver's: the driver itself; every worker process that ran its tasks or actors (each
reports its host, pid and start time, so that a reused pid is not blamed), an idle
one included (a Ray worker serves one job only); and any worker still running something (this cluster has no other
job). Not the driver's: the nodes' daemons (in the `ray start` process groups: GCS, raylet, agents, monitors) and
idle workers it never used (`ray::IDLE`, pooled by the raylet for the next job).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fray_ray")

from _netns import Host, namespaced_hosts, require_namespaced_hosts, start_time
from _ray_hosts import PORT, RayNode, cluster_env, log_tails, running_cluster

from fray.host import procfs

DRIVER = Path(__file__).resolve().with_name("_multihost_driver.py")
PUT_BYTES = 32 * 2**20  # as in the driver
MADE_BYTES = 16 * 2**20
# Bounds far above what this 2-core machine takes (cluster up ~5 s, driver ~10 s, leftovers gone in < 1 s,
# cluster stopped ~3 s): a loaded CI machine must not flake.
CLUSTER_WAIT = 180.0
DRIVER_WAIT = 300.0
GONE_WAIT = 15.0  # the driver's processes end within this of its SIGKILL
STOPPED_WAIT = 30.0  # and the cluster's within this of its nodes' stop
# The module's own bound, above the bounded waits of its fixtures, so that theirs report what was not ready.
pytestmark = pytest.mark.timeout(CLUSTER_WAIT + DRIVER_WAIT + 120)


@dataclass
class Cluster:
    hosts: list[Host]
    nodes: list[RayNode]  # the head's first
    alive: list[dict[str, Any]]  # the nodes as the GCS lists them
    env: dict[str, str]
    base: Path


@dataclass
class Driver:
    proc: subprocess.Popen[str]
    result: dict[str, Any]
    holding: dict[str, Any]


def _poll(check: Any, timeout: float) -> Any:
    """check() until it returns something falsy or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while (found := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _argv(pid: int) -> list[str]:
    return [a for a in procfs.cmdline(pid) or [] if a.strip()]


def _pgid(pid: int) -> int | None:
    found = procfs.stat(pid)
    return None if found is None else found.pgid


def _is_fray(argv: list[str]) -> bool:
    """Runs fray's code: a `python -m fray...` (the watchdog), the driver script, or `-c` code importing fray."""
    if str(DRIVER) in argv:
        return True
    return any((a == "-m" and b.startswith("fray")) or (a == "-c" and "fray" in b) for a, b in itertools.pairwise(argv))


def _host_processes(hosts: list[Host]) -> list[str]:
    return [f"host {h.index}: {pid} {' '.join(_argv(pid))[:120]}" for h in hosts for pid in h.pids()]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two namespaced hosts, a Ray node on each; afterwards no process left in them."""
    require_namespaced_hosts()
    base = Path(tempfile.mkdtemp(prefix="fray-mh-", dir="/tmp"))  # short: Ray's socket paths are under it
    try:
        with namespaced_hosts(2) as hosts:
            env = cluster_env(base)
            with running_cluster(hosts, base, env, {"worker_tag": 1}, CLUSTER_WAIT) as (nodes, alive):
                yield Cluster(hosts, nodes, alive, env, base)
            # Workers are in process groups of their own: they end by themselves once their raylet is gone.
            left = _poll(lambda: _host_processes(hosts), STOPPED_WAIT)
            assert not left, f"left in the hosts after the cluster stopped: {left}"
            assert not [f for h in hosts for f in h.shm_files() if f.startswith("fray")]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    """The driver's stdout lines up to the first starting with `marker` (or all it printed by `timeout`)."""
    lines: list[str] = []
    done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(marker):
                break
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    done.wait(timeout)
    return list(lines)


@pytest.fixture(scope="module")
def driver(cluster: Cluster) -> Iterator[Driver]:
    """The driver, run inside host 0, once it has printed its RESULT and holds things on both hosts."""
    head, other = cluster.hosts
    err_path = cluster.base / "driver.err"
    # The second driver runs on host 1: the driver prefixes its command with this (nsenter into host 1).
    second = other.argv([], cwd=str(cluster.base))
    args = [sys.executable, str(DRIVER), f"{head.address}:{PORT}", json.dumps(second)]
    with open(err_path, "w") as err:
        proc = head.popen(
            args,
            cwd=str(cluster.base),
            env=cluster.env,  # RAY_AUTH_MODE unset: fray asks the cluster which mode it enforces
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        found: dict[str, Any] = {}
        for line in _read_until(proc, "HOLDING ", DRIVER_WAIT):
            kind, _, rest = line.partition(" ")
            if kind in ("RESULT", "HOLDING"):
                found[kind] = json.loads(rest)
        if missing := [k for k in ("RESULT", "HOLDING") if k not in found]:
            tail = err_path.read_text(errors="replace")[-3000:]
            pytest.fail(
                f"the driver printed no {missing} within {DRIVER_WAIT:.0f} s:\n{tail}\n{log_tails(cluster.nodes)}"
            )
        yield Driver(proc, found["RESULT"], found["HOLDING"])
    finally:
        if proc.poll() is None:
            proc.kill()  # exactly the driver (nsenter exec'd it), never its group: the rest is the test's to see
        proc.wait(30)


def _names(cluster: Cluster) -> tuple[str, str]:
    return cluster.hosts[0].name, cluster.hosts[1].name


def test_each_host_is_a_ray_node_at_its_own_address(cluster: Cluster, driver: Driver) -> None:
    head, other = cluster.hosts
    by_address = {n["address"]: n for n in cluster.alive}
    assert set(by_address) == {head.address, other.address}  # not loopback, not the machine's own address
    assert "head_tag" in by_address[head.address]["resources"]
    assert "worker_tag" in by_address[other.address]["resources"]
    out = driver.result
    assert (out["driver_host"], out["driver_pid"]) == (head.name, driver.proc.pid)  # nsenter exec'd the driver
    assert out["node_count"] == 2
    assert sorted(out["addresses"].values()) == sorted([head.address, other.address])
    assert out["auth_mode"] == "token"  # fray asked the cluster (the driver's environment did not say)


def test_placement_by_resources_and_detached_actor_from_a_driver_on_the_other_host(driver: Driver) -> None:
    out = driver.result
    addresses = out["addresses"]
    head_host, worker_host = out["task_head"]["host"], out["task_worker"]["host"]
    assert head_host == out["driver_host"] != worker_host
    assert addresses[out["task_head"]["node"]] != addresses[out["task_worker"]["node"]]
    assert out["actor"]["host"] == worker_host
    # run on host 1, it found the named detached actor (on host 1) with the first driver's state
    assert out["second_driver"] == [worker_host, worker_host, "2"]
    assert out["infeasible"] == "refused"


def test_groups_pack_and_spread_over_two_hosts(cluster: Cluster, driver: Driver) -> None:
    out = driver.result
    both = set(_names(cluster))
    assert len({m["host"] for m in out["pack"]}) == 1  # as few hosts as possible: the two members fit on one
    assert {m["host"] for m in out["spread"]} == both  # best effort over hosts: one member on each
    assert {m["host"] for m in out["strict_spread"]} == both
    assert out["strict_pack"] == "refused"  # 2 x 1 CPU on one host of 1 CPU: refused at creation


def test_spmd_group_over_two_hosts_runs_gloo(cluster: Cluster, driver: Driver) -> None:
    ranks = driver.result["spmd"]
    address_of = {h.name: h.address for h in cluster.hosts}
    assert {r["host"] for r in ranks} == set(address_of)
    assert {r["MASTER_ADDR"] for r in ranks} == {address_of[ranks[0]["host"]]}  # rank 0's host address
    assert len({r["MASTER_PORT"] for r in ranks}) == 1
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "2"), ("1", "2")]
    assert [(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [("0", "1"), ("0", "1")]  # one per host
    assert driver.result["all_reduce"] == [3.0, 3.0]


def test_work_and_data_cross_between_hosts(cluster: Cluster, driver: Driver) -> None:
    out = driver.result
    here, there = _names(cluster)  # the driver runs on host 0
    assert {t["host"] for t in out["remote_tasks"]} == {there}
    put_read = out["put_read"]  # the driver's 32 MiB put, read on the other host
    assert (put_read["host"], put_read["sum"], put_read["nbytes"]) == (there, PUT_BYTES, PUT_BYTES)
    assert (out["task_result"]["host"], out["task_result"]["sum"]) == (there, 2 * MADE_BYTES)  # made there
    assert {side: a["host"] for side, a in out["actors"].items()} == {"head": here, "worker": there}
    assert (out["head_to_worker"]["host"], out["head_to_worker"]["sum"]) == (there, 3 * MADE_BYTES)
    assert (out["worker_to_head"]["host"], out["worker_to_head"]["sum"]) == (here, 3 * MADE_BYTES)
    nested = out["nested"]  # a task on the other host submitted tasks of its own, one to each host
    assert (nested["host"], [t["host"] for t in nested["inner"]]) == (there, [here, there])


def _driver_leftovers(cluster: Cluster, ran_code: dict[int, int]) -> list[str]:
    """What of the driver's is still on the hosts: processes that ran its code (same pid and start time), workers
    still running something, fray processes, fray shared-memory files."""
    node_groups = {node.proc.pid for node in cluster.nodes}
    found = []
    for host in cluster.hosts:
        for pid in host.pids():
            argv = _argv(pid)
            title = argv[0] if argv else "?"
            if pid in ran_code and start_time(pid) == ran_code[pid]:
                why = "ran the driver's code"
            elif title.startswith("ray::") and title != "ray::IDLE" and _pgid(pid) not in node_groups:
                why = "a worker busy with a job"
            elif _is_fray(argv):
                why = "a fray process"
            else:
                continue
            found.append(f"host {host.index}: {pid} {' '.join(argv)[:100]} ({why})")
        found += [f"host {host.index}: /dev/shm/{name}" for name in host.shm_files() if name.startswith("fray")]
    return found


def test_killed_driver_leaves_nothing_on_either_host(cluster: Cluster, driver: Driver) -> None:
    places = driver.holding["places"]
    ran_code = {p["pid"]: p["start"] for p in places}
    # The check can see what it looks for: the actors holding values are alive now, each in its host's namespace.
    actors = driver.result["actors"]
    assert actors["head"]["pid"] in cluster.hosts[0].pids()
    assert actors["worker"]["pid"] in cluster.hosts[1].pids()
    assert {p["host"] for p in places} == set(_names(cluster))
    assert driver.proc.poll() is None, "the driver ended before it was killed"
    os.kill(driver.proc.pid, signal.SIGKILL)  # the driver alone: no shutdown, no atexit, no signal to its children
    driver.proc.wait(30)
    start = time.monotonic()
    left = _poll(lambda: _driver_leftovers(cluster, ran_code), GONE_WAIT)
    job = driver.holding["job"]
    assert not left, f"{time.monotonic() - start:.1f} s after the SIGKILL of job {job}'s driver, still there: {left}"
    assert driver.proc.pid not in cluster.hosts[0].pids()


def test_a_jobs_ranks_spread_over_the_two_hosts(cluster: Cluster) -> None:
    """A job's supervisor (fray.jobs.supervisor, what create_job(replicas=2, placement="spread") runs) on host 0:
    its ranks, 1 CPU each on hosts of 1 CPU, run one on each host, their output in the supervisor's (the job's
    log), with torch.distributed's variables of a group over both hosts; a failed first attempt is retried."""
    head, _ = cluster.hosts
    code = (
        "import os, socket, sys\n"
        "print('rank', os.environ['RANK'], 'on', socket.gethostname(), 'master', os.environ['MASTER_ADDR'],"
        " 'attempt', os.environ['FRAY_JOB_ATTEMPT'], flush=True)\n"
        "sys.exit(3 if os.environ['RANK'] == '1' and os.environ['FRAY_JOB_ATTEMPT'] == '1' else 0)\n"
    )
    argv = [sys.executable, "-m", "fray.jobs.supervisor", "--replicas", "2", "--retries", "1", "--placement",
            "spread", "--rank-resources", json.dumps({"CPU": 1}), "--", sys.executable, "-c", code]  # fmt: skip
    env = {**cluster.env, "FRAY_BACKEND": f"ray?address={head.address}:{PORT}&namespace=fray-job-ranks"}
    done = head.run(argv, timeout=240, cwd=str(cluster.base), env=env, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    lines = [line for line in done.stdout.splitlines() if "] rank " in line and "attempt 2" in line]
    hosts = {line.split(" on ")[1].split()[0] for line in lines}
    assert hosts == set(_names(cluster)), done.stdout
    assert "[fray] attempt 2 of 2 (the last failed: rank 1 exited with code 3)" in done.stdout
