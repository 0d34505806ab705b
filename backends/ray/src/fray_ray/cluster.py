"""RayClusterContext: fray's ClusterContext on Ray's Job Submission API.

With an `address` (the dashboard URL, e.g. http://10.0.0.5:8265) it talks to that cluster; its jobs outlive this
process (persistent_jobs). Without one it starts a private head node (fray_ray._head: `ray start --head --block`
in its own process group, listening on loopback only, on ports chosen here, with a private temp dir) and stops
exactly that process group at shutdown. The group and the temp dir are handed to fray.host.watchdog, so they go too
when this process ends without shutdown (SIGKILL included); so such a context has no detached jobs (they could
not outlive the head): `fray cluster start --backend ray` starts a head that outlives its starter (fray_ray.persistent).

Jobs run in place in their working directory when the cluster is on this machine (a private head, or an address
on loopback), by default the caller's. A cluster elsewhere gets a directory uploaded as Ray's runtime_env
working_dir only when the caller named one (as `ray job submit` does): the current directory may hold anything
(a home directory's keys and tokens), and a job that names none runs in Ray's default directory on its node.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any, ClassVar
from urllib.parse import urlencode

from fray.backend import (
    GRACE_VAR,
    Capability,
    ClusterContext,
    JobHandle,
    JobInfo,
    JobStatus,
    RuntimeEnv,
    format_resources,
    grace_of,
    kill_delay,
    short_of,
    stash_call,
    state_subdir,
)
from fray.errors import FrayError, GetTimeoutError, InfeasibleResourcesError, JobExistsError, JobNotFoundError
from fray_ray._auth import is_own_job_api
from fray_ray._connect import http_link
from fray_ray._entrypoints import guarded, in_place, strip_preamble, unguarded
from fray_ray._head import START_TIMEOUT, LocalHead, job_client
from fray_ray._local import is_loopback_address
from fray_ray._translate import entrypoint_options, runtime_env_dict, stop_vars

_STATUS = {s.value: s for s in JobStatus}
# Whether the create_job call under way named its working directory (the call's or the context's): the core
# resolves an unnamed one to the caller's current directory before _create_job sees it.
_working_dir_named: ContextVar[bool] = ContextVar("fray_ray_working_dir_named", default=False)


_JOB_LOG = "job-driver-{submission_id}.log"  # Ray's JOB_LOGS_PATH_TEMPLATE: a job's log, in its node's log directory
_ENTRYPOINT_KEY = "fray_entrypoint"  # job metadata: the command as given (Ray's entrypoint has fray's wrapping)
NODE_STATUS_WAIT = 15.0  # seconds node_status waits for a fresh head's dashboard to report its nodes

# A deleted job must stay deleted. Ray's job manager watches each job's supervisor actor in rounds of 1 s
# (JobManager._monitor_job); the supervisor writes the job's final status, then exits. If the job's record is
# deleted before the monitor's next round, the monitor finds no status, takes the exit for a crash and writes the
# record back: FAILED, "Job supervisor actor died", with Ray's placeholder entrypoint and no start time. So a
# delete waits until the monitor has seen the supervisor end (_let_ray_release), and a record written back all
# the same (a slow monitor) is not a job: never listed or found, and deleted when seen (_is_written_back).
_SUPERVISOR_ACTORS = "/api/v0/actors?limit=10&filter_keys=name&filter_predicates=%3D&filter_values="
_SUPERVISOR_NAME = "_ray_internal_job_actor_{job_id}"  # Ray's JOB_ACTOR_NAME_TEMPLATE
_MONITOR_SETTLE = 2.0  # seconds after the supervisor's end by which the monitor has seen it (rounds of 1 s)
_SUPERVISOR_END_TIMEOUT = 30.0
_PLACEHOLDER_ENTRYPOINT = "Entrypoint not found."  # what Ray's put_status writes into a record it does not have


def _is_written_back(details: Any) -> bool:
    """A record Ray's job manager wrote back after the job was deleted (see above): every job submitted has its
    entrypoint and start time."""
    return bool(details.entrypoint == _PLACEHOLDER_ENTRYPOINT and not details.start_time)


# How long a submission waits for the head's job agent (Ray itself waits 10 s before it answers 'No available
# agent'); a fresh head on a loaded machine starts its agent last.
AGENT_WAIT = START_TIMEOUT


def _camel(name: str) -> str:
    """A name as Ray's dashboard camel-cases the keys of its answers (ray.dashboard.utils.to_camel_case)."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


