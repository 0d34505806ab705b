"""Fray's Ray backend: `fray.init("ray")`, `fray.cluster("ray")`.

fray.init("ray")                                   # private local Ray, stopped at shutdown
fray.init("ray?num_cpus=4&object_store_memory=300000000")
fray.init("ray?address=10.0.0.5:6379&namespace=prod")   # join a running cluster (or set RAY_ADDRESS)
fray.cluster("ray")                                # private local head node with the Job Submission API
fray.cluster("ray?address=http://10.0.0.5:8265")   # an existing cluster's Job API (dashboard address)
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from fray.backend import (
    Backend,
    Capability,
    byte_count,
    choose_recording,
    count,
    directory,
    flag,
    gpu_view,
    non_empty_text,
    parse_resources,
)
from fray.errors import UnsupportedFeatureError
from fray_ray.job import RayJobContext

__all__ = ["RayBackend", "RayClusterContext", "RayJobContext"]


_SIZING = {
    "num_cpus": count,
    "num_gpus": count,
    "gpus": count,  # the other backends' name for num_gpus (Ray's own)
    "object_store_memory": byte_count,
    "resources": parse_resources,
}
# One spec (e.g. FRAY_BACKEND) serves fray.init and fray.cluster, so both accept every option and use their own.
_OPTIONS: dict[str, Any] = {
    "address": non_empty_text,
    "namespace": non_empty_text,
    "log_to_driver": flag,
    "working_dir": directory,
    "gpu_view": gpu_view,
    **_SIZING,
}
_JOB_ONLY = ("namespace", "log_to_driver")
_CLUSTER_ONLY = ("working_dir",)


def _parse(options: dict[str, Any]) -> dict[str, Any]:
    """The spec's options (converted by `_OPTIONS` in fray-core), `gpus` as Ray's `num_gpus` (one spec means the
    same on every backend); gpu_view=host refused."""
    parsed = dict(options)
    if parsed.pop("gpu_view", "held") != "held":
        raise UnsupportedFeatureError(
            Capability.GPU_HOST_VIEW,
            "ray",
            "gpu_view=host: Ray sets each worker's CUDA_VISIBLE_DEVICES to the GPUs it assigned that worker, so a "
            "worker sees only its own (gpu_view=held); on monarch and in_memory, gpu_view=host shows every GPU of "
            "the host",
        )
    if "gpus" in parsed:
        if "num_gpus" in parsed and parsed["num_gpus"] != parsed["gpus"]:
            raise ValueError("ray: gpus and num_gpus are one option (the GPUs of this Ray); give one of them")
        parsed["num_gpus"] = parsed.pop("gpus")
    return parsed


class RayBackend(Backend):
    """The `ray` entry of the "fray.backends" entry-point group."""

    name = "ray"
    # A fast private local cluster for the conformance suite: 4 logical CPUs (even on a 2-core box, so that
    # 100-concurrent-task tests do not queue), 2 declared GPUs (one Ray per process: the GPU tests use this one),
    # a small object store, and no late worker prints.
    test_spec: ClassVar[str] = "ray?num_cpus=4&num_gpus=2&object_store_memory=300000000&log_to_driver=false"
    # A private head node with the Job API (its own process group and temp dir), stopped at shutdown.
    cluster_test_spec: ClassVar[str] = "ray?num_cpus=2&object_store_memory=200000000"

    options = _OPTIONS

    @property
    def capabilities(self) -> frozenset[Capability]:
        from fray_ray.cluster import RayClusterContext

        return RayJobContext.capabilities | RayClusterContext.capabilities

    def job_context(self, **options: Any) -> RayJobContext:
        parsed = _parse(options)
        recording = choose_recording(True)
        try:
            return RayJobContext(**{k: v for k, v in parsed.items() if k not in _CLUSTER_ONLY}, _recording=recording)
        except BaseException:
            recording.release()
            raise

    def diagnose(self) -> dict[str, str]:
        """For `fray doctor`: Ray's version, where fray would find a cluster, and the one `fray cluster start`
        recorded (nothing is started)."""
        import ray

        from fray_ray import persistent

        address = os.environ.get("RAY_ADDRESS")
        record = persistent.recorded()
        if record is None:
            recorded = "none (fray cluster start --backend ray starts one)"
        else:
            state = "running" if record["running"] else "not running any more"
            recorded = f"{record.get('address')} (pid {record.get('pid')}, {state})"
        return {
            "ray": ray.__version__,
            "RAY_ADDRESS": address or "not set: fray.init('ray') starts a private local Ray, stopped at shutdown",
            "recorded cluster": recorded,
        }

    def context_here(self) -> RayJobContext | None:
        """Inside a Ray worker: its fray context (a context pickled into a task's arguments lands here before the
        task runs, so before the worker's context is made current)."""
        import ray

        if not ray.is_initialized() or ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
            return None
        from fray_ray import _remote

        _remote.enter_worker()
        return _remote.worker_context()  # type: ignore[no-any-return]

    def cluster_context(self, **options: Any) -> Any:
        from fray_ray.cluster import RayClusterContext

        parsed = _parse(options)
        return RayClusterContext(**{k: v for k, v in parsed.items() if k not in _JOB_ONLY})

    # ------------------------------------------------------------------ for the `fray` command (fray.jobs_cli)
    def persistent_address(self) -> tuple[str | None, str]:
        """Where `fray job ...` finds jobs when no address is given: RAY_ADDRESS (a dashboard URL, as for `ray
        job`), else the head `fray cluster start` recorded if it runs. (address or None, why there is none)."""
        if os.environ.get("RAY_ADDRESS"):
            return os.environ["RAY_ADDRESS"], ""
        from fray_ray import persistent

        record = persistent.recorded()
        if record is not None and record["running"]:
            return str(record["address"]), ""
        if record is not None:
            return None, (
                f"The cluster recorded in the state directory (pid {record.get('pid')}) is not running any more: "
                "`fray cluster start --backend ray` starts a new one."
            )
        return None, (
            "Start one with `fray cluster start --backend ray` (stop it with `fray cluster stop --backend ray`), or "
            "give the dashboard address of yours with --address or RAY_ADDRESS."
        )

    def start_cluster(self, listen: str, **options: Any) -> tuple[dict[str, Any], bool]:
        """`fray cluster start`: a head that outlives the command (sized by the spec's num_cpus, num_gpus,
        object_store_memory, resources), recorded in the state directory. (its record, started now?)"""
        from fray_ray import persistent

        parsed = _parse(options)
        other = sorted(set(parsed) - set(_SIZING))
        if other:
            raise ValueError(
                f"fray cluster start takes sizing options only ({', '.join(sorted(_SIZING))}), not {other}"
            )
        record, started = persistent.start(listen=listen, **parsed)
        record["notes"] = [
            f'from Python: fray.cluster("ray?address={record["address"]}") for jobs, '
            f'fray.init("ray?address={record["gcs_address"]}") for tasks and actors'
        ]
        return record, started

    def stop_cluster(self) -> dict[str, Any] | None:
        """`fray cluster stop`: stop the recorded head and its jobs (None: none was recorded)."""
        from fray_ray import persistent

        return persistent.stop()


def __getattr__(name: str) -> Any:
    if name == "RayClusterContext":
        from fray_ray.cluster import RayClusterContext

        return RayClusterContext
    raise AttributeError(name)
