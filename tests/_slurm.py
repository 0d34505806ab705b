"""A real Slurm cluster over namespaced hosts (see _netns): munged and slurmctld in the controller host, one slurmd
per host, all of them configured from files in a private work directory (nothing under /etc/slurm is used).

Clients (sbatch, srun, squeue, ...) must run inside one of the hosts, the only places from which the controller's
address is reachable: `SlurmCluster.run` does that, or pass `env()` to `Host.run` yourself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from _netns import Host

SBIN = "/usr/sbin"
IDLE_WAIT = 60.0
PARTITION = "fray"
URGENT = "urgent"  # with preemption: a partition of the same nodes whose jobs preempt the default one's (requeued)


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or None if it can (namespaced hosts aside)."""
    for daemon in ("munged", "slurmctld", "slurmd"):
        if not os.access(f"{SBIN}/{daemon}", os.X_OK):
            return f"slurm tests need {SBIN}/{daemon}, not found (apt install slurm-wlm munge)"
    for client in ("sbatch", "squeue", "scancel", "sinfo", "srun"):
        if shutil.which(client) is None:
            return f"slurm tests need `{client}`, not found (apt install slurm-client)"
    return None


def require_slurm() -> None:
    """Skip the calling test, naming why, where a Slurm cluster cannot be started."""
    import pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


def _config(
    hosts: Sequence[Host], controller: Host, workdir: Path, munge_socket: Path, spool: Path, preemption: bool = False
) -> str:
    nodes = ",".join(h.name for h in hosts)
    # Preemption as a site configures it for preemptible capacity: a job of the higher tier's partition takes the
    # nodes of the default partition's jobs, which Slurm requeues (they run again once the nodes are free).
    preempting = (
        (
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            f"PartitionName={URGENT} Nodes={nodes} Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO "
            "PriorityTier=10",
        )
        if preemption
        else ()
    )
    return "".join(
        f"{line}\n"
        for line in (
            "ClusterName=fray",
            f"SlurmctldHost={controller.name}({controller.address})",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",  # every slurmd has a network namespace of its own: one port number serves all
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={workdir / 'state'}",
            f"SlurmdSpoolDir={spool / '%n'}",
            f"SlurmctldPidFile={workdir / 'slurmctld.pid'}",
            f"SlurmdPidFile={workdir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={workdir / 'slurmctld.log'}",
            f"SlurmdLogFile={workdir / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=20",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=300",  # a finished job's state stays visible (`squeue -t all`) for 5 minutes
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # All hosts share this machine's cores: each node claims them all, and config_overrides makes slurmd
            # register what is configured here even where it detects another socket/core layout.
            "SlurmdParameters=config_overrides",
            *(f"NodeName={h.name} NodeAddr={h.address} CPUs={os.cpu_count() or 1} State=UNKNOWN" for h in hosts),
            f"PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            *preempting,
        )
    )


