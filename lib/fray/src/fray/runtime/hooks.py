"""What a backend implements: the hooks of a JobContext, each with the rule it must keep (docs/testing.md,
"Writing a backend", lists the rules with the `fray.*` helpers that keep them).

`JobContext` (fray.context) is a `JobContextHooks`: its public methods check every argument and apply the shared
rules, then call one hook. So a hook never sees bad input, a ref or handle of another backend, a capability the
backend lacks (refused by name first), an infeasible resource request, or a shut-down context: it does not check
them again. Hooks run on the caller's thread (the driver's, or a task's own), concurrently from several threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from fray.errors import UnsupportedFeatureError
from fray.runtime.capabilities import Capability
from fray.runtime.groups import ActorGroup, Member
from fray.runtime.outcome import Outcome
from fray.runtime.refs import ActorHandle, ObjectRef
from fray.runtime.requests import ActorRequest, TaskRequest
from fray.runtime.streams import ObjectRefStream
from fray.telemetry.events import ProcessEvents
from fray.telemetry.transfers import PathStats

__all__ = ["JobContextHooks"]


class JobContextHooks(ABC):
    """The hooks of a JobContext. Required ones are abstract; the others have a default that works everywhere and
    that a backend overrides where its engine does better."""

    backend: ClassVar[str] = "?"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # True where `_outcomes` callbacks run outside the backend's locks, so one may submit work (the executor
    # starts its next queued task there); else the executor waits for `_future` (monarch settles outcomes under
    # its controller's lock).
    outcome_callbacks_may_submit: ClassVar[bool] = False

    # ----------------------------------------------------------------- required
    @abstractmethod
    def node_resources(self) -> list[dict[str, float]]:
        """The total resources of each node ({"CPU": 8, "GPU": 2, "memory": bytes, custom...}): the core refuses a
        task or actor that fits none of them (`InfeasibleResourcesError`), so a hook never waits for the
        impossible. Called again when a request does not fit (nodes come and go)."""

    @abstractmethod
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRef:
        """Start fn(*args, **kwargs) where the engine runs work; return at once a ref to its result.
        - Top-level ObjectRef arguments arrive as their values (the task starts once they are ready; a failed one
          fails the task with that ref's own error); refs nested in containers arrive as refs
          (`fray.runtime.refs.top_level_refs` and `with_values`).
        - The function, arguments and result travel as a cluster would carry them:
          `fray.runtime.serialization.dumps_call` and `loads`, whose errors (`SerializationError` naming the
          argument, via `find_unserializable_argument`) are the ones the suite matches.
        - User code runs with the context current and lent (`fray.runtime.current.push(ctx, lent=True)`): a `shutdown()`
          inside it is a no-op, and `fray.get_job_context()` finds it.
        - A task that waits in get/wait lends its resources while it waits (else 10-deep nesting deadlocks).
        - request (fray.runtime.requests, computed once by the core): `resources` (held while it runs), `name`
          (its events' name), and `options`: max_retries and retry_exceptions (`options.should_retry`),
          runtime_env (env vars only where the backend has task_env_vars)."""

    @abstractmethod
    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle:
        """Create klass(*args, **kwargs) in one place and return its handle at once (a failing __init__ fails its
        calls with that error); it holds `request.resources` for its whole life. With `options = request.options`:
        its calls run one at a time in submission order unless options.max_concurrency says more;
        `fray.current_actor()` inside them tells its name and restarts (`fray.runtime.current.push_actor`).
        options.name: unique among live actors of the namespace (`get_if_exists` returns the live one, else
        `ActorAlreadyExistsError`); max_restarts: a process death restarts it with fresh state (-1: always).
        member: it is a member of a group being created (its rank, the group, the SPMD environment to set)."""

    @abstractmethod
    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        """Call handle's method; return at once a ref to its result. Calls from one caller run in the order they
        were made; arguments follow `_create_task`'s rules. A call to a dead actor fails with ActorDiedError (one
        restarting: ActorUnavailableError)."""

    @abstractmethod
    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        """The values of refs (at least one), in order. Raise as soon as one ref failed, the first failed one in
        list order, with the task's own exception type (`fray.runtime.remote_errors.RemoteError.rebuild`), without
        waiting for the others; `GetTimeoutError` once `timeout` seconds (the whole call's) pass. A value read twice is
        equal both times; a numpy array or tensor from the store is read-only unless the backend copies it."""

    @abstractmethod
    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        """Indices of refs that are complete (a failed one counts): at least num_returns (1 <= num_returns <=
        len(refs)) unless `timeout` passed first, which is no error. Never fetches a value."""

    @abstractmethod
    def _put(self, obj: Any) -> ObjectRef:
        """Store a copy of obj (later changes to obj do not change what get returns); obj is never an ObjectRef."""

    @abstractmethod
    def _get_actor(self, name: str) -> ActorHandle:
        """The live actor named `name` in this context's namespace; `ActorNotFoundError` if none."""

    @abstractmethod
    def _kill(self, handle: ActorHandle) -> None:
        """Stop the actor now, with no restart: its pending and later calls fail with ActorDiedError, its name is
        free at once. Killing a dead actor does nothing."""

    @abstractmethod
    def _cancel(self, ref: ObjectRef) -> bool | None:
        """Cancel the task behind ref: queued, it never runs and its get raises TaskCancelledError; running,
        interrupt it (capability cancel_running) or, lacking that, leave it running and return False (the core
        then raises UnsupportedFeatureError naming cancel_running); finished, leave it alone. An actor call not
        started yet is dropped the same way."""

    @abstractmethod
    def _shutdown(self) -> None:
        """Release everything this context started (processes, stored values, names), once: the core calls it
        exactly once, and never for a context that does not own what it started (a worker's)."""

    # ----------------------------------------------------------------- with a default
    def _transfer_stats(self) -> dict[str, PathStats]:
        """Reads of stored values so far by path (`fray.telemetry.transfers.TransferStats`, summed over the processes
        the
        backend can ask; a path's name from `KNOWN_PATHS` where the bytes took that way, else its own). Counts
        only grow. Default: none (the conformance suite expects a backend that stores values to count them)."""
        return {}

    def _pull_events(self) -> list[ProcessEvents]:
        """The events the other processes of this context recorded since the last pull (fray.telemetry.events), as plain
        data (`ProcessEvents.from_json`: never unpickled); this process's own are read by the core. Default: none
        (every event happens in this process)."""
        return []

    def _engine_links(self) -> dict[str, str]:
        """The engine's own pages for this job (a name -> its http(s) URL, no secret in it: Ray's dashboard where
        the cluster runs one), shown on the live page. Default: none."""
        return {}

    def _outcomes(self, refs: list[ObjectRef]) -> list[Outcome] | None:
        """The backend's own completion of each ref (fray.runtime.outcome: settled once, with the value's absence or the
        error), if it has one: as_completed, progress bars and `_future` read it. None (default): one watcher
        thread per context polls `_wait` (fray.runtime.completion)."""
        return None

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        """Call `method` on every member, one ref per member in rank order. Default: member by member."""
        return [self._call_actor(handle, method, args, kwargs) for handle in group.handles]

    def _kill_group(self, group: ActorGroup) -> None:
        """Kill every member (as `_kill`). Default: member by member."""
        for handle in group.handles:
            self._kill(handle)

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRefStream:
        """A generator task: an ObjectRefStream of one ref per item, in order, each as it is produced; the
        generator's error ends the stream there (capability streaming)."""
        raise UnsupportedFeatureError(Capability.STREAMING, self.backend, "TaskOptions(streaming=True)")

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        """A generator method's stream, as `_create_stream_task` (capability streaming)."""
        raise UnsupportedFeatureError(Capability.STREAMING, self.backend, f"{handle.class_name}.{method}.stream()")
