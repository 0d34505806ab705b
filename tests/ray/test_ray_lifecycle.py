"""A private Ray's life: it listens on loopback only, its temp dir is gone after shutdown, a shut-down context
refuses every call with FrayError, spec options are range-checked, and a job's own output is never dropped from
its logs. Real Ray, no mocks."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

from _procs import cmdline, group_and_descendants, listening

import fray
from fray.errors import JobNotFoundError
from fray.host import procfs
from fray.host.net import is_loopback
from fray.registry import cluster_context_from, job_context_from, parse_spec
from fray_ray import RayBackend, RayClusterContext, RayJobContext, _auth, _connect, _local


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayClusterContext]:
    context = cluster_context_from(RayBackend(), {"num_cpus": "1", "object_store_memory": "80000000"})
    yield context
    context.shutdown()


def _assert_loopback_only(pids: list[int]) -> None:
    sockets = listening(pids)
    assert sockets, "the processes should listen somewhere"
    outside = {
        f"{pid} {cmdline(pid)}": addrs for pid, addrs in sockets.items() if not all(is_loopback(a) for a, _ in addrs)
    }
    assert not outside, f"listening beyond loopback: {outside}"


def pid() -> int:
    return os.getpid()


class Pid:
    def pid(self) -> int:
        return os.getpid()


# ---------------------------------------------------------------------------------------- where it listens
def test_private_ray_listens_on_loopback_only(ctx: RayJobContext) -> None:
    conn = _connect._conn
    if conn is None or not conn.started_here or conn.leader is None:
        pytest.skip("this process's Ray connection is not a private instance started by fray")
    actor = ctx.create_actor(Pid)
    worker_pids = ctx.get([ctx.create_task(pid), actor.pid()], timeout=60)
    pids = group_and_descendants(conn.leader.pid)
    assert set(worker_pids) <= set(pids)  # the workers are found (they have groups of their own)
    _assert_loopback_only([os.getpid(), *pids])
    ctx.kill(actor)


def test_a_private_ray_starts_no_dashboard_no_autoscaler_and_a_minimal_agent(ctx: RayJobContext) -> None:
    conn = _connect._conn
    if conn is None or not conn.started_here or conn.leader is None:
        pytest.skip("this process's Ray connection is not a private instance started by fray")
    assert ctx.get(ctx.create_task(pid), timeout=60) != os.getpid()
    commands = [" ".join(procfs.cmdline(p) or []) for p in group_and_descendants(conn.leader.pid)]
    assert any("log_monitor.py" in c for c in commands), commands  # (the instance's own processes are looked at)
    started = [c for c in commands if "dashboard/dashboard.py" in c or "autoscaler/_private/monitor.py" in c]
    assert not started, started
    # the agent the raylet runs (Ray's processes retitle themselves: its command line is found in the raylet's)
    [raylet] = [c for c in commands if "/raylet/raylet " in c]
    assert "fray_ray/_minimal_agent.py " in raylet and "dashboard/agent.py" not in raylet, raylet


def test_private_head_listens_on_loopback_only(cluster: RayClusterContext) -> None:
    assert cluster._head is not None
    job = cluster.create_job("sleep 30")
    try:
        deadline = time.monotonic() + 60
        while cluster.get_job(job).status != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        _assert_loopback_only(group_and_descendants(cluster._head.proc.pid))
    finally:
        cluster.delete_job(job)


# ---------------------------------------------------------------------------------------- token auth
def test_private_ray_and_private_head_enforce_token_auth(ctx: RayJobContext, cluster: RayClusterContext) -> None:
    """Clusters fray starts refuse a request without a token (their GCS answers UNAUTHENTICATED)."""
    import ray

    conn = _connect._conn
    if conn is not None and conn.started_here:
        assert _auth.cluster_auth_mode(ray.get_runtime_context().gcs_address) == "token"
    assert cluster.gcs_address is not None
    assert _auth.cluster_auth_mode(cluster.gcs_address) == "token"


# ---------------------------------------------------------------------------------------- shut down
def test_every_method_of_a_shut_down_context_raises_fray_error() -> None:
    ctx = job_context_from(RayBackend(), parse_spec(RayBackend.test_spec)[1])
    ref = ctx.create_task(pid)
    ctx.get(ref, timeout=60)
    actor = ctx.create_actor(Pid)
    ctx.shutdown()
    ctx.shutdown()  # idempotent
    calls = {
        "create_task": lambda: ctx.create_task(pid),
        "create_actor": lambda: ctx.create_actor(Pid),
        "actor call": lambda: actor.pid(),
        "get": lambda: ctx.get(ref),
        "wait": lambda: ctx.wait([ref], timeout=0),
        "put": lambda: ctx.put(1),
        "get_actor": lambda: ctx.get_actor("nobody"),
        "kill": lambda: ctx.kill(actor),
        "cancel": lambda: ctx.cancel(ref),
        "transfer_stats": lambda: ctx.transfer_stats(),
        "node_resources": lambda: ctx.node_resources(),
    }
    for name, call in calls.items():
        start = time.monotonic()
        with pytest.raises(fray.FrayError, match="shut down"):
            call()
        assert time.monotonic() - start < 1.0, f"{name} should fail at once"


def test_clean_shutdown_leaves_no_process_and_no_temp_dir() -> None:
    # In a subprocess: this process may share its Ray connection with other tests.
    driver = textwrap.dedent(
        """
        import os, time, fray
        from fray.host.procfs import group_members
        from fray_ray import _connect
        ctx = fray.init("ray?num_cpus=1&object_store_memory=80000000&log_to_driver=false")
        assert ctx.get(ctx.create_task(os.getpid), timeout=60)
        conn = _connect._conn
        fray.shutdown()
        assert not group_members(conn.leader.pid), group_members(conn.leader.pid)
        assert not os.path.exists(conn.temp_dir), os.listdir(conn.temp_dir)
        time.sleep(2)  # nothing of Ray's refills it
        assert not os.path.exists(conn.temp_dir), os.listdir(conn.temp_dir)
        print("OK")
        """
    )
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_a_head_fray_started_is_told_not_to_drain_when_stopped(cluster: RayClusterContext) -> None:
    """On SIGTERM a Ray 2.60 node drains first, up to 30 s, for its work to move to other nodes: a head's cluster
    goes with it, and 1 stop in 3 waited out all 30 s. The head fray starts is told not to (unless the user said)."""
    head = cluster._head  # type: ignore[attr-defined]
    environ = Path(f"/proc/{head.proc.pid}/environ").read_bytes().split(b"\0")
    wanted = os.environ.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    assert f"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S={wanted}".encode() in environ


def test_a_private_head_starts_no_ray_client_server(cluster: RayClusterContext) -> None:
    """fray's drivers join through the GCS: a head of fray's own context has no Ray Client server (no process, no
    port), while `ray start` starts one by default."""
    head = cluster._head  # type: ignore[attr-defined]
    commands = [" ".join(procfs.cmdline(p) or ()) for p in group_and_descendants(os.getpgid(head.proc.pid))]
    assert any("gcs_server" in c for c in commands), [c[:100] for c in commands]
    assert not [c for c in commands if "ray.util.client.server" in c], [c[:100] for c in commands]


def test_a_head_fray_started_sets_up_its_runtime_env_workers_with_frays_script(cluster: RayClusterContext) -> None:
    """A worker with a runtime env (a job's supervisor has one, always) starts through a set-up script: fray's,
    which imports no Ray before the worker does (fray_ray._setup_worker). Its variables are set as Ray sets them:
    `${X}` of the node's environment expanded, one it lacks dropped."""
    head = cluster._head  # type: ignore[attr-defined]
    commands = [" ".join(procfs.cmdline(p) or ()) for p in group_and_descendants(os.getpgid(head.proc.pid))]
    raylets = [c for c in commands if "--python_worker_command=" in c]
    assert raylets, f"no raylet among the head's processes: {[c[:100] for c in commands]}"
    assert all("fray_ray/_setup_worker.py" in c and "workers/setup_worker.py" not in c for c in raylets), raylets
    env = fray.RuntimeEnv(env={"FRAY_SET_UP": "<${HOME}|${FRAY_NEVER_SET_ANYWHERE}>"})
    job = cluster.create_job('echo "$FRAY_SET_UP"', env=env)
    cluster.wait_job(job, timeout=120)
    try:
        assert cluster.get_job_logs(job) == f"<{os.environ['HOME']}|>\n"
    finally:
        cluster.delete_job(job)


# ---------------------------------------------------------------------------------------- temp dir base
def test_temp_base_leaves_room_for_rays_socket_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert _local.short_tmp() == "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", "/scratch/cluster/jobs/run-0042")  # 29 characters
    assert _local.short_tmp() == "/tmp"
    monkeypatch.setenv("RAY_TMPDIR", "/var/tmp")
    assert _local.short_tmp() == "/var/tmp"


