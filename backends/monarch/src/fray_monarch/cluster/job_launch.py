"""Hosts launched through Monarch's own job API (launchers.py chooses this way for `job=ssh`, `job=slurm`,
`job=process` and a Monarch job object): fray's SSHJob and SlurmJob, with fray's host worker on each host. Its own
module because Monarch's job module loads its telemetry's web and table libraries, which a context on this machine
or on hosts the user started never needs."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from monarch._src.job.job import LoginJob, ProcessState, SSHJob
from monarch._src.job.service_identity import (
    SERVICE_PROC_IDS_ENV,
    serialize_service_proc_ids,
    service_proc_addr,
    service_proc_addrs,
)
from monarch.job import JobTrait, ProcessJob, SlurmJob

from fray.backend import state_subdir, watchdog
from fray.errors import FrayError
from fray_monarch.cluster.host_set import HostSet
from fray_monarch.net import tls

__all__ = ["FraySSHJob", "FraySlurmJob", "job_object_hosts", "process_hosts", "slurm_hosts", "ssh_hosts"]

DEFAULT_PORT = 22222  # Monarch's own default for SSHJob and SlurmJob workers
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")  # never prompt: a launch must fail, not hang


class FraySSHJob(SSHJob):  # type: ignore[misc]  # Monarch is untyped
    """Monarch's SSHJob with fray's host worker, which ends when its ssh connection ends (its stdin closes): the
    driver holds the other end of that stdin, so hosts it launched go with it however it ends (Monarch's own
    `ssh -n` leaves the remote worker running when the client dies)."""

    unguarded = False  # unguarded_sockets=true: workers run without the socket guard

    def __init__(
        self, hosts: list[str], python_exe: str, ssh_args: tuple[str, ...], port: int, log_dir: str, secure: bool
    ) -> None:
        LoginJob.__init__(self)  # not SSHJob's: it fixes Monarch's transport to the host name; fray chooses it
        self._python_exe, self._ssh_args, self._port = python_exe, tuple(ssh_args), port
        self._transport = self._scheme = "tls" if secure else "tcp"
        self._service_proc_ids_by_host: dict[str, Any] = {}
        self._log_dir = log_dir
        self._clients: list[subprocess.Popen[bytes]] = []
        self.add_mesh("hosts", list(hosts))

    def _start_host(self, host: str) -> ProcessState:
        address = service_proc_addr(f"{self._scheme}://{host}:{self._port}", self._service_proc_ids_by_host[host])
        remote = [self._python_exe, "-m", "fray_monarch.worker", "--address", address, "--end-with-stdin"]
        if self.unguarded:  # the driver's spec said unguarded_sockets=true: its hosts run so too
            remote.append("--unguarded-sockets")
        if self._scheme == "tls":  # the host's identity, issued here, is the first line its worker reads
            remote.append("--identity-from-stdin")
            identity = tls.issue([host, *_addresses_of(host)])
        else:
            remote.append("--insecure")
        with open(self._log(host), "wb", opener=_private_opener) as out:
            client = subprocess.Popen(
                ["ssh", *SSH_OPTIONS, *self._ssh_args, "--", host, shlex.join(remote)],  # a host is never an option
                stdin=subprocess.PIPE,  # held by this process only (not inheritable): its end is the worker's end
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        watchdog.watch_group(client.pid)
        self._clients.append(client)
        if self._scheme == "tls" and client.stdin is not None:
            try:
                client.stdin.write(identity.to_json().encode() + b"\n")
                client.stdin.flush()
            except BrokenPipeError:
                pass  # ssh ended already: explain() tells how
        return ProcessState(client.pid, address)

    def addresses(self) -> list[str]:
        return [str(self._host_to_pid[h].channel) for h in self._meshes["hosts"]]

    def explain(self) -> str:
        """How the ssh logins that have ended went (a host worker that answers never ends its ssh)."""
        said = []
        for host, client in zip(self._meshes["hosts"], self._clients, strict=False):
            if client.poll() is not None:
                said.append(f"ssh to {host} ended with exit code {client.returncode}: {_tail(self._log(host))}")
        return "".join(f"\n  {line}" for line in said)

    def _log(self, host: str) -> str:
        return os.path.join(self._log_dir, f"ssh-{host}.log")

    def _kill(self) -> None:
        for client in self._clients:
            if client.stdin is not None:
                client.stdin.close()  # the remote worker's stdin ends: it exits, and ssh with it
        for client in self._clients:
            try:
                client.wait(timeout=10)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait(timeout=10)
            watchdog.forget_group(client.pid)
        self._clients.clear()
        self._host_to_pid.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_clients"}


class FraySlurmJob(SlurmJob):  # type: ignore[misc]
    """Monarch's SlurmJob with fray's host worker (TLS by default: Monarch's own serves plain TCP), reading its own
    job from squeue in the shape it expects. Slurm 22.05 (OpenAPI v0.0.38) differs from what SlurmJob reads in two
    ways: `squeue --job ID --json` lists every job, oldest first (SlurmJob reads the first, so it took someone
    else's old job for its own), and a job's nodes are a string with `allocated_nodes[].nodename` beside it, not
    `nodes.allocation[].name`."""

    _scheme = "tls"  # or "tcp" (insecure=true): set after construction
    unguarded = False  # unguarded_sockets=true: workers run without the socket guard

    def _submit_slurm_job(self, num_nodes: int, client_script: str | None = None) -> str:
        """The allocation, running fray's host worker on every node; its job id. The nodes share the home
        directory, and with it the user's TLS authority (each worker issues its own identity from it). sbatch's
        options are its arguments, never lines of the script: a value is one argument whatever it holds."""
        if client_script is not None:
            raise FrayError("fray attaches to Slurm hosts from its driver: Monarch's batch mode is not used")
        self._ensure_service_proc_ids(num_nodes)
        name = f"{self._job_name}_{os.getpid()}"
        output = os.path.join(self._log_dir, f"slurm_%j_{name}")
        options = [
            f"--job-name={name}",
            f"--ntasks-per-node={self._ntasks_per_node}",
            f"--nodes={num_nodes}",
            f"--output={output}.out",
            f"--error={output}.err",
            *([f"--time={self._time_limit}"] if self._time_limit else []),
            *([f"--partition={self._partition}"] if self._partition else []),
        ]
        script = [
            "#!/bin/bash",
            f"export {SERVICE_PROC_IDS_ENV}={shlex.quote(serialize_service_proc_ids(self._service_proc_ids))}",
            "srun "
            + shlex.join([self._python_exe, "-m", "fray_monarch.worker", "--slurm", f"{self._scheme}:{self._port}"])
            + ("" if self._scheme == "tls" else " --insecure")
            + (" --unguarded-sockets" if self.unguarded else ""),
        ]
        try:
            done = subprocess.run(
                ["sbatch", *options], input="\n".join(script) + "\n", capture_output=True, text=True, timeout=120
            )
        except subprocess.TimeoutExpired:
            raise FrayError("sbatch did not answer within 120 s: is slurmctld reachable (`sinfo`)?") from None
        words = done.stdout.split()
        if done.returncode != 0 or "Submitted batch job" not in done.stdout:
            raise FrayError(f"sbatch failed (exit code {done.returncode}): {done.stderr.strip() or done.stdout}")
        return words[words.index("job") + 1]

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        import json

        try:
            out = subprocess.run(["squeue", "--job", job_id, "--json"], capture_output=True, text=True, check=True)
            jobs = json.loads(out.stdout or "{}").get("jobs", [])
        except (subprocess.CalledProcessError, ValueError, OSError):
            return None
        for job in jobs:
            if str(job.get("job_id")) == str(job_id):
                return _newer_shape(dict(job))
        return None

    def hostnames(self, timeout: float) -> list[str]:
        if not getattr(self, "_all_hostnames", None):
            job_id = self._slurm_job_id
            assert job_id is not None, "apply() first"
            self._all_hostnames = self._wait_for_job_start(job_id, sum(self._meshes.values()), timeout=int(timeout))
        return [str(name) for name in getattr(self, "_all_hostnames", [])]

    def addresses(self, timeout: float) -> list[str]:
        workers = [f"{self._scheme}://{name}:{self._port}" for name in self.hostnames(timeout)]
        return [str(a) for a in service_proc_addrs(workers, self._service_proc_ids)]


def _newer_shape(job: dict[str, Any]) -> dict[str, Any]:
    """A Slurm 22.05 squeue job in the shape of later Slurm releases (which SlurmJob reads)."""
    if isinstance(job.get("job_state"), str):
        job["job_state"] = [job["job_state"]]
    resources = job.get("job_resources") or {}
    if isinstance(resources.get("nodes"), str):
        names = [n["nodename"] for n in resources.get("allocated_nodes", []) if "nodename" in n]
        names = names or [n for n in resources["nodes"].split(",") if n]
        job["job_resources"] = {**resources, "nodes": {"allocation": [{"name": n} for n in names]}}
    return job


def _addresses_of(host: str) -> list[str]:
    """The addresses `host` resolves to here (its certificate names them too: a peer may dial one of them)."""
    try:
        return list(dict.fromkeys(str(i[4][0]) for i in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))
    except OSError:
        return []


def _tail(path: str, size: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return "(no output)"
    return " | ".join(text.splitlines()[-4:]) or "(no output)"


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def _log_dir(kind: str) -> str:
    """Where launch logs go (ssh clients' output, Slurm's job output): the state directory, which a cluster's
    hosts usually share through the home directory. Private to this user."""
    return str(state_subdir("monarch", kind))


def _release(job: Any, forget: Callable[[], None]) -> Callable[[], None]:
    def release() -> None:
        try:
            if isinstance(job, JobTrait):
                job.kill()
            else:
                job.release()  # a SlurmAllocation: ended by fray, not preempted
        finally:
            forget()

    return release


_HOST_NAME = re.compile(r"[A-Za-z0-9_.%@:\[\]][A-Za-z0-9_.%@:\[\]-]*")  # [user@]host: never an option, path or space


def ssh_hosts(opts: dict[str, Any]) -> HostSet:
    names = opts.get("hosts")
    if not names or not isinstance(names, list) or any("://" in n for n in names):
        raise ValueError("job=ssh takes hosts=NAME,NAME (the machines to log in to), e.g. job=ssh&hosts=h2,h3")
    for name in names:
        if not _HOST_NAME.fullmatch(name):
            raise ValueError(
                f"job=ssh: {name!r} is not a host name ([user@]host: letters, digits and . _ - @ : % [ ], not starting "
                "with '-'); pass ssh options with ssh_options=, never as a host"
            )
    python = str(opts.get("python", sys.executable))
    secure = not opts.get("insecure", False)
    ssh_args = tuple(shlex.split(opts.get("ssh_options", "")))
    job = FraySSHJob(names, python, ssh_args, opts.get("port", DEFAULT_PORT), _log_dir("ssh"), secure)
    job.unguarded = bool(opts.get("unguarded_sockets", False))
    job.apply()
    release = _release(job, lambda: None)
    return HostSet(job.addresses(), names, "ssh", release, local=False, explain=job.explain, secure=secure)


def slurm_hosts(opts: dict[str, Any], timeout: float) -> HostSet:
    nodes = int(opts.get("nodes", 1))
    for option in ("time", "partition"):
        value = opts.get(option)
        if value is not None and (not isinstance(value, str) or not value.isprintable() or not value.strip()):
            raise ValueError(f"job=slurm: {option}={value!r} is not one printable sbatch value (no newline)")
    job = FraySlurmJob(
        {"hosts": nodes},
        python_exe=str(opts.get("python", sys.executable)),
        monarch_port=opts.get("port", DEFAULT_PORT),
        job_name="fray",
        time_limit=opts.get("time"),
        partition=opts.get("partition"),
        log_dir=_log_dir("slurm"),
        job_start_timeout=int(timeout),
    )
    secure = not opts.get("insecure", False)
    job._scheme = "tls" if secure else "tcp"
    job.unguarded = bool(opts.get("unguarded_sockets", False))
    if secure:
        tls.authority()  # made here if there is none, before the nodes look for it in the shared home directory
    job.apply()
    job_id = str(job._slurm_job_id)
    cancel = ["scancel", job_id]
    watchdog.watch_command(cancel)  # a driver killed by SIGKILL cannot cancel its allocation itself
    try:
        addresses = job.addresses(timeout)
    except Exception as exc:
        job.kill()
        watchdog.forget_command(cancel)
        raise FrayError(f"the Slurm job {job_id} for {nodes} node(s) did not start: {exc}") from exc
    from fray_monarch.cluster.slurm_alloc import SlurmAllocation

    allocation = SlurmAllocation(job)
    return HostSet(
        addresses,
        job.hostnames(timeout),
        f"slurm job {job_id}",
        _release(allocation, lambda: watchdog.forget_command(cancel)),
        local=False,
        secure=secure,
        allocation=allocation,
    )


def process_hosts(opts: dict[str, Any]) -> HostSet:
    count = opts.get("hosts", 1)
    if not isinstance(count, int):
        raise ValueError("job=process takes hosts=N (how many host workers to start on this machine)")
    job = ProcessJob({"hosts": count})
    job.apply()
    pids = [state.pid for state in job._host_to_pid.values()]
    for pid in pids:  # each worker leads its own session and group; its processes die with it
        watchdog.watch_group(pid)
    sockets = job._tmpdir  # the job's socket directory: its kill() removes it, the watchdog if fray is killed
    if sockets is not None:
        watchdog.watch_path(sockets)

    def forget() -> None:
        for pid in pids:
            watchdog.forget_group(pid)
        if sockets is not None:
            watchdog.forget_path(sockets)

    addresses = [job._host_to_pid[f"hosts_{i}"].channel for i in range(count)]
    return HostSet(addresses, [f"process {i}" for i in range(count)], "process job", _release(job, forget))


def job_object_hosts(job: Any) -> HostSet:
    """A Monarch job the user made: applied here (and then ended with the context) unless it runs already."""
    if not isinstance(job, JobTrait):
        raise ValueError(f"job= takes ssh, slurm, process or local, or a Monarch job object; got {job!r}")
    release = None
    if not job.active:
        job.apply()
        release = job.kill
    return HostSet([], [], type(job).__name__, release, local=False, job=job, secure=False)  # the job's transport
