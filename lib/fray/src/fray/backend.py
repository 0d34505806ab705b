"""The backend contract: what a backend provides, in one place (docs/testing.md, "Writing a backend").

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
from typing import Any, ClassVar, Protocol, runtime_checkable

from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.runtime.capabilities import Capability
from fray.runtime.groups import Member

__all__ = ["Backend", "ClusterContext", "JobContext", "Member", "PersistentClusters"]


class Backend(ABC):
    """What an entry point in the "fray.backends" group resolves to (a class or an instance)."""

    name: ClassVar[str] = "?"
    # The spec the conformance suite's JobContext is made from (None: the bare name), and its ClusterContext's
    # (None: test_spec's).
    test_spec: ClassVar[str | None] = None
    cluster_test_spec: ClassVar[str | None] = None
    # The spec options it takes: name -> converter (fray.runtime.options), for init and cluster alike.
    options: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Every capability its contexts have (for listings and docs)."""
        return frozenset()

    @abstractmethod
    def job_context(self, **options: Any) -> JobContext:
        """A new JobContext; options come from the spec's query string and init's keyword arguments (strings,
        but for objects a backend documents, such as monarch's job=)."""

    @abstractmethod
    def cluster_context(self, **options: Any) -> ClusterContext:
        """A new ClusterContext."""

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
        socket guard, preloaded) may start the command again here (exec). The default does nothing."""
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
        """Start and record a cluster for these spec options (or find the running one): (its record, started
        now?)."""
        ...

    def stop_cluster(self) -> dict[str, Any] | None:
        """Stop the recorded cluster and its jobs; its record, or None if none was recorded."""
        ...