def test_private_head_starts_with_a_long_tmpdir_and_a_driver_joins_it() -> None:
    """Also: on a machine without a Ray token (a fresh HOME, no RAY_AUTH_*), the head fray starts still runs in
    token mode (with a token of its own, fray_ray._tokens), and a driver joins it in token mode."""
    long_tmp = tempfile.mkdtemp(prefix="fray-long-tmpdir", dir="/tmp")  # 29 characters
    home = tempfile.mkdtemp(prefix="fray-home-")
    try:
        assert len(long_tmp) == 29
        driver = textwrap.dedent(
            """
            import os
            import fray
            from fray_ray import _auth
            with fray.cluster("ray?num_cpus=1&object_store_memory=80000000") as cluster:
                token = cluster._head.token_file  # made for the head alone, private; none in ~/.ray
                assert os.stat(token).st_mode & 0o777 == 0o600 and os.stat(token.parent).st_mode & 0o777 == 0o700
                assert not os.path.exists(os.path.expanduser("~/.ray/auth_token"))
                assert _auth.cluster_auth_mode(cluster.gcs_address) == "token"
                job = cluster.create_job("echo hello")
                assert cluster.wait_job(job, timeout=120).status == "SUCCEEDED"
                print(cluster.get_job_logs(job), end="")
                # a driver joins the loopback-only head by its address (Ray would rewrite 127.0.0.1), in token
                # mode (fray started that head), and its ordinary actors are created
                ctx = fray.init(f"ray?address={cluster.gcs_address}")
                from ray._raylet import AuthenticationMode, get_authentication_mode
                assert get_authentication_mode() == AuthenticationMode.TOKEN
                assert ctx.get(ctx.create_task(sum, args=([1, 2],)), timeout=60) == 3
                class Echo:
                    def echo(self, x):
                        return x
                assert ctx.get(ctx.create_actor(Echo).echo(3), timeout=60) == 3
                fray.shutdown()
            """
        )
        env = {**os.environ, "TMPDIR": long_tmp}
        env.pop("RAY_TMPDIR", None)
        env["HOME"] = home  # no token yet
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)  # fray picks the mode (this process's private Ray may have set RAY_AUTH_MODE)
        out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=180, env=env)
        assert out.stdout == "hello\n", out.stderr[-3000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)
        os.rmdir(long_tmp)  # fails if anything was left in it


