"""The face for backend writers: the backend contract, what a backend provides (docs/testing.md, "Writing a
backend"), and everything of fray-core a backend builds on, re-exported here. ray, monarch and in_memory import
from this module, `fray` and `fray.errors` only, never from the rooms behind it (fray.runtime, fray.telemetry,
fray.host, fray.jobs), so the rooms can be rearranged without touching a backend (tests/unit/test_core_layout.py).

A backend is a `Backend` (found through the "fray.backends" entry-point group) that makes contexts:

- a `JobContext` (fray.context) implementing the hooks of `fray.runtime.hooks.JobContextHooks`, each documented with the
  rule it keeps: `node_resources`, `_create_task`, `_create_actor` (with `member` for group members),
  `_call_actor`, `_get`, `_wait`, `_put`, `_get_actor`, `_kill`, `_cancel`, `_shutdown`; optionally `_outcomes`,
  `_future`, `_transfer_stats`, `_pull_events`, `_engine_links`, the group hooks (`_create_actor_group`,
  `_call_group`, `_kill_group`) and the streaming hooks. Its `__init__` calls `JobContext.__init__` first (the
  shared lifecycle: shut-down flag, feasibility cache, `owns_resources`). The public methods check every argument
  and enforce the shared semantics before a hook runs, so a hook never sees bad input;
- a `ClusterContext` (fray.cluster_context) implementing `_create_job`, `_list_jobs`, `_get_job`, `_stop_job`,
  `_delete_job`, `_get_job_logs`, `_wait_job`, `_shutdown`;
- what it can and cannot do, as `capabilities` (fray.runtime.capabilities): a missing one with an API is refused by
name.

A backend whose clusters outlive one process (`fray cluster start`) is also a `PersistentClusters`. A distribution
declares its Backend under the "fray.backends" entry point; `fray.register_backend(name, cls)` registers one in
this process (tests, notebooks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from fray._lazy import lazy_face

if TYPE_CHECKING:
    from fray.cluster_context import ClusterContext

    # The contexts a backend subclasses, and the types of the API
    from fray.context import JobContext, set_job_context

    # The machine: processes, children that die with their owner, addresses, the state directory (fray.host)
    from fray.host import procfs, settings, state_dir, watchdog
    from fray.host.net import free_port, free_ports, is_loopback
    from fray.host.procfs import Identity, children_of, end_children, exiting, stop_group
    from fray.host.state_dir import private_dir, state_subdir

    # Jobs run by a backend's ClusterContext (fray.jobs)
    from fray.jobs.call import stash_call
    from fray.jobs.handle import JobHandle
    from fray.jobs.local import LocalJobs, host_resources, read_log_end
    from fray.jobs.policy import GRACE_VAR, OWNER_SIGNALS_ALL_VAR, grace_of, kill_delay
    from fray.jobs.recovery import (
        RECOVERY_VAR,
        ended_before,
        has_record,
        is_supervised,
        log_end_with_record,
        lost_for_good,
        recovery_value,
    )

    # Refs, outcomes, streams, states and capabilities (fray.runtime)
    from fray.runtime import current, worker_output
    from fray.runtime.capabilities import Capability
    from fray.runtime.cuda_values import KeptToken
    from fray.runtime.current import ActorInfo, set_process_actor
    from fray.runtime.device_shares import MemfdBuffer
    from fray.runtime.device_shares.values import SHARED, STAGED
    from fray.runtime.gang import (
        LOST_PEER_GRACE,
        died_error,
        group_label,
        hang_timeout,
        heartbeat_interval,
        hung,
        hung_reason,
        lost_peer,
        restarting_error,
    )
    from fray.runtime.gpus import (
        ENV_HELD,
        DevicePool,
        HostGpus,
        discover,
        gpu_view,
        held_from_env,
        host_gpus,
        no_gpus_env,
        process_env,
        use_held_device,
        using_gpus,
    )

    # Groups and gangs (fray.runtime)
    from fray.runtime.groups import ActorGroup, Member, create_one_by_one, member_name, member_request, spmd_env
    from fray.runtime.lifecycle import ActorState, TaskState
    from fray.runtime.options import (
        byte_count,
        choice,
        count,
        directory,
        flag,
        ip_address,
        non_empty_text,
        non_negative,
        parse_resources,
        port,
        positive_int,
        seconds,
    )
    from fray.runtime.outcome import Outcome, first_failure, wait_for, wait_for_get, when
    from fray.runtime.pool import (
        PAGE,
        POOL_MIN,
        FreeList,
        Piece,
        align,
        buffer_address,
        live_chunks,
        locate,
        pool_piece,
    )
    from fray.runtime.refs import ActorHandle, ObjectRef, async_methods, public_methods, with_values
    from fray.runtime.remote_errors import RemoteError, capture_exception, portable, rebuild
    from fray.runtime.rendezvous import serve_store
    from fray.runtime.requests import ActorRequest, GroupRequest, TaskRequest

    # A call's resources, spec options and GPUs (fray.runtime)
    from fray.runtime.resources import (
        EPS,
        actor_resources,
        add,
        capacity,
        fits,
        format_amount,
        format_resources,
        short_of,
        subtract,
        task_resources,
    )

    # Values: serialization, remote errors, reusable memory, CUDA values (fray.runtime)
    from fray.runtime.serialization import (
        Blob,
        check_function,
        dumps,
        dumps_code,
        find_unserializable_argument,
        loads,
        loads_data,
        note_contained,
        plain_pickle,
    )
    from fray.runtime.streams import ObjectRefStream, StreamSource
    from fray.runtime.worker_env import (
        driver_import_path,
        huge_pages_in_this_process,
        keep_driver_view,
        worker_env_defaults,
    )

    # What happened: events and transfers (fray.telemetry)
    from fray.telemetry.events import (
        CANCELLED,
        ERROR,
        RECORDER,
        Kind,
        ProcessEvents,
        RecordingChoice,
        choose_recording,
        ended,
    )
    from fray.telemetry.transfers import PathStats, TransferStats, device_loads_in, device_stats, merge
    from fray.types import (
        ActorOptions,
        JobInfo,
        JobStatus,
        Lifetime,
        Resource,
        RuntimeEnv,
        TaskOptions,
        normalize_resources,
    )

__getattr__, __dir__ = lazy_face(
    __name__,
    globals(),
    {
        "fray.cluster_context": "ClusterContext",
        "fray.context": "JobContext set_job_context",
        "fray.host.procfs": "procfs Identity children_of end_children exiting stop_group",
        "fray.host.settings": "settings",
        "fray.host.state_dir": "state_dir private_dir state_subdir",
        "fray.host.watchdog": "watchdog",
        "fray.host.net": "free_port free_ports is_loopback",
        "fray.jobs.call": "stash_call",
        "fray.jobs.handle": "JobHandle",
        "fray.jobs.local": "LocalJobs host_resources read_log_end",
        "fray.jobs.policy": "GRACE_VAR OWNER_SIGNALS_ALL_VAR grace_of kill_delay",
        "fray.jobs.recovery": "RECOVERY_VAR ended_before has_record is_supervised log_end_with_record lost_for_good "
        "recovery_value",
        "fray.runtime.current": "current ActorInfo set_process_actor",
        "fray.runtime.worker_output": "worker_output",
        "fray.runtime.capabilities": "Capability",
        "fray.runtime.cuda_values": "KeptToken",
        "fray.runtime.device_shares": "MemfdBuffer",
        "fray.runtime.device_shares.values": "SHARED STAGED",
        "fray.runtime.gang": "LOST_PEER_GRACE died_error group_label hang_timeout heartbeat_interval "
        "hung hung_reason lost_peer restarting_error",
        "fray.runtime.gpus": "ENV_HELD DevicePool HostGpus discover gpu_view held_from_env host_gpus no_gpus_env "
        "process_env use_held_device using_gpus",
        "fray.runtime.groups": "ActorGroup Member create_one_by_one member_name member_request spmd_env",
        "fray.runtime.lifecycle": "ActorState TaskState",
        "fray.runtime.options": "byte_count choice count directory flag ip_address non_empty_text non_negative "
        "parse_resources port positive_int seconds",
        "fray.runtime.outcome": "Outcome first_failure wait_for wait_for_get when",
        "fray.runtime.pool": "PAGE POOL_MIN FreeList Piece align buffer_address live_chunks locate pool_piece",
        "fray.runtime.refs": "ActorHandle ObjectRef async_methods public_methods with_values",
        "fray.runtime.remote_errors": "RemoteError capture_exception portable rebuild",
        "fray.runtime.rendezvous": "serve_store",
        "fray.runtime.requests": "ActorRequest GroupRequest TaskRequest",
        "fray.runtime.resources": "EPS actor_resources add capacity fits format_amount format_resources short_of "
        "subtract task_resources",
        "fray.runtime.serialization": "Blob check_function dumps dumps_code find_unserializable_argument loads "
        "loads_data note_contained plain_pickle",
        "fray.runtime.streams": "ObjectRefStream StreamSource",
        "fray.runtime.worker_env": "driver_import_path huge_pages_in_this_process keep_driver_view worker_env_defaults",
        "fray.telemetry.events": "CANCELLED ERROR RECORDER Kind ProcessEvents RecordingChoice choose_recording ended",
        "fray.telemetry.transfers": "PathStats TransferStats device_loads_in device_stats merge",
        "fray.types": "ActorOptions JobInfo JobStatus Lifetime Resource RuntimeEnv TaskOptions normalize_resources",
    },
)

# fmt: off
__all__ = [
    "CANCELLED", "ENV_HELD", "EPS", "ERROR", "GRACE_VAR", "LOST_PEER_GRACE", "OWNER_SIGNALS_ALL_VAR", "PAGE",
    "POOL_MIN", "RECORDER", "RECOVERY_VAR", "SHARED", "STAGED", "ActorGroup", "ActorHandle",
    "ActorInfo", "ActorOptions", "ActorRequest", "ActorState", "Backend", "Blob", "Capability", "ClusterContext",
    "DevicePool", "FreeList", "GroupRequest", "HostGpus", "Identity", "JobContext", "JobHandle", "JobInfo", "JobStatus",
    "KeptToken", "Kind", "Lifetime", "LocalJobs", "Member", "MemfdBuffer", "ObjectRef", "ObjectRefStream", "Outcome",
    "PathStats", "PersistentClusters", "Piece", "ProcessEvents", "RecordingChoice", "RemoteError", "Resource",
    "RuntimeEnv", "StreamSource", "TaskOptions", "TaskRequest", "TaskState", "TransferStats", "actor_resources", "add",
    "align", "async_methods", "buffer_address", "byte_count", "capacity", "capture_exception", "check_function",
    "children_of", "choice", "choose_recording", "count", "create_one_by_one", "current", "device_loads_in",
    "device_stats", "died_error", "directory", "discover", "driver_import_path", "dumps", "dumps_code", "end_children",
    "ended", "ended_before", "exiting", "find_unserializable_argument", "first_failure", "fits", "flag",
    "format_amount", "format_resources", "free_port", "free_ports", "gpu_view", "grace_of", "group_label",
    "hang_timeout", "has_record", "heartbeat_interval", "held_from_env", "host_gpus", "host_resources",
    "huge_pages_in_this_process", "hung", "hung_reason", "ip_address", "is_loopback", "is_supervised",
    "keep_driver_view", "kill_delay", "live_chunks", "loads", "loads_data", "locate", "log_end_with_record",
    "lost_for_good", "lost_peer", "member_name", "member_request", "merge", "no_gpus_env", "non_empty_text",
    "non_negative", "normalize_resources", "note_contained", "parse_resources", "plain_pickle", "pool_piece", "port",
    "portable", "positive_int", "private_dir", "process_env", "procfs", "public_methods", "read_log_end", "rebuild",
    "recovery_value", "restarting_error", "seconds", "serve_store", "set_job_context", "set_process_actor", "settings",
    "short_of", "spmd_env", "stash_call", "state_dir", "state_subdir", "stop_group", "subtract", "task_resources",
    "use_held_device", "using_gpus", "wait_for", "wait_for_get", "watchdog", "when", "with_values",
    "worker_env_defaults", "worker_output",
]
# fmt: on


class Backend(ABC):
    """What an entry point in the "fray.backends" group resolves to (a class or an instance)."""

    name: ClassVar[str] = "?"
    # The spec the conformance suite's JobContext is made from (None: the bare name), and its ClusterContext's
    # (None: test_spec's).
    test_spec: ClassVar[str | None] = None
    cluster_test_spec: ClassVar[str | None] = None
    # The spec options it takes, all of them: name -> converter (fray.runtime.options), for init and cluster alike.
    # fray-core converts a spec's options by it before calling job_context, cluster_context, prepare_command or
    # start_cluster (fray.registry.backend_options); a name not in it is refused there.
    options: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Every capability its contexts have (for listings and docs)."""
        return frozenset()

    @abstractmethod
    def job_context(self, **options: Any) -> JobContext:
        """A new JobContext; options are the spec's query string and init's keyword arguments, converted by
        `options` (an int for `positive_int`, ...; objects a backend documents, such as monarch's job=, as its
        converter returns them)."""

    @abstractmethod
    def cluster_context(self, **options: Any) -> ClusterContext:
        """A new ClusterContext; options converted by `options` as for job_context (without fray-core's own
        `job_dirs`)."""

    def context_here(self) -> JobContext | None:
        """The JobContext of this process's connection to this backend, if it has one that is not current yet
        (e.g. inside a worker, before the task runs): where a pickled context lands. None: none here."""
        return None

    def diagnose(self) -> dict[str, str]:
        """Lines ("name: value") this backend adds to `fray doctor`'s report; the default adds none."""
        return {}

    def prepare_command(self, options: Mapping[str, Any]) -> None:
        """Called by the `fray` command before it makes a context of this backend in its own process, when nothing
        else has happened yet: a backend whose contexts need something of a process from its start (monarch: its
        socket guard, preloaded) may start the command again here (exec). `options` are converted by `options`.
        The default does nothing."""
        return None


@runtime_checkable
class PersistentClusters(Protocol):
    """A backend whose clusters outlive the command that started them (`fray cluster start|stop`), recorded in
    the state directory where later commands find them. A record is a JSON object with at least "address"; the
    CLI also reads "running", "pid" and "notes" (lines to print)."""

    def persistent_address(self) -> tuple[str | None, str]:
        """Where `fray job ...` finds jobs without --address: (the address, or None and why there is none)."""
        ...

    def start_cluster(self, listen: str, **options: Any) -> tuple[dict[str, Any], bool]:
        """Start and record a cluster for these spec options, converted by the backend's `options` (or find the
        running one): (its record, started now?)."""
        ...

    def stop_cluster(self) -> dict[str, Any] | None:
        """Stop the recorded cluster and its jobs; its record, or None if none was recorded."""
        ...
