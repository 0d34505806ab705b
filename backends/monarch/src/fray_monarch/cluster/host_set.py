"""The hosts of one monarch context, as launchers.py finds or launches them: their addresses and who ends them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch.job import JobTrait

__all__ = ["HostSet"]


@dataclass
class HostSet:
    """The hosts of one context: their Monarch worker addresses (none: this machine only) and who holds them."""

    addresses: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each host's name or address (errors, status, routes)
    holder: str = "this machine"  # "started by you", "ssh", "slurm job 42", "process job", "fray cluster (pid N)"
    release: Callable[[], None] | None = None  # ends them; None: not this context's to end
    local: bool = True  # every host is this machine (no TCP needed to reach them)
    job: JobTrait | None = None  # a Monarch job object whose state() gives the host mesh (no addresses then)
    explain: Callable[[], str] = lambda: ""  # what the launch printed, for an error that it did not come up
    secure: bool = True  # TLS between the machines (False: plain TCP, asked for with insecure=true)
    allocation: Any = None  # job=slurm: the slurm_alloc.SlurmAllocation holding them (watched for a preemption)