# ---------------------------------------------------------------------------------------- spec options
@pytest.mark.parametrize(
    "spec, option",
    [
        ("ray?num_cpus=-1", "num_cpus"),
        ("ray?num_gpus=-0.5", "num_gpus"),
        ("ray?num_cpus=nan", "num_cpus"),
        ("ray?num_cpus=inf", "num_cpus"),
        ("ray?object_store_memory=0", "object_store_memory"),
        ("ray?object_store_memory=-100", "object_store_memory"),
        ("ray?object_store_memory=1.5", "object_store_memory"),
        ('ray?resources={"tag":-1}', "resources"),
        ("ray?working_dir=/no/such/dir", "working_dir"),
        ("ray?namespace=", "namespace"),
        ("ray?address=", "address"),
        ("ray?log_to_driver=maybe", "log_to_driver"),
    ],
)
def test_spec_options_out_of_range_name_the_option(spec: str, option: str) -> None:
    for make in (fray.init, fray.cluster):
        with pytest.raises(ValueError, match=f"option {option}="):
            make(spec)


# ---------------------------------------------------------------------------------------- job logs
def _logs(cluster: RayClusterContext, command: str) -> str:
    job = cluster.create_job(command)
    cluster.wait_job(job, timeout=120)
    try:
        assert cluster.get_job(job).entrypoint == command
        return cluster.get_job_logs(job)
    finally:
        cluster.delete_job(job)


