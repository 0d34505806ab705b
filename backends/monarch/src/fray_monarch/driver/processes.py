"""The worker processes of one context: a Monarch proc mesh each (a replacement is a fresh mesh: never spawn on
one that lost a process), their share of their host's resources, and how their deaths are learnt."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from fray.backend import (
    EPS,
    RECORDER,
    DevicePool,
    HostGpus,
    Identity,
    Kind,
    add,
    fits,
    host_gpus,
    process_env,
    subtract,
    worker_env_defaults,
)
from fray.errors import FrayError
from fray_monarch.core import runtime, tempdirs
from fray_monarch.core.actor_classes import worker_host
from fray_monarch.core.import_path import driver_import_path
from fray_monarch.core.protocol import ProcInfo, StoreConfig, WorkerSetup
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.proc_rec import SIZED_ENV, EnvKey, Proc, gpus_of_key, sized_capacity
from fray_monarch.net import network
from fray_monarch.net.lifeline import LifelineServer

WorkerHost = worker_host()  # fray_monarch.workers.hosts.WorkerHost, by name (core/actor_classes.py)

MAX_ENV_PROCS = 4  # processes kept for tasks with their own env vars
PROBE_AGAIN = 0.3  # seconds between the two probes that say a host still answers (host_lost)

STOP_TIMEOUT = 20.0  # seconds a shutdown waits for Monarch to stop its worker processes


class ProcessPool:
    """The live worker processes (under the controller's lock). `on_death(proc, exc)` is told of each death, once,
    until the pool is closed."""

    def __init__(
        self,
        ids: Ids,
        lock: threading.RLock,
        hosts: list[Any],
        procs_per_host: int,
        host_resources: dict[str, float],
        stores: StoreConfig,
        host_mesh: Any,
        log_file: str | None,
        on_death: Callable[[Proc, BaseException | None], None],
        host_addresses: list[str] | None = None,
        gpus: HostGpus | None = None,
    ) -> None:
        self.ids = ids
        self.lock = lock
        self.hosts = hosts
        self.host_mesh = host_mesh  # all attached hosts as one mesh (a group spread over them is one mesh)
        self.procs_per_host = procs_per_host
        # A general process's share of its host: all but its GPUs, which are held device by device per host
        # (`devices`: a task or actor may hold as many as one host has, not a process's share of them).
        self.share = {k: v / procs_per_host for k, v in host_resources.items() if k != "GPU"}
        if not host_resources.get("GPU"):
            gpus = HostGpus()
        elif gpus is None:
            gpus = host_gpus(host_resources["GPU"])
        self.gpus: HostGpus = gpus
        self.host_gpu_count = float(len(self.gpus))
        self.devices = [DevicePool(self.gpus.ids) for _ in hosts]  # attached hosts are taken to be alike
        self.stores = stores
        self.log_file = log_file
        self.on_death = on_death
        self.procs: list[Proc] = []
        self.started_here: list[Identity] = []  # every process of this machine it spawned (ended at shutdown)
        self.host_addresses = list(host_addresses or [])  # each host worker's address (probed: host_lost)
        self.lost_hosts: dict[int, str] = {}  # host -> why it counts as lost; a lost host is never used again
        self.doubted: set[int] = set()  # hosts where a process died unexpectedly, not probed since (host_lost)
        self.closed = False  # nothing is spawned, and no death is reported, any more
        self.coord: Any = None  # the coordinator actor their requests go to (start)
        self.sys_path = driver_import_path()  # (what each worker takes of it: import_path.take)
        # The TMPDIR of the processes spawned on this host (Monarch's socket directories, the tasks' temp files):
        # removed at shutdown, or with the driver's private directory by the watchdog.
        self._secret = secrets.token_bytes(32)  # proofs of the processes' keys (proof())
        tempdirs.private_dir()  # (for the life of the process)
        self.tmpdir = tempdirs.context_dir() if stores.host_ids == ("local",) else None
        # processes on other hosts end with this driver (the watchdog cannot reach them): see net/lifeline.py
        remote = stores.host_ids != ("local",)
        self.lifeline = LifelineServer(stores.driver_bind, self._lifeline_closed) if remote else None

    def start(self, coord: Any) -> None:
        """Spawn the general processes (their requests go to the coordinator actor `coord`) and wait until each
        answers."""
        self.coord = coord
        with self.lock:
            for host in range(len(self.hosts)):
                for index in range(self.procs_per_host):
                    self.spawn(host, gpus=self.pinned(index))
            procs = list(self.procs)
        for proc in procs:
            proc.worker.ping.call_one().get(timeout=120)

    # ------------------------------------------------------------ spawning
    def boot(self, env: dict[str, str]) -> dict[str, Any]:
        """spawn_procs' arguments for every process mesh of this context (its workers, its SPMD groups): on this
        host, TMPDIR is the context's directory, where each process's Monarch socket directory goes (only a clean
        exit removes one: a killed process's would stay in the user's TMPDIR, 2 for each SPMD group), and the
        processes start with `env`: their worker defaults (OMP_NUM_THREADS) must be there before the process loads
        numpy, whose BLAS reads them once, as it loads. (A process on another machine gets them as its WorkerHost
        starts: its numpy is loaded by then, with a BLAS thread per core.)"""
        return {"bootstrap_command": tempdirs.bootstrap_command(self.tmpdir, env)} if self.tmpdir else {}

    def spawn(
        self,
        host: int,
        env_key: EnvKey = (),
        dedicated: str = "",
        cpus: float | None = None,
        gpus: tuple[int, ...] = (),
        member: bool = False,
    ) -> Proc:
        """Under the lock: a fresh proc mesh of one worker process: a general one, one for tasks with env vars
        (env_key; GPUs in it as gpu_env_key puts them), or the process of one actor (dedicated: the actor's id; it
        runs no tasks and holds none of the host's share; cpus: the CPUs that actor holds). gpus: the devices it
        sees (CUDA_VISIBLE_DEVICES, set before its first CUDA call). member: the process of a group member coming
        back, whose view of the GPUs comes with its own env at its __init__, as when its group was made: the
        process sets none of its own, which would race that env (both are published as the process starts)."""
        key = self.ids.proc()
        capacity = {} if dedicated else sized_capacity(env_key) or dict(self.share)
        seen = gpus or gpus_of_key(env_key)
        env = {**({} if member else self.visible_env(seen)), **dict(env_key)}
        boot = self.boot({**worker_env_defaults(cpus), **env})
        mesh = self.hosts[host].spawn_procs(per_host={"procs": 1}, name=f"fray_{self.ids.key}_{key}", **boot)
        worker = mesh.spawn("fray_worker", WorkerHost, self.setup(host, key, capacity), env, cpus)
        proc = Proc(key, host, mesh, worker, capacity, env_key=env_key, dedicated=dedicated, gpus=seen)
        self.adopt(proc)
        return proc

    def pinned(self, index: int) -> tuple[int, ...]:
        """The GPUs the `index`-th general process of a host sees: one device each where there are as many
        processes as devices or more (Monarch's one process per GPU), else every procs-th device."""
        ids = self.gpus.ids
        if not ids:
            return ()
        if self.procs_per_host >= len(ids):
            return (ids[index % len(ids)],)
        return ids[index :: self.procs_per_host]

    def visible_env(self, gpus: tuple[int, ...]) -> dict[str, str]:
        """What a process that sees `gpus` starts with. A process of a GPU host that sees none of them is shown
        none (CUDA_VISIBLE_DEVICES empty), so that no work there uses a device another holds."""
        if not self.gpus.ids:
            return {}
        return self.gpus.env(gpus) if gpus else {"CUDA_VISIBLE_DEVICES": ""}

    def gpu_env_key(self, env_key: EnvKey, gpus: tuple[int, ...]) -> EnvKey:
        """The env key of a process for tasks holding exactly `gpus` (more devices than a general process sees,
        or with env vars of their own): the task's variables and the devices' (fray.runtime.gpus.process_env)."""
        return tuple(sorted({**dict(env_key), **process_env(gpus, self.gpus)}.items()))

    def adopt(self, proc: Proc) -> None:
        """Under the lock: a process spawned for this pool (by spawn, or in a group's mesh), watched from now on."""
        self.procs.append(proc)
        RECORDER.record(Kind.WORKER_START, proc.key, proc.role, {"host": proc.host})
        runtime.on_done(proc.worker.watch.call_one(), partial(self._died, proc))
        runtime.on_done(proc.worker.ping.call_one(), partial(self._watch_pid, proc))

    def proof(self, proc_key: str) -> str:
        """What only the process `proc_key` was given (in its WorkerSetup): an HMAC of its key under this pool's
        secret. Monarch 0.7 does not tell an endpoint who sent a message; this is how a request proves it."""
        return hmac.new(self._secret, proc_key.encode(), hashlib.sha256).hexdigest()

    def proven(self, credential: str) -> str:
        """The process key a request's credential ("<proc_key>:<proof>") proves; FrayError if it proves none."""
        proc_key, _, proof = credential.rpartition(":")
        if not proc_key or not hmac.compare_digest(proof.encode(), self.proof(proc_key).encode()):
            raise FrayError("refused: a request that does not prove which worker process of this context sent it")
        return proc_key

    def setup(self, host: int, proc_key: str, capacity: dict[str, float] | None = None) -> WorkerSetup:
        """What a process (or an actor host in it) on `host` starts with."""
        return WorkerSetup(
            ctl_key=self.ids.key,
            proc_key=proc_key,
            coord=self.coord,
            capacity=dict(self.share) if capacity is None else capacity,
            nodes=self.node_resources(),
            sys_path=self.sys_path,
            host_id=self.stores.host_ids[host],
            bind_host=self.stores.bind_hosts[host],
            store_budget=self.stores.budget,
            inline_limit=self.stores.inline_limit,
            transport=self.stores.transport,
            log_file=self.log_file,
            lifeline=None if self.lifeline is None else (self.lifeline.address, self.lifeline.key_for(proc_key)),
            driver_host=self.stores.driver_bind,
            credential=f"{proc_key}:{self.proof(proc_key)}",
        )

    def ensure_env(self, env_key: EnvKey, host: int = 0) -> None:
        """Under the lock: a task with env vars runs only in a process started with exactly those vars set (so they
        are real process environment, seen by C code and subprocesses, and leak into no other task): start one on
        `host` if none runs, retiring an idle one beyond MAX_ENV_PROCS."""
        if not env_key or any(p.env_key == env_key and p.host == host for p in self.procs):
            return
        env_procs = [p for p in self.procs if p.env_key]
        if len(env_procs) >= MAX_ENV_PROCS:
            idle = [p for p in env_procs if not p.outstanding]
            if idle:
                self.retire(idle[0])
        self.spawn(host, env_key)

    def retire(self, proc: Proc) -> None:
        """Under the lock: stop a process that is no longer needed."""
        self.forget(proc)
        runtime.on_done(proc.mesh.stop(), ignore)

    def forget(self, proc: Proc) -> bool:
        """Under the lock: proc is gone (or going): not one of the pool's any more. False if it was not."""
        if not proc.alive:
            return False
        proc.alive = False
        if proc in self.procs:
            self.procs.remove(proc)
        return True

    # ------------------------------------------------------------ deaths
    def _lifeline_closed(self, key: str) -> None:
        """A process on another host closed its lifeline: it ended, or its host is gone (seen at once; Monarch's
        supervision took up to 30 s to report a host whose processes were killed)."""
        with self.lock:
            proc = self.by_key(key)
        if proc is not None:
            self._died(proc, None, RuntimeError("its connection to the driver closed: its process or host is gone"))

    def host_lost(self, host: int) -> str | None:
        """Why `host` counts as lost (nothing answers at its host worker's address any more), else None (it
        answers, or it is this machine, or its address is unknown: hosts of a Monarch job object). Probes the
        address, so never call it under the lock (up to network.PROBE_TIMEOUT). A lost host stays lost."""
        with self.lock:
            if host in self.lost_hosts:
                return self.lost_hosts[host]
        address = self.host_addresses[host] if host < len(self.host_addresses) else ""
        if self.stores.host_ids[host] == "local" or not address:
            return None
        why = network.why_silent(address)
        if why is None:  # asked as its processes die: a host worker killed with them may still accept for a moment
            time.sleep(PROBE_AGAIN)
            why = network.why_silent(address)
        with self.lock:
            self.doubted.discard(host)
            return None if why is None else self.lost_hosts.setdefault(host, f"its host {address} is lost ({why})")

    def hosts_lost(self, hosts: Iterable[int]) -> dict[int, str]:
        """host_lost of each of `hosts` that is lost, probed in parallel (each probe may take PROBE_AGAIN and
        more: one after the other, a group over 8 hosts waited 8 times as long)."""
        unique = sorted(set(hosts))
        with ThreadPoolExecutor(max_workers=max(1, len(unique)), thread_name_prefix="fray-probe") as probes:
            whys = list(probes.map(self.host_lost, unique))
        return {host: why for host, why in zip(unique, whys, strict=True) if why is not None}

    def probe_doubted(self) -> None:
        """(Not under the lock: probes.) The hosts not known lost where a process died unexpectedly, or where no
        general process runs (they are replaced only once their host answers), are probed, so that what is placed
        next leaves out a host lost meanwhile: a spawn there would wait for an answer that never comes."""
        with self.lock:
            doubted = [h for h in self.live_hosts() if h in self.doubted or not self.general(h)]
        if doubted:
            self.hosts_lost(doubted)

    def live_hosts(self) -> list[int]:
        """Under the lock: the hosts not lost."""
        return [h for h in range(len(self.hosts)) if h not in self.lost_hosts]

    def _died(self, proc: Proc, _value: Any, exc: BaseException | None) -> None:
        """Its `watch` call failed (Monarch supervision), or its pid exited."""
        if not self.closed:
            self.on_death(proc, exc)

    def _watch_pid(self, proc: Proc, reply: Any, exc: BaseException | None) -> None:
        """A process on this machine is also watched by its pid: its exit is seen at once, even when Monarch's
        supervision poll raced the death (that path can take HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE)."""
        if exc is not None or not isinstance(reply, ProcInfo) or not reply.machine:
            return
        if reply.machine != runtime.machine_id():
            return
        pid = proc.pid = reply.pid
        identity = Identity.of(pid)
        if identity is not None:
            self.started_here.append(identity)
        runtime.watch_pid(pid, lambda: self._died(proc, None, RuntimeError(f"its process (pid {pid}) exited")))

    # ------------------------------------------------------------ queries and messages
    def node_resources(self) -> list[dict[str, float]]:
        """One node per host, with all of its resources, as Ray's nodes and `fray status` count them: a task or
        actor may ask for as much as one host has (one bigger than a process's share runs in a process sized for
        it; one holding several GPUs in a process that sees them all)."""
        node = {k: v * self.procs_per_host for k, v in self.share.items()}
        if self.host_gpu_count:
            node["GPU"] = self.host_gpu_count
        return [dict(node) for _ in range(len(self.hosts))]

    def general(self, host: int | None = None) -> list[Proc]:
        return [p for p in self.procs if p.alive and p.general and (host is None or p.host == host)]

    def by_key(self, key: str) -> Proc | None:
        return next((p for p in self.procs if p.key == key), None)

    def reserve(self, host: int, resources: dict[str, float]) -> list[tuple[Proc, dict[str, float]]] | None:
        """Under the lock: `resources` claimed from the free shares of `host`'s general processes (the roomiest
        first), for a task bigger than one process's share, which runs in a process sized for it; None (nothing
        claimed) if their free shares together cannot hold it now."""
        procs = sorted(self.general(host), key=lambda p: -p.free_capacity.get("CPU", 0.0))
        room: dict[str, float] = {}
        for proc in procs:
            add(room, {k: max(0.0, v) for k, v in proc.free_capacity.items()})
        if not fits(room, resources):
            return None
        left = dict(resources)
        claims = []
        for proc in procs:
            part = {k: min(q, max(0.0, proc.free_capacity.get(k, 0.0))) for k, q in left.items() if q > EPS}
            part = {k: q for k, q in part.items() if q > EPS}
            if part:
                self.claim(proc, part)
                claims.append((proc, part))
                subtract(left, part)
        return claims

    def unreserve(self, reserved: list[tuple[Proc, dict[str, float]]]) -> None:
        """Under the lock: give back what reserve() claimed."""
        for proc, part in reserved:
            self.unclaim(proc, part)

    def sized_env_key(self, env_key: EnvKey, resources: dict[str, float]) -> EnvKey:
        """The env key of a process for tasks needing `resources` (more than a process's share): its capacity."""
        value = ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))
        return tuple(sorted({**dict(env_key), SIZED_ENV: value}.items()))

    def claim(self, proc: Proc, resources: dict[str, float]) -> None:
        """Under the lock: an actor's resources are taken from proc's share (its tasks see less room)."""
        if resources:
            add(proc.claims, resources)
            proc.worker.set_capacity.broadcast(proc.free_capacity)

    def unclaim(self, proc: Proc, resources: dict[str, float]) -> None:
        if resources:
            subtract(proc.claims, resources)
            if proc.alive:
                proc.worker.set_capacity.broadcast(proc.free_capacity)

    def free(self, owner: str, allocs: list[int]) -> None:
        """Under the lock: the process `owner` frees these allocations of its store (their memory is reused)."""
        proc = self.by_key(owner)
        if proc is None or not proc.alive:
            return
        try:
            proc.worker.free.broadcast(allocs)
        except Exception:
            runtime.log.debug("fray: free on %s not sent", owner, exc_info=True)

    def live(self) -> list[Proc]:
        """The processes alive now (process_reads.py asks each of them)."""
        with self.lock:
            return [p for p in self.procs if p.alive]

    # ------------------------------------------------------------ the end
    def close(self) -> list[Proc]:
        """Under the lock: spawn nothing, report no death from now on; the processes to stop. Those on a host
        known lost are left out: nothing there answers a stop, which would then take all of STOP_TIMEOUT (a
        process being spawned there when its host went is still listed)."""
        self.closed = True
        procs = list(self.procs)
        for proc in procs:
            proc.alive = False
        return [p for p in procs if p.host not in self.lost_hosts]

    @staticmethod
    def stop(procs: list[Proc], timeout: float | None = None) -> None:
        """Stop their meshes (each once: a group's members share one) and wait, up to `timeout` in all (default
        STOP_TIMEOUT); a process still there afterwards is killed by the context's shutdown (proven its child)."""
        timeout = STOP_TIMEOUT if timeout is None else timeout
        stops = []
        meshes: set[int] = set()
        for proc in procs:
            if id(proc.mesh) in meshes:
                continue
            meshes.add(id(proc.mesh))
            try:
                stops.append(proc.mesh.stop())
            except Exception:
                pass
        deadline = time.monotonic() + timeout
        for fut in stops:
            try:
                fut.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                pass

    def release(self) -> None:
        """After the stops: any process on another host that they missed ends now."""
        if self.lifeline is not None:
            self.lifeline.close()

    def remove_tmpdir(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def ignore(_value: Any, _exc: BaseException | None) -> None:
    """A completion nobody needs (a fire-and-forget stop or init)."""
