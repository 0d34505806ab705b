"""The namespaced hosts of tests/_netns.py, and the sshd and Slurm cluster started over them (root only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _netns import Host, namespaced_hosts, plain_socket_rate, require_namespaced_hosts, stale_cleanup
from _slurm import require_slurm, start_slurm
from _sshd import require_sshd, start_sshd

from fray.host import procfs

TESTS = Path(__file__).resolve().parents[1]


SERVE_ONCE = (
    "import socket, sys\ns = socket.create_server((sys.argv[1], 29555))\nprint('LISTENING', flush=True)\n"
    "s.settimeout(30)\ns.accept()"
)
CONNECT = "import socket, sys\nsocket.create_connection((sys.argv[1], 29555), timeout=10)\nprint('CONNECTED')"


def _py(host: Host, code: str, *args: str) -> str:
    done = host.run([sys.executable, "-c", code, *args], timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(done.stdout).strip()


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True, timeout=30).stdout


def _state(pid: int) -> str | None:
    found = procfs.stat(pid)
    return None if found is None else found.state


def _assert_removed(hosts: list[Host]) -> None:
    tag = hosts[0].netns.split("-")[1]  # every name of a network (namespaces, links, hostnames) holds its tag
    assert tag not in _ip("netns", "list")
    assert tag not in _ip("-o", "link")
    for host in hosts:
        assert not Path("/etc/netns", host.netns).exists()
        assert _state(host.holder_pid) in (None, "Z")  # gone, or a zombie its parent has yet to reap
    assert not list(Path("/run/fray-test-netns").glob(f"{tag}.json"))


def test_two_hosts_are_separate_machines_on_one_network() -> None:
    require_namespaced_hosts()
    with namespaced_hosts(2) as hosts:
        h0, h1 = hosts
        names = [h.run(["hostname"], timeout=10, capture_output=True, text=True).stdout.strip() for h in hosts]
        assert names == [h0.name, h1.name]
        assert h0.address != h1.address
        resolve = (
            "import socket, sys; print(socket.gethostbyname(sys.argv[1]), socket.gethostbyname(socket.gethostname()))"
        )
        assert _py(h0, resolve, h1.name).split() == [h1.address, h0.address]

        serve = (
            "import socket; s = socket.create_server((socket.gethostname(), 0)); print(s.getsockname()[1], flush=True)"
        )
        listener = h1.popen(
            [sys.executable, "-c", f"{serve}; s.accept()[0].sendall(b'hello')"], stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None
        port = listener.stdout.readline().strip()
        assert _eventually(lambda: listener.pid in h1.pids())
        connect = "import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), 10).recv(5))"
        assert _py(h0, connect, h1.name, port) == "b'hello'"
        listener.wait(10)

        # No route out: the machine's own addresses are unreachable from a host, not merely refused.
        outside = [a["local"] for link in json.loads(_ip("-j", "-4", "addr")) for a in link["addr_info"]]
        probe = (
            "import errno, socket, sys\nfor a in sys.argv[1:]:\n    try: socket.create_connection((a, 22), 2)\n"
            "    except OSError as e: print(errno.errorcode.get(e.errno, e))\n    else: print('connected')"
        )
        reached = _py(h0, probe, "1.1.1.1", *(a for a in outside if not a.startswith("127."))).split()
        assert set(reached) == {"ENETUNREACH"}

        name = f"fray-netns-test-{os.getpid()}"
        h0.run(["touch", f"/dev/shm/{name}"], timeout=10, check=True)
        assert name in h0.shm_files()
        assert name not in h1.shm_files()
        assert not Path("/dev/shm", name).exists()

        stale_cleanup()  # a live owner's network is not stale
        assert _py(h1, "import socket; print(socket.gethostname())") == h1.name
        sleeper = h1.popen(["sleep", "300"])
        assert _eventually(lambda: sleeper.pid in h1.pids())
    assert sleeper.wait(10) == -signal.SIGKILL
    _assert_removed(hosts)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_block_still_removes_its_hosts(exc: type[BaseException]) -> None:
    require_namespaced_hosts()
    with pytest.raises(exc), namespaced_hosts(2) as hosts:
        sleepers = [h.popen(["sleep", "300"]) for h in hosts]
        assert _eventually(lambda: all(s.pid in h.pids() for s, h in zip(sleepers, hosts, strict=True)))
        raise exc("interrupted")
    assert [s.wait(10) for s in sleepers] == [-signal.SIGKILL] * 2
    _assert_removed(hosts)


def test_stale_cleanup_removes_the_hosts_of_a_killed_owner() -> None:
    require_namespaced_hosts()
    code = (
        "import json, sys, time; sys.path.insert(0, sys.argv[1]); import _netns\n"
        "with _netns.namespaced_hosts(2) as hosts:\n"
        "    hosts[1].popen(['sleep', '300'])\n"
        "    print(json.dumps([h.__dict__ for h in hosts]), flush=True); time.sleep(300)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code, str(TESTS)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    hosts = [Host(**h) for h in json.loads(owner.stdout.readline())]
    assert _eventually(lambda: len(hosts[1].pids()) == 1)
    owner.kill()  # SIGKILL: its own teardown never runs
    owner.wait(10)
    assert Path("/run/netns", hosts[0].netns).exists()
    stale_cleanup()
    _assert_removed(hosts)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_stale_cleanup_leaves_the_hosts_of_an_owner_in_another_pid_namespace() -> None:
    """make test runs parts in PID namespaces of their own: an owner's pid means nothing in another one, so a
    part cleaning up must not take a live part's network for a dead owner's (it did: the other part's hosts lost
    their switch, and each other)."""
    require_namespaced_hosts()
    with namespaced_hosts(2) as hosts:
        cleanup = "import sys; sys.path.insert(0, sys.argv[1]); import _netns; _netns.stale_cleanup()"
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", cleanup, str(TESTS)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert Path("/run/netns", hosts[0].netns).exists()
        assert Path("/run/netns", f"fray-{hosts[0].netns.split('-')[1]}-sw").exists()  # the switch, too
        server = hosts[1].popen([sys.executable, "-c", SERVE_ONCE, hosts[1].address], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "LISTENING"
        assert _py(hosts[0], CONNECT, hosts[1].address) == "CONNECTED"  # the two still reach each other
        server.wait(30)


def test_plain_socket_rate_times_every_transfer() -> None:
    require_namespaced_hosts()
    with namespaced_hosts(2) as (h0, h1):
        times = plain_socket_rate(h0, h1, nbytes=1 << 20, repeats=3)
    assert len(times) == 3 and all(0 < t < 10 for t in times)


def test_ssh_key_login_from_one_host_runs_on_the_other(tmp_path: Path) -> None:
    require_namespaced_hosts()
    require_sshd()
    with namespaced_hosts(2) as (h0, h1), start_sshd(h1, tmp_path / "sshd") as sshd:
        done = h0.run(["ssh", *sshd.client_args(), h1.name, "hostname"], timeout=30, capture_output=True, text=True)
        assert (done.returncode, done.stdout.strip()) == (0, h1.name), done.stderr


def test_slurm_batch_job_runs_a_task_on_each_node(tmp_path: Path) -> None:
    require_namespaced_hosts()
    require_slurm()
    with namespaced_hosts(2) as hosts, start_slurm(hosts, tmp_path / "slurm") as cluster:
        out = tmp_path / "job.out"
        submit = ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1", "-p", cluster.partition, "-o", str(out)]
        job = cluster.run([*submit, "--wrap", "srun hostname"], host=hosts[1]).stdout.strip()
        # `squeue --job ID --json` lists every job in this Slurm (22.05): the plain form filters. A finished job
        # stays listed (MinJobAge), so wait for its state.
        state = ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]
        assert _eventually(lambda: cluster.run(state).stdout.strip() == "COMPLETED", timeout=60), cluster.log_tails()
        assert sorted(out.read_text().split()) == sorted(cluster.nodes) == sorted(h.name for h in hosts)
