"""The Slurm allocation that holds a context's hosts (`job=slurm`), as the context watches it: whether the scheduler
took it (preempted and requeued, or ended it) rather than fray, and the hosts of its next run once it was requeued.

A preemption signals every process of the allocation, so every host goes at once; Slurm then requeues the job
(PreemptMode=REQUEUE; `scontrol requeue` does the same by hand), counting it in the job's restart count, and runs
its batch script again when nodes are free: the host workers start again, on the nodes of that run."""

from __future__ import annotations

import time
from typing import Any

from fray.errors import FrayError

__all__ = ["SlurmAllocation", "run_identity", "run_port"]

POLL = 0.5  # seconds between looks at squeue while waiting
ENDED = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}
)


def run_port(port: int, restarts: int) -> int:
    """The port of a host worker in the run of a requeued allocation that Slurm counts `restarts`: one more each
    run. The driver's Monarch keeps its channel to each address it dialled, and a new worker at the last run's
    address refuses that channel's messages (their sequence is the old worker's)."""
    return 1024 + (port - 1024 + restarts) % (65536 - 1024)


def run_identity(proc_id: Any, restarts: int) -> Any:
    """The service identity (a Monarch ProcId) of a host worker in the run of a requeued allocation that Slurm
    counts `restarts` (SLURM_RESTART_COUNT): each run's workers are new processes, which the driver's Monarch must
    not take for the last run's (attaching to those under their old identities times out)."""
    if restarts <= 0:
        return proc_id
    from monarch._rust_bindings.monarch_hyperactor.proc import ProcId, Uid

    value = (int(proc_id.uid.instance_value) + (restarts << 32)) & ((1 << 64) - 1)  # (ranks differ by 1)
    return ProcId(Uid.instance_from_value(value, str(proc_id.uid.label)))


class SlurmAllocation:
    """One Slurm job (a job_launch.FraySlurmJob, applied): its id, and the run of it whose hosts the context holds
    (Slurm's restart count: 0 for the first run, one more for each requeue)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.job_id = str(job._slurm_job_id)
        self.nodes = int(sum(job._meshes.values()))
        self.released = False  # fray ended it (the context's shutdown): no preemption
        seen = self.state()
        self.restarts = seen[1] if seen is not None else 0

    def state(self) -> tuple[str, int] | None:
        """The job's state and restart count as squeue shows them; None where squeue does not list it."""
        info = self.job._get_job_info_json(self.job_id)
        if not info:
            return None
        states = [str(s) for s in info.get("job_state", [])]
        return (states[0] if states else "UNKNOWN"), int(info.get("restart_cnt") or 0)

    def taken(self) -> tuple[str, bool] | None:
        """How the scheduler took this run of the allocation, and whether it runs again (requeued); None while it
        runs as it did, or where fray ended it."""
        if self.released:
            return None
        seen = self.state()
        if seen is None:
            return f"the Slurm job {self.job_id} of its hosts is gone from squeue", False
        state, restarts = seen
        if restarts > self.restarts or "REQUEUE" in state:
            return f"the Slurm job {self.job_id} of its hosts was preempted and requeued by Slurm", True
        if state in ENDED:
            return f"the Slurm job {self.job_id} of its hosts ended {state} (not requeued)", False
        return None

    def ending(self) -> bool:
        """Whether Slurm is ending this run of the allocation (COMPLETING: its processes get SIGTERM, then SIGKILL
        KillWait s later), without fray's asking: what follows says whether it was requeued."""
        seen = self.state()
        return not self.released and seen is not None and seen[0] == "COMPLETING" and seen[1] == self.restarts

    def wait_requeued(self, timeout: float) -> list[str]:
        """The host names of the allocation's next run, once Slurm runs it; FrayError naming the job, its state
        and the wait if it does not run within `timeout` s, or ends."""
        start = time.monotonic()
        state = "?"
        while time.monotonic() - start < timeout:
            seen = self.state()
            if seen is not None:
                state = seen[0]
                if state in ENDED:
                    raise FrayError(f"the requeued Slurm job {self.job_id} ended {state} before it ran again")
                if state == "RUNNING" and seen[1] > self.restarts:
                    self.restarts = seen[1]
                    self.job._all_hostnames = []  # (FraySlurmJob.hostnames reads them again)
                    return [str(n) for n in self.job.hostnames(max(1.0, timeout - (time.monotonic() - start)))]
            time.sleep(POLL)
        raise FrayError(
            f"the Slurm job {self.job_id} was requeued after a preemption but did not run again within {timeout:.0f} s "
            f"(its state: {state}); its jobs are lost. The cluster's preempt_wait= option sets this wait"
        )

    def addresses(self, timeout: float) -> list[str]:
        """The host workers' addresses of the run whose hosts wait_requeued gave."""
        from monarch._src.job.service_identity import service_proc_addrs

        port = run_port(int(self.job._port), self.restarts)
        workers = [f"{self.job._scheme}://{name}:{port}" for name in self.job.hostnames(timeout)]
        identities = [run_identity(proc_id, self.restarts) for proc_id in self.job._service_proc_ids]
        return [str(a) for a in service_proc_addrs(workers, identities)]

    def release(self) -> None:
        """End the allocation (the context's shutdown): no longer watched for a preemption."""
        self.released = True
        self.job.kill()
