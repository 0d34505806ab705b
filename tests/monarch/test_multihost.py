"""Monarch over three hosts that are separate machines to it: each its own network namespace (own address,
hostname, loopback and /dev/shm), sharing only the file system. The driver runs in host 0; hosts 1 and 2 are
host workers the test started (attach), hosts launched over ssh (an sshd in each), or a Slurm allocation
(slurmctld in host 0, a slurmd in each of hosts 1 and 2). Each way runs every cross-host check of
_multihost_driver.py, then the driver is SIGKILLed and nothing it started may be left on any host within 15 s.
Hosts talk TLS with certificates from the test's own authority (FRAY_TLS_DIR, as a shared home directory would
hold it), and plain TCP only where a test asks for it with insecure=true.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _netns import Host

from fray.host import procfs

HERE = Path(__file__).parent
DRIVER = HERE / "_multihost_driver.py"
PY = sys.executable
GONE_WITHIN = 15.0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The driver's environment: a state directory (launch logs, recorded clusters) and a TLS authority of the
    test's own."""
    return {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state"), "FRAY_TLS_DIR": str(tmp_path / "tls")}


def _cmdline(pid: int) -> str:
    return " ".join(procfs.cmdline(pid) or []).strip()


def _fray_processes(host: Host, spare: Callable[[str], bool]) -> list[str]:
    """What fray or Monarch runs in `host`, but what `spare` says the test started itself."""
    found = [_cmdline(pid) for pid in host.pids()]
    return [c for c in found if ("fray" in c or "monarch" in c) and not spare(c)]


def _lines_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    """The lines `proc` prints, up to the one starting with `marker`. A thread reads them: select() on a pipe
    that Python already buffered says nothing is left while a line waits in the buffer."""
    assert proc.stdout is not None
    stream = proc.stdout
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line.startswith(marker):
            return seen
    raise AssertionError(f"the driver did not print {marker} within {timeout:.0f} s: {seen[-5:]}")


def run_then_kill(
    hosts: list[Host],
    spec: str,
    big: int,
    env: dict[str, str],
    log: Path,
    spare: Callable[[str], bool] = bool,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], float]:
    """Run the driver in host 0 with `spec`; return what it saw and how long after its SIGKILL every host was
    free of what it started (fray and Monarch processes, /dev/shm files). Fails if that took over 15 s."""
    with open(log, "w") as errors:
        driver = hosts[0].popen(
            [PY, str(DRIVER), spec, str(big), *extra],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            cwd=HERE,
            env=env,
        )
    try:
        lines = _lines_until(driver, "HOLDING", 420)
    except AssertionError as exc:
        driver.kill()
        raise AssertionError(f"{exc}\n{log.read_text(errors='replace')[-4000:]}") from None
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT ") :])
    driver.kill()  # SIGKILL of the driver alone: what it started must go by itself
    driver.wait()
    killed = time.monotonic()
    while True:
        left = {h.name: _fray_processes(h, lambda c: bool(spare(c))) + h.shm_files() for h in hosts}
        if not any(left.values()):
            return result, time.monotonic() - killed
        if time.monotonic() - killed > GONE_WITHIN:
            raise AssertionError(f"left {GONE_WITHIN:.0f} s after the driver's SIGKILL: {left}")
        time.sleep(0.25)


