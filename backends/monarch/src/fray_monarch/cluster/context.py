"""MonarchClusterContext: jobs are subprocesses started on the mesh's hosts by a job-runner actor there
(fray.jobs.local.LocalJobs: own process group, log file readable while running, status from a waiter thread)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fray.backend import (
    Capability,
    ClusterContext,
    JobInfo,
    LocalJobs,
    RuntimeEnv,
    children_of,
    grace_of,
    kill_delay,
    state_subdir,
    watchdog,
)
from fray.errors import GetTimeoutError, JobExistsError, JobNotFoundError
from fray_monarch.cluster.host_recovery import HostRecovery, answer, start_again
from fray_monarch.cluster.host_set import HostSet
from fray_monarch.cluster.job_recovery import PREEMPT_WAIT, AllocationRecovery, ContextHooks
from fray_monarch.core import runtime, tempdirs  # _runtime: environment and fault hook first
from fray_monarch.core.monarch_api import Actor, endpoint
from fray_monarch.core.protocol import Reply
from fray_monarch.net.lifeline import LifelineServer, hold

MARGIN = 30.0
WAIT_SLICE = 10.0  # seconds of one wait call to a job runner on another host, which may be lost (then asked again)

# What a job's own fray.init() keeps of its cluster's spec: the size of its processes, never how hosts are launched
# (a job must not launch the cluster's hosts again: it attaches to them by address).
# A cluster run without the socket guard (unguarded_sockets=true) runs its jobs' contexts so too; a guarded one's
# jobs inherit the guard with their environment.
_CARRIED = (
    "procs",
    "cpus",
    "gpus",
    "memory",
    "resources",
    "object_store_memory",
    "transport",
    "log_to_driver",
    "unguarded_sockets",
)


def _spec_text(value: Any) -> str:
    """A converted option's value as a spec writes it (SCHEMA's converters read it back to the same value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)  # resources
    return str(value)


def job_spec(options: dict[str, Any], hostset: HostSet | None) -> str:
    """The FRAY_BACKEND of this cluster's jobs: monarch on the cluster's hosts (by address), or on the job's own
    machine where the cluster is this machine (job=local: not the hosts some other `fray cluster start` recorded)."""
    carried = {key: _spec_text(options[key]) for key in _CARRIED if options.get(key) is not None}
    if hostset is not None and hostset.addresses:
        carried["hosts"] = ",".join(hostset.addresses)
        if not hostset.secure and not hostset.local:
            carried["insecure"] = "true"
    else:
        carried["job"] = "local"
    return "monarch?" + urlencode(carried, safe=",:/")


class JobRunner(Actor):
    """Runs jobs on its host. Each endpoint returns a Reply (a value, or the exception to raise)."""

    def __init__(
        self,
        root: str,
        job_tmpdir: str | None = None,
        lifeline: tuple[str, bytes, str] | None = None,
        shared: bool = False,
    ) -> None:
        if not shared:  # (a root on shared storage outlives this host: the driver removes it)
            watchdog.watch_path(root)  # this process dies with the driver; its jobs and their logs go with it
        if lifeline is not None:  # on another host: this process ends when its driver ends
            address, key, name = lifeline
            hold(address, key, name=name)
        runtime.start_client_context()  # Monarch's banner dropped (see runtime.BANNER)
        self.jobs = LocalJobs(Path(root))
        self.job_tmpdir = job_tmpdir  # the user's TMPDIR (this process has a private one that fray removes)

    def _safe(self, fn: Any, *args: Any) -> Any:
        try:
            return Reply(fn(*args))
        except Exception as exc:
            return Reply(error=exc)

    @endpoint
    def start(self, entrypoint: Any, env: RuntimeEnv, job_id: str, working_dir: str | None = None) -> Any:
        if self.job_tmpdir is not None and "TMPDIR" not in env.env:  # a job is the user's program
            env = replace(env, env={**env.env, "TMPDIR": self.job_tmpdir})
        return self._safe(self.jobs.start, entrypoint, env, job_id, False, working_dir)

    @endpoint
    def resume(self, entrypoint: Any, env: RuntimeEnv, job_id: str, working_dir: str | None, first_line: str) -> Any:
        """Run again a job whose hosts were lost (host_recovery.start_again)."""
        if self.job_tmpdir is not None and "TMPDIR" not in env.env:
            env = replace(env, env={**env.env, "TMPDIR": self.job_tmpdir})
        return self._safe(start_again, self.jobs, entrypoint, env, job_id, working_dir, first_line)

    @endpoint
    def adopt(self, info: JobInfo) -> Any:
        """List a job that ended before its hosts were lost (or with them), its log under this root."""
        return self._safe(self.jobs.adopt, info)

    @endpoint
    def info(self, job_id: str) -> Any:
        return self._safe(self.jobs.info, job_id)

    @endpoint
    def list(self) -> Any:
        return self._safe(self.jobs.list)

    @endpoint
    def logs(self, job_id: str) -> Any:
        return self._safe(self.jobs.logs, job_id)

    @endpoint
    def log_end(self, job_id: str, lines: int) -> Any:
        return self._safe(self.jobs.log_end, job_id, lines)

    @endpoint
    def stop_job(self, job_id: str) -> Any:  # "stop" is a name of ActorMesh
        return self._safe(self.jobs.stop, job_id)

    @endpoint
    def delete(self, job_id: str) -> Any:
        return self._safe(self.jobs.delete, job_id)

    @endpoint(explicit_response_port=True)
    def wait(self, port: Any, job_id: str, timeout: float | None) -> None:
        def run() -> None:
            try:
                port.send(Reply(self.jobs.wait(job_id, timeout)))
            except Exception as exc:
                port.send(Reply(error=exc))

        threading.Thread(target=run, name="fray-monarch-job-wait", daemon=True).start()

    @endpoint
    def host_facts(self) -> dict[str, Any]:
        """This host as `fray status` shows it: name, CPUs, memory, and how many processes run under the
        process that started this one (its host worker, or the driver on the driver's machine)."""
        from fray.backend import host_resources

        total = host_resources()
        return {
            "hostname": socket.gethostname(),
            "processes": len(children_of(os.getppid())),
            "total": {name: float(total[name]) for name in ("CPU", "memory", "GPU") if name in total},
        }

    @endpoint
    def close(self) -> Any:
        root = self.jobs.root
        result = self._safe(self.jobs.close)
        shutil.rmtree(root, ignore_errors=True)
        return result


