"""The ClusterContext of a monarch cluster that `fray cluster start` started: every call is one request to its
head (head.py), so jobs outlive the process that submitted them and any process of this user can reach them."""

from __future__ import annotations

from typing import Any

from fray.backend import Capability, ClusterContext, JobInfo, RuntimeEnv, grace_of, kill_delay
from fray_monarch.cluster.head_record import REQUEST_TIMEOUT, decode_info, request

__all__ = ["MonarchHeadClient"]


class MonarchHeadClient(ClusterContext):
    backend = "monarch"
    capabilities = frozenset(
        {
            Capability.JOB_PACKAGES,
            Capability.JOB_RESOURCES,
            Capability.MULTI_HOST,
            Capability.PERSISTENT_JOBS,
            Capability.PROCESS_ISOLATION,
        }
    )

    def __init__(self, address: str) -> None:
        self.address = address
        self.head = address  # the head's socket (self.address is the contract's, typed optional)
        self._ask({"op": "list"})  # fails now, naming the socket, if no head answers there

    def _ask(self, message: dict[str, Any], timeout: float | None = REQUEST_TIMEOUT) -> Any:
        return request(self.head, message, timeout)

    def _create_job(
        self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool, job_id: str | None
    ) -> str:
        # A job of the head's lives as long as the head, whether detached was asked or not: the cluster was
        # started to outlive its commands, as a Ray cluster's jobs do.
        message = {
            "op": "submit",
            "entrypoint": entrypoint,
            "env": dict(env.env),
            "packages": list(env.package_requirements),
            "working_dir": working_dir,
            "id": job_id,
            "resources": {r.name: float(r.quantity) for r in env.minimum_resources},
        }
        return str(self._ask(message))

    def _job_backend(self) -> None:
        return None  # the head's own cluster context sets it (its hosts' addresses)

    def _list_jobs(self) -> list[JobInfo]:
        return [decode_info(item) for item in self._ask({"op": "list"})]

    def _get_job(self, job_id: str) -> JobInfo:
        return decode_info(self._ask({"op": "info", "id": job_id}))

    def _stop_job(self, job_id: str) -> None:
        grace = kill_delay(grace_of(self._get_job(job_id).entrypoint))  # a supervised job's ranks have their grace
        self._ask({"op": "stop", "id": job_id}, REQUEST_TIMEOUT + grace)

    def _delete_job(self, job_id: str) -> None:
        self._ask({"op": "delete", "id": job_id})

    def _get_job_logs(self, job_id: str) -> str:
        return str(self._ask({"op": "logs", "id": job_id}))

    def _get_job_log_end(self, job_id: str, lines: int) -> str:
        return str(self._ask({"op": "log_end", "id": job_id, "lines": lines}))

    def _job_python(self) -> str:
        return "python"  # the head's job runners put their own interpreter first on a job's PATH

    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo:
        limit = None if timeout is None else timeout + REQUEST_TIMEOUT
        return decode_info(self._ask({"op": "wait", "id": job_id, "timeout": timeout}, limit))

    def describe(self) -> dict[str, str]:
        return {"address": self.head, "head": self.head}

    def node_status(self) -> list[dict[str, Any]]:
        return list(self._ask({"op": "status"}))

    def _shutdown(self) -> None:
        return None  # the head and its jobs go on: `fray cluster stop --backend monarch` ends them