def check_cross_host(result: dict[str, Any], hosts: list[Host]) -> None:
    driver, others = hosts[0].name, sorted(h.name for h in hosts[1:])
    assert result["driver"] == driver
    assert result["nodes"] == 2
    assert result["task_hosts"] == others  # tasks ran on both other hosts, none on the driver's
    assert [r[1:] for r in result["put_read"]] == [[32 * 2**20, 32 * 2**20]] * len(result["put_read"])
    assert {r[0] for r in result["put_read"]} <= set(others)
    assert result["task_result"] == [2 * 16 * 2**20, 16 * 2**20]  # made on another host, read by the driver
    remote, nested = result["nested"]
    assert remote in others and set(nested) <= set(others)  # a remote task's own tasks ran
    assert sorted(result["actors"]) == others  # one actor per host
    reader, total = result["actor_to_actor"]
    assert reader == result["actors"][1] != result["actors"][0] and total > 0  # made on A, read on B
    assert {"tcp-direct", "rdma-tcp", "rdma-ibverbs"} & set(result["paths"]), result["paths"]  # host to host
    assert result["all_reduce"] == [3.0, 3.0]  # gloo over the two hosts
    ranks = result["spmd_world"]
    assert {r[0] for r in ranks} == set(others) and [r[1:3] for r in ranks] == [["0", "2"], ["1", "2"]]
    master = next(h.address for h in hosts if h.name == ranks[0][0])
    assert {r[3] for r in ranks} == {master}  # MASTER_ADDR: rank 0's host address
    drawn = result["timeline"]  # every host's events in one valid timeline (clocks aligned: no flow goes back)
    assert drawn["problems"] == [] and drawn["tasks"] >= 12 + 6 + 1 + 5, drawn
    assert drawn["task_hosts"] == others, drawn
    assert drawn["tcp_sources"] >= 2 or "tcp-direct" not in result["paths"], drawn  # each names its source process