def _unwrap(reply: Any) -> Any:
    return reply.unwrap()


class MonarchClusterContext(ClusterContext):
    backend = "monarch"
    capabilities = frozenset(
        {Capability.JOB_PACKAGES, Capability.JOB_RESOURCES, Capability.MULTI_HOST, Capability.PROCESS_ISOLATION}
    )

    def __init__(
        self,
        hosts: list[Any],
        driver_bind: str = "127.0.0.1",
        release: Callable[[], None] | None = None,
        remote: bool = False,
        hostset: HostSet | None = None,
        job_backend: str = "monarch",
        preempt_wait: float = PREEMPT_WAIT,
        respec: Callable[[HostSet], str] | None = None,
    ) -> None:
        self._release = release  # ends the hosts this context launched
        self._job_spec = job_backend  # what its jobs' fray.init() reaches (job_spec)
        self._hostset = hostset
        # On this host, the job runners' TMPDIR (Monarch's socket directories) and the jobs' logs are in a
        # directory of this context, removed at shutdown or with the driver's private directory by the watchdog.
        tempdirs.private_dir()  # (for the life of the process)
        self._tmpdir = None if remote else tempdirs.context_dir()
        # The lifeline names of job runners on other hosts whose lifeline closed: their host (or process) is gone,
        # and shutdown does not wait for an answer from them that cannot come.
        self._gone: set[str] = set()
        allocation = hostset.allocation if hostset is not None else None
        self._lifeline = LifelineServer(driver_bind, self._lifeline_lost) if remote else None
        self._shared: str | None = None
        if self._tmpdir is not None:
            roots = [os.path.join(self._tmpdir, f"runner-{i}") for i in range(len(hosts))]
            self._user_tmp: str | None = tempdirs.user_tmpdir()
        elif allocation is not None:
            # On the state directory, which a Slurm allocation's nodes share with the driver (its TLS authority and
            # Slurm's output are there): the jobs' logs outlive a preemption of the allocation (job_recovery.py).
            self._shared = str(state_subdir("monarch", "slurm-jobs", uuid.uuid4().hex[:12]))
            watchdog.watch_path(self._shared)  # removed with this driver however it ends
            roots = [os.path.join(self._shared, f"runner-{i}") for i in range(len(hosts))]
            self._user_tmp = None
        else:
            # made by the runner on its host (was made here too, and left behind here)
            roots = [os.path.join(tempfile.gettempdir(), f"fray-monarch-jobs-{uuid.uuid4().hex[:12]}") for _ in hosts]
            self._user_tmp = None
        self._roots = roots
        self._lock = threading.Lock()
        self._procs: list[Any] = []
        self._runners: list[Any] = []
        self._names: list[str] = []  # each runner's lifeline name (its root, and the hosts' run: recovery)
        self._generation = 0  # how many times the runners were started (or replaced by stand-ins)
        hooks = self._hooks()
        lost_host = HostRecovery(hooks, respec).recover  # one host lost while the others run on
        self._recovery = AllocationRecovery(allocation, preempt_wait, driver_bind, respec, hooks, lost_host)
        self._spawn_runners(hosts)
        self._where: dict[str, int] = {}

    def _hooks(self) -> ContextHooks:
        """What the recovery of its jobs from a lost host (or a preempted Slurm allocation) reads and changes."""

        def where() -> dict[str, int]:
            with self._lock:
                return dict(self._where)

        def set_job_spec(spec: str) -> None:
            self._job_spec = spec

        def retire(index: int, stand_in: Any, live: list[int], moved: dict[str, int]) -> None:
            with self._lock:  # (new jobs go to the live hosts' runners)
                self._where.update(moved)
                self._runners = [stand_in if i == index else r for i, r in enumerate(self._runners)]
                self._next = itertools.cycle(live or range(len(self._runners)))
                self._generation += 1

        return ContextHooks(
            hostset=self._hostset,
            roots=self._roots,
            runners=lambda: self._runners,
            names=lambda: self._names,
            where=where,
            generation=lambda: self._generation,
            job_spec=lambda: self._job_spec,
            set_job_spec=set_job_spec,
            spawn_runners=self._spawn_runners,
            runners_ended=self._runners_ended,
            shared_roots=self._shared is not None,
            gone=lambda: set(self._gone),
            retire=retire,
        )

    def _lifeline_lost(self, name: str) -> None:
        """A job runner's lifeline closed: its host or process is gone (shutdown waits for no answer from it)."""
        self._gone.add(name)
        self._recovery.lifeline_lost(name)

    def _runners_ended(self, stand_ins: list[Any]) -> None:
        """The hosts are gone for good: stand-ins in the driver answer for their runners' jobs."""
        with self._lock:
            self._runners, self._procs, self._names = stand_ins, [], []
            self._generation += 1

    def _spawn_runners(self, hosts: list[Any]) -> None:
        """A job runner on each host (again after a preemption: on the hosts of the allocation's next run)."""
        boot = {"bootstrap_command": tempdirs.bootstrap_command(self._tmpdir)} if self._tmpdir else {}
        procs = [
            host.spawn_procs(per_host={"procs": 1}, name=f"fray_jobs_{uuid.uuid4().hex[:6]}", **boot) for host in hosts
        ]
        names = [f"{root}#{self._generation}" for root in self._roots]
        runners = [
            proc.spawn("fray_job_runner", JobRunner, root, self._user_tmp, self._lifeline_of(name), bool(self._shared))
            for proc, root, name in zip(procs, self._roots, names, strict=True)
        ]
        with self._lock:
            self._procs, self._runners, self._names = procs, runners, names
            self._next = itertools.cycle(range(len(runners)))
            self._generation += 1

    def _lifeline_of(self, name: str) -> tuple[str, bytes, str] | None:
        """The lifeline a job runner on another host holds: address, its own key, its name (unique)."""
        if self._lifeline is None:
            return None
        return self._lifeline.address, self._lifeline.key_for(name), name

    def _runner(self, job_id: str, within: float | None = None) -> Any:
        self._recovery.settle(within)
        with self._lock:
            index = self._where.get(job_id)
        if index is None:
            raise JobNotFoundError(f"no job {job_id!r} here (it never existed or was deleted)")
        return self._runners[index]

    def _ask(self, job_id: str, endpoint: str, *args: Any) -> Any:
        """The answer of the job's runner (asked again of its runner now where its host was lost meanwhile)."""
        return answer(self._runner, job_id, endpoint, args, lambda: (self._generation, self._recovery.recovering))

    def _create_job(
        self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool, job_id: str | None
    ) -> str:
        # detached never comes here: no persistent_jobs (the job runners are children of this driver's meshes).
        # working_dir is this driver's path: on another host a directory that does not exist fails the job.
        self._recovery.settle()
        with self._lock:  # one id, one job: ids are taken here, in this driver, whichever runner runs the job
            if job_id is not None and job_id in self._where:
                raise JobExistsError(f"a job with id {job_id!r} exists")
            index = next(self._next)
            job_id = job_id or f"monarch-job-{uuid.uuid4().hex[:12]}"
            self._where[job_id] = index
        self._recovery.remember(job_id, entrypoint, env, working_dir)
        started = self._runners[index].start.call_one(entrypoint, env, job_id, working_dir)
        return str(_unwrap(started.get(timeout=MARGIN)))

    def _job_backend(self) -> str:
        return self._job_spec

    def _list_jobs(self) -> list[JobInfo]:
        self._recovery.settle()
        futures = [runner.list.call_one() for runner in self._runners]
        return [self._recovery.saw(info) for fut in futures for info in _unwrap(fut.get(timeout=MARGIN))]

    def _get_job(self, job_id: str) -> JobInfo:
        return self._recovery.saw(self._ask(job_id, "info"))

    def _stop_job(self, job_id: str) -> None:
        grace = kill_delay(grace_of(self._get_job(job_id).entrypoint))  # a supervised job's ranks have their grace
        _unwrap(self._runner(job_id).stop_job.call_one(job_id).get(timeout=MARGIN + grace))

    def _delete_job(self, job_id: str) -> None:
        self._ask(job_id, "delete")
        with self._lock:
            self._where.pop(job_id, None)

    def _get_job_log_end(self, job_id: str, lines: int) -> str:
        return self._recovery.saw_log(job_id, str(self._ask(job_id, "log_end", lines)))

    def raw_log_end(self, job_id: str, lines: int) -> str:
        """The raw last lines of a job's log, records included (for a head's clients: fray.jobs.records)."""
        return self._get_job_log_end(job_id, lines)

    def _job_python(self) -> str:
        return "python"  # a job runner puts its own interpreter first on a job's PATH (this path may not be there)

    def _get_job_logs(self, job_id: str) -> str:
        return str(self._ask(job_id, "logs"))

    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo:
        # In slices: a lost host (or a preempted allocation) takes the runner that waits; the job goes on elsewhere.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            runner, generation = self._runner(job_id, left), self._generation
            if self._recovery.recovering:  # its hosts are still being brought back
                if left is None:
                    continue
                raise GetTimeoutError(f"job {job_id} did not end within {timeout} s: its hosts were lost")
            part = WAIT_SLICE if left is None else min(WAIT_SLICE, left)
            fut = runner.wait.call_one(job_id, part)
            answered = time.monotonic() + part + MARGIN
            while True:
                try:
                    return self._recovery.saw(_unwrap(fut.get(timeout=1.0)))
                except GetTimeoutError:
                    if left is not None and left <= part:
                        raise GetTimeoutError(f"job {job_id} did not end within {timeout} s") from None
                    break  # not yet: ask again
                except TimeoutError as exc:
                    if self._recovery.recovering or self._generation != generation:
                        break  # its hosts are gone: asked again once the job runs on the next ones
                    if time.monotonic() > answered:
                        raise GetTimeoutError(f"job {job_id} did not end within {timeout} s") from exc
                except Exception:
                    if not (self._recovery.recovering or self._generation != generation):
                        raise
                    break

    def node_status(self) -> list[dict[str, Any]]:
        """Each host: its name and worker address, who holds it (ssh, a Slurm job, the user...), how many
        processes run under its host worker, and its CPUs and memory."""
        names = self._hostset.names if self._hostset and self._hostset.names else []
        addresses = self._hostset.addresses if self._hostset else []
        holder = self._hostset.holder if self._hostset else "this machine"
        facts = [runner.host_facts.call_one() for runner in self._runners]
        nodes = []
        for i, fut in enumerate(facts):
            try:
                seen: dict[str, Any] = fut.get(timeout=MARGIN)
            except Exception as exc:
                seen = {"hostname": "?", "error": str(exc)}
            nodes.append(
                {
                    "node": names[i] if i < len(names) else seen.get("hostname", "?"),
                    "address": addresses[i] if i < len(addresses) else "",
                    "held_by": holder,
                    **seen,
                }
            )
        return nodes

    def _shutdown(self) -> None:
        self._recovery.close()
        with self._lock:
            runners, procs, names = list(self._runners), list(self._procs), list(self._names)
        # (a lost host's runner never answers; a stand-in for one, after its hosts were lost for good, has no name)
        live = [i for i in range(len(runners)) if i >= len(names) or names[i] not in self._gone]
        closing = [runners[i].close.call_one() for i in live]
        for fut in closing:
            try:
                fut.get(timeout=MARGIN)
            except Exception:
                pass
        for i in live:
            if i < len(procs):
                try:
                    procs[i].stop().get(timeout=20)
                except Exception:
                    pass
        if self._lifeline is not None:
            self._lifeline.close()
        if self._release is not None:
            self._release()
        for path in (self._tmpdir, self._shared):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        if self._shared is not None:
            watchdog.forget_path(self._shared)
