"""A job's ranks (`fray job submit --replicas N`, fray.jobs.supervisor on one host) rendezvous through a TCPStore
that the supervisor serves on loopback alone, not through the one torch's env:// makes rank 0 serve on every
interface (no authentication: anyone who reaches the host could use it). Real ranks, real torch.distributed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

RANKS = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")  # env://, as a job's ranks rendezvous
    total = torch.ones(1)
    dist.all_reduce(total)
    port = int(os.environ["MASTER_PORT"])
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                listening.add(local.rsplit(":", 1)[0])
    if dist.get_rank() == 0:
        print("LISTEN", ",".join(sorted(listening)), "SUM", int(total.item()), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_a_jobs_ranks_rendezvous_on_loopback_alone() -> None:
    """`fray job submit --replicas N`: torch's env:// rendezvous made rank 0 serve its TCPStore, which has no
    authentication, on every interface ([::]); the supervisor serves it on 127.0.0.1 alone."""
    pytest.importorskip("torch.distributed", reason="torch is not installed (the rendezvous is torch.distributed's)")
    done = subprocess.run(
        [sys.executable, "-m", "fray.jobs.supervisor", "--replicas", "2", "--", sys.executable, "-c", RANKS],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if "LISTEN" in line)
    listening = line.split("LISTEN ")[1].split(" SUM")[0].split(",")
    assert listening == ["0100007F"], f"the rendezvous store listens on {listening} (hex), not 127.0.0.1 alone"
    assert line.endswith("SUM 2")