class RayClusterContext(ClusterContext):
    backend: ClassVar[str] = "ray"
    # A job's first process is the entrypoint of Ray's JobSupervisor actor, which dies with its node, and Ray's job
    # manager then ends the job FAILED, never running it again. Ray places an entrypoint that holds nothing on the
    # head node (JobManager._get_label_selector), lost only with the cluster; a supervised job's ranks that hold
    # resources are therefore a group of the job's own (fray.jobs.requests.ONE_NODE), whose node's loss is a lost
    # attempt that the supervisor runs again.
    ranks_apart: ClassVar[bool] = True
    # By address; a context with a private head has no persistent_jobs (set in __init__).
    capabilities = frozenset(
        {
            Capability.JOB_PACKAGES,
            Capability.JOB_RESOURCES,
            Capability.PERSISTENT_JOBS,
            Capability.PROCESS_ISOLATION,
            Capability.MULTI_HOST,
        }
    )

    def __init__(
        self,
        address: str | None = None,
        working_dir: str | None = None,
        num_cpus: float | None = None,
        resources: dict[str, float] | None = None,
        num_gpus: float | None = None,
        object_store_memory: int | None = None,
    ) -> None:
        """address: a Ray dashboard URL (http://host:8265); else a private local head node is started.
        working_dir: the default working directory of jobs (else the caller's current directory on this machine's
        cluster, and none uploaded to a cluster elsewhere)."""
        self.working_dir = working_dir
        self.default_working_dir = working_dir
        self._head: LocalHead | None = None
        if address:
            if "://" not in address:
                address = f"http://{address}"
            self.address = address
            self._client = job_client(address)
        else:
            self._head = LocalHead(num_cpus, resources, num_gpus, object_store_memory)
            self._client = self._head.wait_ready(partial(job_client, own=True))
            self.address = self._head.address
            self.capabilities = type(self).capabilities - {Capability.PERSISTENT_JOBS}
        # On this machine: jobs run in place (and get the guard that ends them with their supervisor).
        self._local = self._head is not None or is_loopback_address(self.address)

    @property
    def gcs_address(self) -> str | None:
        """host:port for `fray.init("ray?address=...")` when this context started the head node."""
        return self._head.gcs_address if self._head else None

    def describe(self) -> dict[str, str]:
        return {"address": self.address or "", "dashboard": self.address or ""}

    def engine_links(self) -> dict[str, str]:
        """Ray's dashboard: this context's address is one (the Job API goes through it)."""
        url = http_link(self.address)
        return {"Ray dashboard": url} if url else {}

    def _no_persistent_jobs(self) -> str:
        return (
            "this context's Ray head is private to this process and stops with it, and its jobs with it. Start a "
            "head that outlives it with `fray cluster start --backend ray` and pass its address "
            "(fray.cluster('ray?address=...'), printed by that command), or join a cluster of yours by address"
        )

    # ------------------------------------------------------------------ jobs
    def create_job(  # type: ignore[override]
        self,
        entrypoint: str | Sequence[str] | Callable[..., Any],
        env: RuntimeEnv | None = None,
        working_dir: str | os.PathLike[str] | None = None,
        detached: bool = False,
        **options: Any,
    ) -> JobHandle:
        """As ClusterContext.create_job, but a cluster elsewhere (not on this machine) gets a working directory
        uploaded only when one is named (`working_dir`, or the context's `working_dir` option), as `ray job
        submit --working-dir` does; without one nothing is uploaded and the job runs in Ray's default directory
        on its node. On this machine's cluster the job runs in place, by default in the caller's directory."""
        named = _working_dir_named.set(working_dir is not None or self.default_working_dir is not None)
        try:
            return super().create_job(entrypoint, env, working_dir, detached, **options)
        finally:
            _working_dir_named.reset(named)

    def _create_job(
        self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool, job_id: str | None
    ) -> str:
        # detached: every job of a cluster by address outlives this process (a private head refuses it, upstream)
        given = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)
        runtime_env: dict[str, Any] = runtime_env_dict(env) or {}
        # FRAY_BACKEND=ray is set by ClusterContext.create_job; Ray sets RAY_ADDRESS for the job, so a job that
        # calls fray.init() lands on this cluster's Ray. A job's log is a file, never a terminal: Ray colours the
        # prefixes it writes there ("(raylet)", "(task pid=N)") unless RAY_COLOR_PREFIX=0.
        runtime_env["env_vars"] = {"RAY_COLOR_PREFIX": "0", **runtime_env.get("env_vars", {})}
        if GRACE_VAR in env.env:  # a supervised job: Ray's stop (which signals every process of it) waits its grace
            runtime_env["env_vars"].update(stop_vars(float(env.env[GRACE_VAR])))
        if self._local and (self._head is not None or is_own_job_api(self.address or "")):
            # Ray keeps a job's environment in its record, shown by the cluster's dashboard and Job API: a
            # callable's pickle goes by a private file instead (the job runs here, as this user)
            stash_call(runtime_env["env_vars"], state_subdir("ray-job-calls"))
        reserved = entrypoint_options(env) if env.minimum_resources else {}
        if env.minimum_resources:
            self._check_feasible({r.name: float(r.quantity) for r in env.minimum_resources})
        if self._local:
            command = guarded(in_place(given, working_dir))
        else:
            command = given
            if _working_dir_named.get():
                runtime_env["working_dir"] = working_dir  # uploaded by the client, unpacked on the node
        deadline = time.monotonic() + AGENT_WAIT
        while True:
            try:
                return str(
                    self._client.submit_job(
                        entrypoint=command,
                        runtime_env=runtime_env,
                        metadata={_ENTRYPOINT_KEY: given},
                        submission_id=job_id,
                        **reserved,
                    )
                )
            except RuntimeError as exc:  # a fresh head node's job agent comes up after the dashboard
                if job_id is not None and "already exists" in str(exc):  # Ray's check is atomic (its GCS's kv)
                    raise JobExistsError(
                        f"a job with id {job_id!r} exists on the Ray cluster at {self.address}"
                    ) from None
                if "No available agent" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise FrayError(
                        f"the Ray cluster at {self.address} took no job for {AGENT_WAIT:.0f} s: its head's job agent "
                        "is not up (Ray answers 'No available agent'; a head starting on a loaded machine is slow "
                        "to start it). Submit again once `ray status` shows the head node alive, or see "
                        "dashboard_agent.log in the head's Ray logs"
                    ) from None
                time.sleep(0.5)

    def _check_feasible(self, need: dict[str, float]) -> None:
        """InfeasibleResourcesError when no node of the cluster could ever hold `need` (a job's entrypoint runs on
        one node): Ray would keep such a job PENDING forever. Nodes not known yet: nothing to check against."""
        try:
            nodes = self.node_status()
        except Exception:  # no status API to ask: Ray decides
            return
        totals = [node["total"] for node in nodes if node.get("total")]
        if totals and all(short_of(total, need) for total in totals):
            largest = max(totals, key=lambda t: t.get("CPU", 0.0))
            raise InfeasibleResourcesError(
                f"the job needs {format_resources(need)} on one node, but no node of the Ray cluster at "
                f"{self.address} has that (the largest: {format_resources(largest)}); lower its resources or "
                "replicas"
            )

    def _info(self, details: Any) -> JobInfo:
        status = _STATUS[str(getattr(details.status, "value", details.status))]

        def seconds(ms: Any) -> float | None:
            return ms / 1000.0 if ms else None

        return JobInfo(
            id=details.submission_id,
            status=status,
            submission_time=seconds(details.start_time),
            start_time=seconds(getattr(details, "driver_start_time", None) or details.start_time),
            end_time=seconds(details.end_time),
            entrypoint=(getattr(details, "metadata", None) or {}).get(_ENTRYPOINT_KEY)
            or unguarded(details.entrypoint or ""),
            exit_code=getattr(details, "driver_exit_code", None),
            # Ray appends the job's last 20,000 characters of log to a failed job's message: they are in its logs
            message=(details.message or "").split(", last available logs", 1)[0],
        )

    def _list_jobs(self) -> list[JobInfo]:
        # Ray also lists plain drivers (type DRIVER, no submission id): those are not jobs of this context.
        jobs = []
        for details in self._client.list_jobs():
            if not details.submission_id:
                continue
            if _is_written_back(details):  # a deleted job's record written back: delete it again
                try:
                    self._client.delete_job(details.submission_id)
                except Exception:  # listed all the same: never
                    pass
                continue
            jobs.append(details)
        jobs.sort(key=lambda d: d.start_time or 0)
        return [self._info(d) for d in jobs]

    def _details(self, job_id: str) -> Any:
        try:
            details = self._client.get_job_info(job_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc) or "not found" in str(exc).lower():
                details = None
            else:
                raise
        if details is None or _is_written_back(details):
            raise JobNotFoundError(f"no job {job_id!r} on the Ray cluster at {self.address}")
        return details

    def _get_job(self, job_id: str) -> JobInfo:
        return self._info(self._details(job_id))

    def _stop_job(self, job_id: str) -> None:
        # Ray sends SIGTERM to the job's processes, SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s, else stop_vars)
        info = self._get_job(job_id)
        if not info.status.is_terminal:
            self._client.stop_job(job_id)
            self._wait_job(job_id, 60.0 + kill_delay(grace_of(info.entrypoint)))

    def _delete_job(self, job_id: str) -> None:
        self._stop_job(job_id)  # Ray refuses to delete a job that has not ended
        self._let_ray_release(job_id)
        self._client.delete_job(job_id)

    def _let_ray_release(self, job_id: str) -> None:
        """Wait (bounded) until Ray's job manager has seen the ended job's supervisor actor end, so that it does
        not write the job's record back after the delete (the comment above _SUPERVISOR_ACTORS says how)."""
        deadline = time.monotonic() + _SUPERVISOR_END_TIMEOUT
        path = _SUPERVISOR_ACTORS + _SUPERVISOR_NAME.format(job_id=job_id)
        seen_alive = False
        while True:
            try:
                rows = self._get_json(path).get("result", {}).get("result", [])
            except Exception:  # no state API to ask: a record written back is not listed all the same
                return
            if all(row.get("state") == "DEAD" for row in rows) or time.monotonic() > deadline:
                break
            seen_alive = True
            time.sleep(0.1)
        if seen_alive:
            time.sleep(_MONITOR_SETTLE)
            return
        # Ended before we looked: the supervisor exits right after writing the job's end time (the cluster's
        # clock: the wait is at most _MONITOR_SETTLE whatever the two clocks say).
        end_time = self._details(job_id).end_time
        if end_time:
            time.sleep(min(_MONITOR_SETTLE, max(0.0, end_time / 1000.0 + _MONITOR_SETTLE - time.time())))

    def _get_job_logs(self, job_id: str) -> str:
        details = self._details(job_id)
        return strip_preamble(str(self._client.get_job_logs(job_id)), job_id, details.entrypoint or "")

    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            info = self._get_job(job_id)
            if info.status.is_terminal:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise GetTimeoutError(f"job {job_id} did not end within {timeout} s (status {info.status.name})")
            wait = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(wait)
            pause = min(pause * 1.5, 0.5)

    def node_status(self) -> list[dict[str, Any]]:
        """Each node Ray reports (its dashboard's cluster status): total and free resources, `node:*` markers
        left out. The dashboard answers with an empty list for a few seconds after the head started; a cluster has
        a node, so an empty answer is asked again, for up to NODE_STATUS_WAIT seconds (a job's feasibility is
        checked against these totals: an empty list would let an infeasible job wait PENDING forever)."""
        deadline = time.monotonic() + NODE_STATUS_WAIT
        while True:
            usage = self._get_json("/api/cluster_status").get("clusterStatus", {}).get("loadMetricsReport", {})
            if usage.get("usageByNode") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        names: dict[str, str] = {}
        # The cluster status camel-cases every key, custom resources' names too ("member_slot" is "memberSlot"
        # there); the state API's node list keeps them: each node's own names, by their camel-cased form.
        spelled: dict[str, dict[str, str]] = {}
        try:
            listed = self._get_json("/api/v0/nodes?limit=1000").get("result", {}).get("result", [])
            names = {node["node_id"]: node.get("node_ip") or node["node_id"] for node in listed}
            spelled = {node["node_id"]: {_camel(k): k for k in node.get("resources_total") or {}} for node in listed}
        except Exception:  # names are a nicety: ids do (a custom resource's keeps its camel case then)
            pass
        nodes = []
        for node_id, resources in sorted((usage.get("usageByNode") or {}).items()):
            total, free = {}, {}
            exact = {"objectStoreMemory": "object_store_memory", **spelled.get(node_id, {})}
            for name, (used, amount) in resources.items():
                if name.startswith("node:"):
                    continue
                name = exact.get(name, name)
                total[name], free[name] = float(amount), float(amount) - float(used)
            nodes.append({"node": names.get(node_id, node_id), "id": node_id, "total": total, "free": free})
        return nodes

    def running_work(self) -> dict[str, list[dict[str, Any]]] | None:
        """Running tasks and live actors, from Ray's state API (the dashboard's /api/v0 endpoints)."""
        found: dict[str, list[dict[str, Any]]] = {}
        queries = {
            "tasks": "/api/v0/tasks?limit=1000&filter_keys=state&filter_predicates=%3D&filter_values=RUNNING",
            "actors": "/api/v0/actors?limit=1000&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE",
        }
        for kind, path in queries.items():
            rows = self._get_json(path).get("result", {}).get("result", [])
            found[kind] = [
                {
                    "name": row.get("name") or row.get("func_or_class_name") or "",
                    "class": row.get("class_name") or "",
                    "state": row.get("state", ""),
                    "node": row.get("node_id") or (row.get("address") or {}).get("ip_address", ""),
                }
                for row in rows
                if not str(row.get("class_name") or row.get("name") or "").startswith("JobSupervisor")
            ]
        return found

    def _get_job_log_end(self, job_id: str, lines: int) -> str:
        """The log's last lines from Ray's log API (the node reads its file's end), not the whole log."""
        details = self._details(job_id)
        node = getattr(details, "driver_node_id", None)
        if not node:  # not started yet: no log file to read the end of
            return super()._get_job_log_end(job_id, lines)
        # By node and file name: Ray 2.60's lookup by submission_id fails (HTTP 500) for jobs of a Ray head.
        query = urlencode({"node_id": node, "filename": _JOB_LOG.format(submission_id=job_id), "lines": max(lines, 1)})
        try:
            response = self._client._do_request("GET", f"/api/v0/logs/file?{query}")
            response.raise_for_status()
        except Exception:  # a job whose log file is not there yet (pending), or no log API: the whole log
            return super()._get_job_log_end(job_id, lines)
        text = response.content.decode(errors="replace")
        return strip_preamble(text, job_id, details.entrypoint or "")

    def _job_python(self) -> str:
        # A cluster elsewhere: its own `python` (this machine's interpreter path need not exist there)
        return super()._job_python() if self._local else "python"

    def _get_json(self, path: str) -> dict[str, Any]:
        response = self._client._do_request("GET", path)
        response.raise_for_status()
        data = response.json()
        return dict(data.get("data") or {})

    def _shutdown(self) -> None:
        if self._head is not None:
            self._head.stop()