class SlurmCluster:
    """A running Slurm cluster, a node per host; `close()` cancels every job and stops every daemon."""

    def __init__(self, hosts: Sequence[Host], workdir: Path, controller: Host, preemption: bool = False) -> None:
        self.hosts = list(hosts)
        self.preemption = preemption
        self.controller = controller
        self.workdir = workdir
        self.partition = PARTITION
        self.nodes = [h.name for h in hosts]
        self.conf = workdir / "slurm.conf"
        self.munge_socket = workdir / "munge" / "munge.socket"
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}  # by log name
        # slurmstepd binds a Unix socket in the spool directory (`<spool>/<node>_<job>.<step>`), and such a path
        # holds at most 108 bytes: under a deep work directory (pytest's tmp_path) the batch step failed to start
        # ("Unix socket path ... is too long", then the job held as "launch failed requeued held").
        self.spool = Path(tempfile.mkdtemp(prefix="frslurm-", dir="/tmp"))

    def env(self) -> dict[str, str]:
        """What a client's environment needs on top of the usual (slurm.conf's AuthInfo names the munge socket)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(
        self, cmd: Sequence[str], host: Host | None = None, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command run inside `host` (default: the controller), its output captured as text."""
        done = (host or self.controller).run(
            cmd, timeout, env={**os.environ, **self.env()}, capture_output=True, text=True, cwd=self.workdir
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}\n{self.log_tails()}")
        return done

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for an error message."""
        tails = []
        for log in sorted(self.workdir.glob("*.out")):
            if text := log.read_text(errors="replace").splitlines()[-lines:]:
                tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails)

    def _daemon(self, host: Host, cmd: Sequence[str], log: str) -> None:
        with open(self.workdir / log, "ab") as out:
            self.daemons[log] = host.popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=self.workdir)

    def start(self) -> None:
        self.munge_socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.workdir / "munge" / "munge.key"
        key.unlink(missing_ok=True)
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        (self.workdir / "state").mkdir(exist_ok=True)
        for host in self.hosts:
            (self.spool / host.name).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            _config(self.hosts, self.controller, self.workdir, self.munge_socket, self.spool, self.preemption)
        )
        # Found next to slurm.conf. slurmd initialises a cgroup plugin even with proctrack/linuxproc and task/none,
        # and autodetection fails in a host, whose fresh /sys has no /sys/fs/cgroup ("No filesystem mounted on
        # /sys/fs/cgroup", then "Unable to initialize cgroup plugin"); a named plugin is loaded but never used.
        (self.workdir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        munge = self.munge_socket.parent
        # A path-named unix socket is not bound to a network namespace: one munged serves every host.
        # --force: without it munged refuses a socket whose parent directories are not all world-executable, and
        # pytest's tmp_path sits under a 0700 directory; every client here runs as root and can reach it anyway.
        munged = [f"{SBIN}/munged", "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}"]
        files = (f"--{kind}-file={munge / ('munged.' + kind)}" for kind in ("pid", "log", "seed"))
        self._daemon(self.controller, [*munged, *files], "munged.out")
        self._wait(lambda: self.munge_socket.exists(), 10.0, "munged did not create its socket")
        self._daemon(self.controller, [f"{SBIN}/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        for host in self.hosts:
            # Each slurmd takes its node name from its host's own hostname (UTS namespace), no `-N` needed.
            self._daemon(host, [f"{SBIN}/slurmd", "-D", "-f", str(self.conf)], f"slurmd-{host.name}.out")
        self._wait(self._all_idle, IDLE_WAIT, f"not every node of {self.nodes} became idle")

    def _all_idle(self) -> bool:
        done = self.run(["sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %T"], timeout=30, check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for log, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(f"the daemon of {log} exited {daemon.returncode}:\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout}s:\n{self.log_tails()}")
            time.sleep(0.2)

    def close(self) -> None:
        """Cancel every job, stop the daemons, and remove the work directory's files."""
        if all(d.poll() is None for d in self.daemons.values()) and len(self.daemons) == 2 + len(self.hosts):
            self.run(["scancel", f"--partition={self.partition}"], timeout=20, check=False)
            if self.preemption:
                self.run(["scancel", f"--partition={URGENT}"], timeout=20, check=False)
            # Bounded: a job step that outlives its slurmd still dies with its host's namespace.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run(["squeue", "-h"], timeout=20, check=False).stdout.strip():
                time.sleep(0.2)
        for daemon in self.daemons.values():
            daemon.kill()
        for daemon in self.daemons.values():
            daemon.wait(10)
        self.daemons = {}
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.spool, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_slurm(
    hosts: Sequence[Host], workdir: Path, controller: Host | None = None, preemption: bool = False
) -> SlurmCluster:
    """A Slurm cluster of one node per host (partition "fray"), every node idle; use it in a `with` or `close()` it.
    preemption: a job of partition "urgent" (the same nodes) preempts those of "fray", which Slurm requeues."""
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = SlurmCluster(hosts, workdir, controller or hosts[0], preemption)
    try:
        cluster.start()
    except BaseException:
        cluster.close()
        raise
    return cluster
