"""Ray nodes on namespaced hosts (tests/_netns.py): one `ray start --block` per host, in a session and a temp dir
of its own, stopped by signals to exactly its process group (never `ray stop`: it kills every Ray process on the
machine, other people's included).

The nodes run in token-auth mode, what a 2.60 `ray start --head` does wherever a token is available (any machine
where `ray.init()` ran); a worker node's `ray start` does not follow the head by itself, so RAY_AUTH_MODE=token is
set for both. The token is a private file named by RAY_AUTH_TOKEN_PATH rather than ~/.ray/auth_token: making that
file would switch every later default `ray start` on this shared machine into token mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _netns import Host

from fray.host import procfs

PORT = 6379  # each host has a network stack of its own: Ray's default port collides with nobody's
DASHBOARD_PORT = 8265
RAY = str(Path(sys.executable).with_name("ray"))  # absolute: nsenter enters the host's mount namespace
STOP_GRACE = 15.0  # seconds between SIGTERM and SIGKILL of a node's process group
OBJECT_STORE = 100_000_000
# On SIGTERM a 2.60 node first drains (waits up to 30 s for its work to move elsewhere): pointless for a test
# cluster that is going away whole, and it held `ray start` and its GCS past any reasonable grace.
NO_DRAIN = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
STARTED = b"Ray runtime started."
GAVE_UP = b"timed out during startup"  # `ray start`: its raylet did not register in Ray's fixed 30 s

_PROBE = """
import json, sys, time
from ray._raylet import GcsClient
address, count, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
seen = []
while time.monotonic() < deadline:
    try:
        infos = GcsClient(address=address).get_all_node_info(timeout=10)
        seen = [
            {"node_id": i.hex(), "address": n.node_manager_address, "resources": dict(n.resources_total)}
            for i, n in infos.items() if n.state == 0  # GcsNodeInfo.ALIVE
        ]
    except Exception as exc:  # the GCS is not up yet
        seen = [repr(exc)]
    if len(seen) == count and all(isinstance(s, dict) for s in seen):
        print(json.dumps(seen), flush=True)
        sys.exit(0)
    time.sleep(1)
print(json.dumps(seen), flush=True)
sys.exit(1)
"""


@dataclass
class RayNode:
    host: Host
    proc: subprocess.Popen[bytes]
    temp_dir: Path
    output: Path  # `ray start`'s stdout and stderr
    attempt: int = 1  # start_node's: 1 for the first node started on its host, 2 for the next, ...


def cluster_env(base: Path) -> dict[str, str]:
    """The environment of the nodes and of the drivers: token auth with a private token, no inherited address, and
    this installation's bin directory first on PATH, as on a cluster whose nodes run with its environment activated
    (a job's `python` there is the cluster's own: fray_ray's job API path names no interpreter of this machine)."""
    token = base / "auth_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    dropped = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR")  # RAY_AUTH_TOKEN beats the file
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["RAY_AUTH_TOKEN_PATH"] = str(token)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    return env