@contextlib.contextmanager
def started_workers(hosts: list[Host], env: dict[str, str], scheme: str, *flags: str) -> Iterator[str]:
    """Host workers started by hand on hosts 1 and 2, as a user would: the spec that attaches to them."""
    workers = [
        h.popen(
            [PY, "-m", "fray_monarch.worker", "--address", f"{scheme}://{h.name}:29500", *flags],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        for h in hosts[1:]
    ]
    try:
        yield f"monarch?hosts={scheme}://{hosts[1].name}:29500,{scheme}://{hosts[2].name}:29500&procs=1"
        assert all(w.poll() is None for w in workers)  # the user's workers outlive the drivers
    finally:
        for w in workers:
            w.kill()
            w.wait(10)


@pytest.fixture
def user_workers(hosts: list[Host], env: dict[str, str]) -> Iterator[str]:
    with started_workers(hosts, env, "tls") as spec:
        yield spec


def _user_worker(cmdline: str) -> bool:
    """A host worker the test started, or the watchdog that removes its TLS identity when it ends."""
    if cmdline.split()[1:3] == ["-m", "fray.host.watchdog"]:
        return _user_worker(_cmdline(int(cmdline.split()[3])))
    return "fray_monarch.worker" in cmdline


def test_attached_hosts(hosts: list[Host], user_workers: str, env: dict[str, str], tmp_path: Path) -> None:
    """Host workers the user started: the driver attaches over TLS and its processes end with it; the workers,
    being the user's, stay. 1 GiB moves from an actor on host 1 to one on host 2 without touching the driver;
    groups are packed on one host, spread evenly as one 2-D mesh (hosts x procs), unevenly as a mesh per host."""
    log = tmp_path / "driver.log"
    result, _ = run_then_kill(hosts, user_workers, 2**30, env, log, _user_worker, ("placement",))
    check_cross_host(result, hosts)
    assert result["actor_to_actor"][1] == 2**30
    assert result["driver_rss_growth"] < 64 * 2**20, result["driver_rss_growth"]  # the GiB never came here
    assert result["paths"]["tcp-direct"][1] >= 2**30 and result["paths"].get("shm", [0, 0])[1] < 2**30
    h1, h2 = hosts[1].name, hosts[2].name
    assert len(set(result["pack"])) == 1
    assert result["spread"] == [h1, h1, h2, h2] and result["spread_casts"] == [{"hosts": 2, "procs": 2}] * 4
    assert result["uneven"] == [h1, h1, h2]
    assert result["uneven_casts"] == [{"procs": 2}, {"procs": 2}, {"procs": 1}]  # one mesh per host


def test_rdma_transport_between_hosts(
    hosts: list[Host], user_workers: str, env: dict[str, str], tmp_path: Path
) -> None:
    """transport=rdma: Monarch's RDMABuffer between hosts (its TCP fallback here: there is no ibverbs device)."""
    result, _ = run_then_kill(
        hosts, user_workers + "&transport=rdma", 16 * 2**20, env, tmp_path / "d.log", _user_worker
    )
    rdma = result["paths"].get("rdma-ibverbs") or result["paths"].get("rdma-tcp")
    assert rdma is not None and rdma[1] >= 16 * 2**20 and "tcp-direct" not in result["paths"], result["paths"]
    assert result["actor_to_actor"][1] == 16 * 2**20


def test_hosts_launched_over_ssh(hosts: list[Host], env: dict[str, str], tmp_path: Path) -> None:
    from _sshd import require_sshd, start_sshd

    require_sshd()
    servers = [start_sshd(h, tmp_path / f"sshd-{h.index}") for h in hosts[1:]]
    try:
        options = shlex.join([arg for s in servers for arg in s.client_args()])
        query = {"job": "ssh", "hosts": f"{hosts[1].name},{hosts[2].name}", "procs": "1", "ssh_options": options}
        identities = os.path.join(env.get("TMPDIR", tempfile.gettempdir()), "fray-tls-*")
        before = set(glob.glob(identities))
        result, _ = run_then_kill(
            hosts, "monarch?" + urllib.parse.urlencode(query), 64 * 2**20, env, tmp_path / "d.log"
        )
        check_cross_host(result, hosts)
        deadline = time.monotonic() + GONE_WITHIN  # each host worker removes its TLS files as it ends
        while left := set(glob.glob(identities)) - before:
            assert time.monotonic() < deadline, left
            time.sleep(0.2)
    finally:
        for s in servers:
            s.close()


def test_hosts_allocated_by_slurm(hosts: list[Host], env: dict[str, str], tmp_path: Path) -> None:
    from _slurm import require_slurm, start_slurm

    require_slurm()
    with start_slurm(hosts[1:], tmp_path / "slurm", controller=hosts[0]) as slurm:
        slurm_env = {**env, **slurm.env()}
        spec = f"monarch?job=slurm&nodes=2&partition={slurm.partition}&time=00:10:00&procs=1"
        result, _ = run_then_kill(hosts, spec, 64 * 2**20, slurm_env, tmp_path / "driver.log")
        check_cross_host(result, hosts)
        deadline = time.monotonic() + GONE_WITHIN  # the allocation is cancelled when the driver dies
        while (jobs := slurm.run(["squeue", "-h", "-t", "all", "-o", "%i %T"]).stdout.split())[1::2] != ["CANCELLED"]:
            assert time.monotonic() < deadline, jobs  # (COMPLETING on the way)
            time.sleep(0.5)


def _in_host(host: Host, code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return host.run([PY, "-c", code], timeout=timeout, capture_output=True, text=True, cwd=HERE, env=env)


def _fray_error(stderr: str) -> str:
    """The driver's FrayError line: the last line of its stderr, unless Monarch's own exit hook printed after it
    (its shutdown, given 1 s, times out on a loaded machine: 'Exception ignored in atexit callback')."""
    lines = stderr.strip().splitlines()
    return next((line for line in reversed(lines) if line.startswith("fray.errors.FrayError: ")), lines[-1])


def test_a_silent_host_is_named_with_how_long_fray_waited(hosts: list[Host], env: dict[str, str]) -> None:
    code = f"import fray\nfray.init('monarch?hosts=tls://{hosts[1].name}:29599&attach_timeout=3')"
    out = _in_host(hosts[0], code, env)
    assert out.returncode != 0
    error = _fray_error(out.stderr)
    assert error.startswith("fray.errors.FrayError: attaching to 1 host(s) failed after "), error
    assert f"tls://{hosts[1].name}:29599: connection refused: nothing listens there" in error, error
    assert "python -m fray_monarch.worker --address" in error  # and the fix


def test_a_runtime_started_on_unix_sockets_is_refused_naming_the_fix(hosts: list[Host], env: dict[str, str]) -> None:
    """Monarch fixes a process's transport when its runtime starts: a local context first (Unix sockets), then
    one with other machines, must fail at once saying what to do, not time out after a minute."""
    code = (
        "import time, fray\nfray.init('monarch?procs=1')\nfray.shutdown()\nstart = time.monotonic()\ntry:\n"
        f"    fray.init('monarch?hosts=tls://{hosts[1].name}:29599&attach_timeout=30')\n"
        "except fray.FrayError as exc:\n    print('REFUSED', round(time.monotonic() - start), exc)\n"
    )
    out = _in_host(hosts[0], code, env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("REFUSED")), out.stderr[-2000:])
    assert line.startswith("REFUSED 0 this process's Monarch runtime already started on Unix sockets"), line
    assert "run the multi-host context in a new process" in line and 'enable_transport("tcp")' in line


def _fray_cli(
    host: Host, args: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    fray_command = str(Path(PY).with_name("fray"))
    return host.run([fray_command, *args], timeout=timeout, capture_output=True, text=True, cwd=HERE, env=env)


def test_a_cluster_started_once_serves_later_commands_and_drivers(
    hosts: list[Host], env: dict[str, str], tmp_path: Path
) -> None:
    """`fray cluster start --backend monarch --job ssh`: a head process launches the hosts and outlives the
    command; `fray status`, `fray job ...` and a later `fray.init("monarch")` in other processes use them; a driver
    killed on them leaves the hosts up (the cluster holds them) but nothing of its own; `fray cluster stop` ends
    it all."""
    from _sshd import require_sshd, start_sshd

    require_sshd()
    servers = [start_sshd(h, tmp_path / f"sshd-{h.index}") for h in hosts[1:]]
    names = f"{hosts[1].name},{hosts[2].name}"
    try:
        options = shlex.join([arg for s in servers for arg in s.client_args()])
        backend = "monarch?" + urllib.parse.urlencode({"ssh_options": options, "procs": "1"})
        started = _fray_cli(hosts[0], ["cluster", "start", "--backend", backend, "--job", "ssh", "--hosts", names], env)
        assert started.returncode == 0, started.stderr
        try:
            status = _fray_cli(hosts[0], ["status", "--backend", "monarch", "--json"], env)
            nodes = json.loads(status.stdout)["nodes"]
            assert sorted(n["hostname"] for n in nodes) == sorted(names.split(",")), nodes
            assert {n["held_by"] for n in nodes} == {"ssh"} and all(n["processes"] >= 1 for n in nodes), nodes
            job = _fray_cli(hosts[0], ["job", "submit", "--backend", "monarch", "--", "hostname"], env)
            assert job.returncode == 0 and job.stdout.strip() in names.split(","), (job.stdout, job.stderr)
            listed = _fray_cli(hosts[0], ["job", "list", "--backend", "monarch", "--json"], env)
            assert [j["status"] for j in json.loads(listed.stdout)] == ["SUCCEEDED"], listed.stdout
            before = {h.name: _fray_processes(h, bool) for h in hosts[1:]}
            code = (
                "import fray, socket\nctx = fray.init('monarch')\nprint(ctx.get(ctx.create_task(socket.gethostname)))"
            )
            code += "\nimport time\nprint('HOLDING', flush=True)\ntime.sleep(600)"
            driver = hosts[0].popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, cwd=HERE, env=env)
            lines = _lines_until(driver, "HOLDING", 240)
            assert lines[0].strip() in names.split(",")
            driver.kill()
            driver.wait()
            deadline = time.monotonic() + GONE_WITHIN
            while {h.name: _fray_processes(h, bool) for h in hosts[1:]} != before:  # its own processes went
                assert time.monotonic() < deadline, ({h.name: _fray_processes(h, bool) for h in hosts[1:]}, before)
                time.sleep(0.25)
        finally:
            stopped = _fray_cli(hosts[0], ["cluster", "stop", "--backend", "monarch"], env)
            assert stopped.returncode == 0, stopped.stderr
        deadline = time.monotonic() + GONE_WITHIN
        while any(_fray_processes(h, bool) or h.shm_files() for h in hosts):
            assert time.monotonic() < deadline, {h.name: _fray_processes(h, bool) + h.shm_files() for h in hosts}
            time.sleep(0.25)
    finally:
        for s in servers:
            s.close()


def test_a_failed_ssh_launch_is_reported_at_once_with_what_ssh_said(hosts: list[Host], env: dict[str, str]) -> None:
    start = time.monotonic()
    out = _in_host(hosts[0], f"import fray\nfray.init('monarch?job=ssh&hosts={hosts[1].name}&attach_timeout=120')", env)
    assert out.returncode != 0 and time.monotonic() - start < 60  # not the attach timeout: ssh already ended
    error = out.stderr.strip()
    assert "FrayError: the hosts' launch failed:" in error, error[-2000:]
    assert f"ssh to {hosts[1].name} ended with exit code 255: ssh: connect to host {hosts[1].name} port 22" in error


def test_a_driver_without_the_hosts_authority_cannot_attach(
    hosts: list[Host], user_workers: str, env: dict[str, str], tmp_path: Path
) -> None:
    """TLS workers accept only peers with a certificate from their authority: a driver with another authority,
    and one talking plain TCP, both fail to attach (and are told what to check), and nothing of theirs runs."""
    stranger = {**env, "FRAY_TLS_DIR": str(tmp_path / "another-authority")}
    code = f"import fray\nfray.init({user_workers + '&attach_timeout=3'!r})"
    out = _in_host(hosts[0], code, stranger)
    error = _fray_error(out.stderr)
    assert out.returncode != 0 and "did not finish attaching" in error, out.stderr[-3000:]
    assert "a certificate from another authority" in error and "~/.fray/tls" in error, error
    plain = user_workers.replace("tls://", "tcp://") + "&insecure=true&attach_timeout=3"
    out = _in_host(hosts[0], f"import fray\nfray.init({plain!r})", env)
    error = _fray_error(out.stderr)
    assert out.returncode != 0 and "A worker serving TLS" in error, out.stderr[-3000:]
    assert not [c for h in hosts[1:] for c in _fray_processes(h, _user_worker)]  # no process was spawned for them


def test_plain_tcp_to_other_machines_only_when_asked(hosts: list[Host], env: dict[str, str]) -> None:
    """Plain TCP lets anyone who reaches a port run code: a worker refuses to serve it on a reachable address,
    and a driver to attach over it, unless told --insecure / insecure=true; then it works."""
    refused = hosts[1].run(
        [PY, "-m", "fray_monarch.worker", "--address", f"tcp://{hosts[1].name}:29500"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode == 2 and "add --insecure on a network and machine you trust" in refused.stderr, (
        refused.stderr
    )
    with started_workers(hosts, env, "tcp", "--insecure") as spec:
        code = f"import fray\nfray.init({spec!r})"
        out = _in_host(hosts[0], code, env)
        error = _fray_error(out.stderr)
        assert "plain TCP to another machine" in error and "insecure=true" in error, error
        code = (
            f"import fray, socket\nctx = fray.init({spec + '&insecure=true'!r})\n"
            "print('NODES', len(ctx.node_resources()), ctx.get(ctx.create_task(socket.gethostname)))"
        )
        out = _in_host(hosts[0], code, env)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("NODES")), out.stderr[-3000:])
        assert line.split()[:2] == ["NODES", "2"] and line.split()[2] in (hosts[1].name, hosts[2].name), line


def test_a_jobs_ranks_spread_over_the_hosts(hosts: list[Host], user_workers: str, env: dict[str, str]) -> None:
    """A job's supervisor (fray.jobs.supervisor, what create_job(replicas=2, placement="spread") runs) in host 0
    with the cluster's spec: its two ranks run one on each of hosts 1 and 2, their output in the supervisor's (the
    job's log), and a failed first attempt is retried as a whole."""
    code = (
        "import os, socket, sys\n"
        "print('rank', os.environ['RANK'], 'on', socket.gethostname(), 'attempt', os.environ['FRAY_JOB_ATTEMPT'],"
        " flush=True)\n"
        "sys.exit(3 if os.environ['RANK'] == '1' and os.environ['FRAY_JOB_ATTEMPT'] == '1' else 0)\n"
    )
    argv = [PY, "-m", "fray_monarch.socket_guard", PY, "-m", "fray.jobs.supervisor", "--replicas", "2", "--retries",
            "1", "--placement", "spread", "--rank-resources", json.dumps({"CPU": 1}), "--", PY, "-c", code]  # fmt: skip
    done = hosts[0].run(argv, timeout=300, env={**env, "FRAY_BACKEND": user_workers}, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    lines = [line for line in done.stdout.splitlines() if "] rank " in line and "attempt 2" in line]
    assert {line.split(" on ")[1].split()[0] for line in lines} == {hosts[1].name, hosts[2].name}
    assert "[fray] attempt 2 of 2 (the last failed: rank 1 exited with code 3)" in done.stdout
