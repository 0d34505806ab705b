"""What monarch's actors and groups hold of their hosts: a claim on a general process's share (CPUs, memory,
custom resources: tasks there see less room) and GPUs (tasks hold theirs in TaskScheduler._place_gpu_task).

GPUs are not in a worker process's share of its host: each host's devices are held one by one (`ProcessPool.devices`,
a fray.runtime.gpus.DevicePool per host), so a task or actor may hold as many as one host has. General processes are
pinned to devices (ProcessPool.pinned); work holding devices runs in a process that sees them: a general one whose
devices can hold it, else a process of its own started seeing exactly the devices chosen. Monarch places actors and
groups at once (there is no queue for them), so one whose devices are all held by other work now is refused,
rather than share a device that another holds.
"""

from __future__ import annotations

from fray.backend import fits, no_gpus_env, process_env
from fray.errors import InfeasibleResourcesError
from fray_monarch.driver.actor_rec import ActorRec
from fray_monarch.driver.proc_rec import Proc, local_part
from fray_monarch.driver.processes import ProcessPool

__all__ = ["ActorHolds"]

Held = tuple[int, ...]


class ActorHolds:
    """What actors hold of `pool`'s hosts (under the controller's lock)."""

    def __init__(self, pool: ProcessPool) -> None:
        self.pool = pool

    def claim(self, rec: ActorRec, proc: Proc) -> None:
        """Under the lock: rec's resources are taken from proc's share of its host (tasks there see less room);
        those of an actor asking more than one process's share, from the free shares of all of proc's host's
        general processes while they have room (else from proc's alone: monarch does not queue actors)."""
        local = local_part(rec.resources)
        if not fits(self.pool.share, local):
            reserved = self.pool.reserve(proc.host, local)
            if reserved is not None:
                rec.reserved = reserved
                return
        rec.claim = proc
        self.pool.claim(proc, local)

    def unclaim(self, rec: ActorRec, keep_gpus: bool = False) -> None:
        """rec's claim is given back, and its GPUs unless `keep_gpus` (an SPMD group restarting holds them: its
        members' environments name them)."""
        proc, rec.claim = rec.claim, None
        if proc is not None:
            self.pool.unclaim(proc, local_part(rec.resources))
        self.pool.unreserve(rec.reserved)
        rec.reserved = []
        if not keep_gpus:
            self.give_back_gpus(rec)

    def give_back_gpus(self, rec: ActorRec) -> None:
        """Under the lock: the devices rec held are free again."""
        if rec.proc is not None:
            self.give_back(rec.proc.host, rec.gpus, rec.resources.get("GPU", 0.0))
        rec.gpus = ()

    def claim_on_host(self, rec: ActorRec, host: int) -> None:
        """Under the lock: claim an actor's resources from the general process of `host` with the most room for
        them (an actor with its own process still counts against its host's CPUs)."""
        if (rec.claim is not None and rec.claim.alive) or rec.reserved:
            return
        pool = self.pool.general(host) or self.pool.general()
        if not pool:
            return
        fitting = [p for p in pool if p.fits_at_all(local_part(rec.resources))] or pool
        self.claim(rec, max(fitting, key=lambda p: (p.free_capacity.get("CPU", 0.0), -len(p.actors))))

    def free_for(self, amount: float) -> bool:
        """Some live host has devices free for a request of `amount` GPUs now."""
        return not amount or any(self.pool.devices[h].choose(amount) for h in self.pool.live_hosts())

    def refuse(self, what: str, amount: float) -> InfeasibleResourcesError:
        return InfeasibleResourcesError(
            f"{what} asks for GPU={amount:g}, but the GPUs of this context's hosts are held by other actors and "
            "tasks now, and the monarch backend does not queue actors and groups until they are free: kill an "
            "actor that holds one, wait for tasks that do, or ask for less"
        )

    def for_actor(self, amount: float, owner: str, cpus: float | None) -> tuple[Proc, Held, bool] | None:
        """Devices for an actor: on the least loaded general process that sees the devices its host would give
        (fractions pack onto the fullest device), else on a fresh process of its own (`owner`: the actor's id)
        seeing exactly the devices chosen. (process, devices, whether the process is its own); None if no live
        host has them free."""
        for host in self.pool.live_hosts():
            devices = self.pool.devices[host]
            best = devices.choose(amount)
            if not best:
                continue
            for proc in sorted(self.pool.general(host), key=lambda p: (len(p.actors), len(p.outstanding))):
                if set(best) <= set(proc.gpus):
                    return proc, devices.take(amount, among=best) or (), False
            held = devices.take(amount, among=best) or ()
            return self.pool.spawn(host, dedicated=owner, cpus=cpus, gpus=held), held, True
        return None

    def again(self, host: int, amount: float, previous: Held) -> Held:
        """A restarted SPMD member's devices: the ones its env names (its group's restart freed them all just
        now), else whichever its host has free."""
        devices = self.pool.devices[host]
        return devices.take(amount, among=previous) or devices.take(amount) or ()

    def for_group(
        self,
        hosts: list[int],
        amount: float,
        envs: list[dict[str, str]],
        what: str,
        prefer: list[Held] | None = None,
    ) -> list[Held]:
        """Each member's devices on its host (`hosts`: by rank), for members that ask for GPUs; each member sees
        its host's members' devices in rank order (so that LOCAL_RANK indexes its own, as under torchrun) and
        FRAY_GPUS names its own (written into `envs`); members that ask for none see none. `prefer`: by rank, the
        devices to take where they are free (a group placed again keeps what it can). All or nothing:
        InfeasibleResourcesError if one cannot."""
        if not amount:
            for env in envs:  # (else a member would see, and could start CUDA on, every device of its host)
                env.update(no_gpus_env(self.pool.gpus))
            return [() for _ in hosts]
        held: list[Held] = []
        for rank, host in enumerate(hosts):
            pool, wanted = self.pool.devices[host], prefer[rank] if prefer is not None else ()
            devices = (wanted and pool.take(amount, among=wanted)) or pool.take(amount)
            if not devices:
                for h, taken in zip(hosts, held, strict=False):
                    self.give_back(h, taken, amount)
                raise self.refuse(f"actor group {what} ({len(hosts)} members)", amount)
            held.append(devices)
        for rank, host in enumerate(hosts):
            seen = [d for r, h in enumerate(hosts) if h == host for d in held[r]]
            envs[rank] = {**envs[rank], **process_env(held[rank], self.pool.gpus, visible=seen)}
        return held

    def give_back(self, host: int, held: Held, amount: float) -> None:
        if held:
            self.pool.devices[host].give(held, amount)