def test_job_output_is_never_dropped_from_its_logs(cluster: RayClusterContext) -> None:
    assert _logs(cluster, "echo hello") == "hello\n"
    assert _logs(cluster, "printf abc") == "abc"  # no newline: Ray's line may land right after it
    missing = _logs(cluster, "no-such-command-fray-xyz")
    assert "no-such-command-fray-xyz" in missing and "not found" in missing, repr(missing)
    assert "Running entrypoint" not in missing and "Runtime env is setting up" not in missing


def test_a_job_on_this_machine_runs_in_the_callers_directory(
    cluster: RayClusterContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No working_dir named: in place in the caller's directory (only a cluster elsewhere gets none uploaded)."""
    monkeypatch.chdir(tmp_path)
    assert _logs(cluster, "pwd") == f"{tmp_path}\n"


# ---------------------------------------------------------------------------------------- delete lasts
def _running(cluster: RayClusterContext, command: str) -> str:
    job = cluster.create_job(command)
    deadline = time.monotonic() + 60
    while cluster.get_job(job).status != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    return job


def _never_seen_again(cluster: RayClusterContext, job: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert job not in [info.id for info in cluster.list_jobs()]
        with pytest.raises(JobNotFoundError):
            cluster.get_job(job)
        time.sleep(0.1)


def test_a_deleted_running_job_is_never_listed_again(cluster: RayClusterContext) -> None:
    """Ray's job manager wrote the record of a job deleted while running back about 1 s later, as FAILED."""
    job = _running(cluster, "sleep 300")
    cluster.delete_job(job)
    _never_seen_again(cluster, job, 4.0)
    assert job not in [d.submission_id for d in cluster._client.list_jobs()]  # nor by Ray


def test_a_record_ray_writes_back_after_a_delete_is_no_job(cluster: RayClusterContext) -> None:
    """A job deleted straight through Ray's client as soon as it has stopped: Ray's job manager writes its
    record back; fray neither lists nor finds it, and its listing deletes it."""
    job = _running(cluster, "sleep 300")
    cluster._client.stop_job(job)
    while not cluster._client.get_job_status(job).is_terminal():
        time.sleep(0.02)
    cluster._client.delete_job(job)
    deadline = time.monotonic() + 10
    while job not in [d.submission_id for d in cluster._client.list_jobs()]:
        if time.monotonic() > deadline:
            pytest.skip("Ray's job manager saw the job end before the delete this time: nothing was written back")
        with pytest.raises(JobNotFoundError):
            cluster.get_job(job)
        time.sleep(0.05)
    _never_seen_again(cluster, job, 1.0)
    assert job not in [d.submission_id for d in cluster._client.list_jobs()]  # fray's listing deleted it


# ---------------------------------------------------------------------------------------- engine links
def test_the_engine_link_is_rays_dashboard_where_the_cluster_runs_one(cluster: RayClusterContext) -> None:
    """The cluster context's address is its dashboard's; a job's driver on that cluster (RAY_ADDRESS, set by Ray)
    finds the same address in the GCS. fray's private Ray runs none (test_ray_events.py)."""
    assert cluster.address.startswith("http://127.0.0.1:")
    assert cluster.engine_links() == {"Ray dashboard": cluster.address}
    probe = "import json, fray; print('LINKS=' + json.dumps(fray.init()._engine_links())); fray.shutdown()"
    logs = _logs(cluster, f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}")
    found = [line[len("LINKS=") :] for line in logs.splitlines() if line.startswith("LINKS=")]
    assert [json.loads(line) for line in found] == [{"Ray dashboard": cluster.address}], logs[-3000:]