def start_node(
    host: Host,
    base: Path,
    env: dict[str, str],
    resources: dict[str, float],
    head: Host | None,
    dashboard: bool = False,
    attempt: int = 1,
) -> RayNode:
    """`ray start --block` in `host`: the head when `head` is None, else a worker node joining `head`'s GCS. A head
    with `dashboard` serves Ray's job API (what fray's Ray cluster context submits jobs to) at DASHBOARD_PORT.
    A later `attempt` on the same host gets a temp dir and an output file of its own."""
    name = f"{host.index}" if attempt == 1 else f"{host.index}-{attempt}"
    temp_dir = base / f"h{name}"  # short: Ray's unix socket paths live under it (at most 107 bytes)
    temp_dir.mkdir()
    output = base / f"ray-start-{name}.out"
    args = [RAY, "start", "--block", f"--node-ip-address={host.address}", "--num-cpus=1"]
    args += [f"--resources={json.dumps(resources)}", f"--object-store-memory={OBJECT_STORE}"]
    args += ["--disable-usage-stats", f"--temp-dir={temp_dir}"]
    if head is None:
        args += ["--head", f"--port={PORT}"]
        if dashboard:
            args += ["--include-dashboard=true", f"--dashboard-host={host.address}"]
            args += [f"--dashboard-port={DASHBOARD_PORT}"]
        else:
            args += ["--include-dashboard=false"]
    else:
        args += [f"--address={head.address}:{PORT}"]
    node_env = {**env, "RAY_AUTH_MODE": "token", "RAY_TMPDIR": str(temp_dir), **NO_DRAIN}
    with open(output, "wb") as out:
        # A session of its own (Host.popen's default): its process group is exactly this node's to signal.
        proc = host.popen(args, cwd=str(base), env=node_env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return RayNode(host, proc, temp_dir, output, attempt)


def wait_started(nodes: list[RayNode], deadline: float) -> None:
    """Until every node's `ray start` says it started (by time.monotonic() `deadline`, else AssertionError with
    the nodes' log tails). A worker node is best started once its head has: it then finds the GCS at once."""
    # Also what makes stopping clean: a `ray start` still starting (it waits for its raylet to show in the GCS)
    # defers its SIGTERM handler, and in 2.60 then hangs once its raylet is gone.
    while not all(STARTED in node.output.read_bytes() for node in nodes):
        codes = [node.proc.poll() for node in nodes]
        if time.monotonic() > deadline or any(code is not None for code in codes):
            raise AssertionError(f"Ray nodes not started in time (exit codes {codes}):\n{log_tails(nodes)}")
        time.sleep(0.2)


def wait_for_nodes(nodes: list[RayNode], env: dict[str, str], deadline: float) -> list[dict[str, Any]]:
    """The live nodes as the head's (nodes[0]'s) GCS lists them once all have started, asked from inside the
    head's host; AssertionError with the nodes' log tails if that is not so by time.monotonic() `deadline`."""
    wait_started(nodes, deadline)
    head = nodes[0]
    left = max(deadline - time.monotonic(), 30.0)
    cmd = [sys.executable, "-c", _PROBE, f"{head.host.address}:{PORT}", str(len(nodes)), str(left)]
    probe_env = {**env, "RAY_AUTH_MODE": "token"}
    try:
        done = head.host.run(cmd, timeout=left + 60, cwd=str(head.temp_dir), env=probe_env, capture_output=True)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the node probe hung:\n{log_tails(nodes)}") from None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        seen = lines[-1] if lines else done.stderr.decode(errors="replace")[-2000:]
        raise AssertionError(f"{len(nodes)} Ray nodes not alive in the GCS (seen: {seen}):\n{log_tails(nodes)}")
    alive: list[dict[str, Any]] = json.loads(lines[-1])
    return alive


@contextlib.contextmanager
def running_cluster(
    hosts: list[Host],
    base: Path,
    env: dict[str, str],
    worker_resources: dict[str, float],
    wait: float,
    dashboard: bool = False,
) -> Iterator[tuple[list[RayNode], list[dict[str, Any]]]]:
    """A Ray head on hosts[0] (resource head_tag; its job API with `dashboard`) and a worker node on each other
    host (`worker_resources`), up within `wait` seconds: its nodes (the head's first) and the live nodes as the GCS
    lists them. Stopped after."""
    nodes: list[RayNode] = []
    try:
        deadline = time.monotonic() + wait
        nodes.append(start_node(hosts[0], base, env, {"head_tag": 1}, head=None, dashboard=dashboard))
        wait_started(nodes, deadline)  # (a worker node best starts once its head has: it finds the GCS at once)
        for host in hosts[1:]:
            nodes.append(start_node(host, base, env, worker_resources, head=hosts[0]))
        gave_up = _worker_starts_given_up(nodes, deadline)
        for i in gave_up:  # once more, as fray does for a head of its own (fray_ray._head)
            stop_nodes([nodes[i]])  # (what it left, a late raylet included, must not join as a node of its own)
            nodes.append(nodes[i])  # (reaped with the others at the end)
            nodes[i] = start_node(hosts[i], base, env, worker_resources, head=hosts[0], attempt=2)
        live = nodes[: len(hosts)]
        yield live, wait_for_nodes(live, env, deadline)
    finally:
        stop_nodes(nodes)


def restart_lost_workers(
    nodes: list[RayNode], base: Path, env: dict[str, str], worker_resources: dict[str, float], wait: float
) -> list[RayNode]:
    """Start a worker node again on each host whose node is gone (its `ray start` ended: the host was killed), in
    place of that node in `nodes`, and wait (`wait` seconds) until the GCS lists every one of `nodes` alive (a
    lost node's entry stays there, dead). The nodes started, for the caller to stop."""
    deadline = time.monotonic() + wait
    started = []
    for i, node in enumerate(nodes[1:], start=1):
        if node.proc.poll() is None:
            continue
        nodes[i] = start_node(node.host, base, env, worker_resources, head=nodes[0].host, attempt=node.attempt + 1)
        started.append(nodes[i])
    if started:
        wait_for_nodes(nodes, env, deadline)
    return started


def _worker_starts_given_up(nodes: list[RayNode], deadline: float) -> list[int]:
    """The indexes of the worker nodes whose `ray start` gave up (as on a loaded machine) once every other node
    has started; AssertionError as wait_started's for any other end."""
    try:
        wait_started(nodes, deadline)
        return []
    except AssertionError:
        ended = [i for i, node in enumerate(nodes) if node.proc.poll() is not None]
        gave_up = [i for i in ended if i > 0 and GAVE_UP in nodes[i].output.read_bytes()]
        if gave_up != ended:
            raise
        others = [node for i, node in enumerate(nodes) if i not in gave_up]
        wait_started(others, deadline)
        return gave_up


def stop_nodes(nodes: list[RayNode]) -> None:
    """Stop each node, worker nodes first (they leave while the head's GCS still answers): SIGTERM to its process
    group (`ray start --block` then stops what it started), SIGKILL to what is left after a grace. A group is
    named by its leader's pid, which stays ours until we reap it here."""
    for node in reversed(nodes):
        for signum in (signal.SIGTERM, signal.SIGKILL):
            if not _group_alive(node.proc.pid):
                break
            try:
                os.killpg(node.proc.pid, signum)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + STOP_GRACE
            while _group_alive(node.proc.pid) and time.monotonic() < deadline:
                node.proc.poll()  # reap the leader: a zombie is no member, and its pid must stay ours until then
                time.sleep(0.1)
        node.proc.wait(STOP_GRACE)


def _group_alive(pgid: int) -> bool:
    """Does process group pgid have a member that is not a zombie?"""
    return bool(procfs.group_members(pgid))


def log_tails(nodes: list[RayNode], lines: int = 12) -> str:
    """The last lines of each node's `ray start` output and main Ray logs: what a failed start-up shows."""
    parts = []
    for node in nodes:
        logs = node.temp_dir / "session_latest" / "logs"
        paths = [node.output, *(logs / name for name in ("gcs_server.out", "raylet.out", "raylet.err"))]
        for path in paths:
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- host {node.host.index}: {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)[-6000:]
