"""Option and status types shared by every backend (compatible with the earlier Fray API)."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ActorOptions",
    "JobAttempt",
    "JobError",
    "JobInfo",
    "JobStatus",
    "Lifetime",
    "Resource",
    "RuntimeEnv",
    "TaskOptions",
    "normalize_resources",
]


class Lifetime(enum.Enum):
    """EPHEMERAL actors die with the context that created them; DETACHED actors outlive it."""

    EPHEMERAL = "ephemeral"
    DETACHED = "detached"


class JobStatus(str, enum.Enum):
    """The one job status enum shared by all backends. A str, as the earlier Fray's was: it compares equal to
    its value (`status == "SUCCEEDED"`, `"FAIL" in status`) and prints as it (`str(s) == f"{s}" == "SUCCEEDED"`)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def _check_quantity(what: str, quantity: object) -> float:
    if isinstance(quantity, bool) or not isinstance(quantity, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(quantity).__name__}")
    if math.isnan(quantity) or quantity < 0:
        raise ValueError(f"{what} cannot be negative: must be >= 0, got {quantity}")
    return float(quantity)


@dataclass(frozen=True)
class Resource:
    """A named quantity: "CPU", "GPU", "memory" (bytes) or any custom resource name."""

    name: str
    quantity: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Resource name must be a non-empty string, got {self.name!r}")
        _check_quantity(f"Resource {self.name!r} quantity", self.quantity)


def normalize_resources(resources: Mapping[str, float] | None, what: str = "resources") -> dict[str, float]:
    """Validate a resource mapping: string keys, non-negative numbers. Zero entries are dropped."""
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise TypeError(f"{what} must be a dict like {{'CPU': 1}}, got {type(resources).__name__}")
    out: dict[str, float] = {}
    for key, value in resources.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{what}: resource names must be non-empty strings, got {key!r}")
        quantity = _check_quantity(f"{what}[{key!r}]", value)
        if key == "GPU" and quantity > 1 and not quantity.is_integer():
            raise ValueError(
                f"{what}['GPU'] = {quantity:g}: a fraction of one GPU (below 1) shares that device with other work; "
                f"more than one GPU must be a whole number of devices (as in Ray): ask for {math.floor(quantity)} "
                f"or {math.ceil(quantity)}"
            )
        if quantity:
            out[key] = quantity
    return out


@dataclass(frozen=True)
class RuntimeEnv:
    """The environment a task or job runs in. Validated on construction."""

    package_requirements: Sequence[str] = field(default_factory=list)
    minimum_resources: Sequence[Resource] = field(default_factory=list)
    maximum_resources: Sequence[Resource] = field(default_factory=list)
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.package_requirements, str):
            raise TypeError("package_requirements must be a list of strings, not one string")
        for req in self.package_requirements:
            if not isinstance(req, str):
                raise TypeError(f"package_requirements entries must be strings, got {req!r}")
            if not req.strip():
                raise ValueError("package_requirements cannot contain empty strings (an empty requirement)")
        if not isinstance(self.env, Mapping):
            raise TypeError(f"env must be a dict of str to str, got {type(self.env).__name__}")
        for key, value in self.env.items():
            if not isinstance(key, str):
                raise TypeError(f"env keys must be strings: env entries must be str to str, got key {key!r}")
            if not isinstance(value, str):
                raise TypeError(f"env values must be strings: env entries must be str to str, got {key!r}: {value!r}")
            if not key or "=" in key:
                raise ValueError(f"env variable name {key!r} is not valid")
        for group in (self.minimum_resources, self.maximum_resources):
            for res in group:
                if not isinstance(res, Resource):
                    raise TypeError(f"resource limits must be Resource objects, got {res!r}")
        minimum = {r.name: r.quantity for r in self.minimum_resources}
        for res in self.maximum_resources:
            if res.name in minimum and minimum[res.name] > res.quantity:
                raise ValueError(
                    f"minimum_resources {res.name} ({minimum[res.name]}) exceeds maximum_resources "
                    f"{res.name} ({res.quantity}): minimum is greater than maximum"
                )

    @property
    def is_empty(self) -> bool:
        return not (self.package_requirements or self.env or self.minimum_resources or self.maximum_resources)


def _check_optional_int(what: str, value: object, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class TaskOptions:
    """Per-task options.

    resources: e.g. {"CPU": 2, "GPU": 1, "memory": 2**30, "my_tag": 1}; default {"CPU": 1}.
    max_retries: how many times a task whose worker process crashed is re-run (default 3, as in Ray);
        application exceptions are retried only when retry_exceptions is True or lists the exception's type.
    max_calls: recycle the worker process after this many calls of this function (process backends).
    streaming: fn is a generator; create_task returns an ObjectRefStream with one ref per item it yields.
    """

    resources: Mapping[str, float] | None = None
    runtime_env: RuntimeEnv | None = None
    name: str | None = None
    max_calls: int | None = None
    max_retries: int = 3
    retry_exceptions: bool | Sequence[type[BaseException]] = False
    streaming: bool = False

    def __post_init__(self) -> None:
        normalize_resources(self.resources, "TaskOptions.resources")
        if not isinstance(self.streaming, bool):
            raise TypeError(f"streaming must be a bool, got {self.streaming!r}")
        if self.runtime_env is not None and not isinstance(self.runtime_env, RuntimeEnv):
            raise TypeError(f"runtime_env must be a fray.RuntimeEnv, got {type(self.runtime_env).__name__}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {self.name!r}")
        _check_optional_int("max_calls", self.max_calls, 1)
        _check_optional_int("max_retries", self.max_retries, -1)
        if not isinstance(self.retry_exceptions, bool):
            for exc_type in self.retry_exceptions:
                if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                    raise TypeError(f"retry_exceptions must be a bool or a list of exception types, got {exc_type!r}")

    def should_retry(self, exc: BaseException) -> bool:
        if self.retry_exceptions is True:
            return True
        if self.retry_exceptions is False:
            return False
        return isinstance(exc, tuple(self.retry_exceptions))


@dataclass(frozen=True)
class ActorOptions:
    """Per-actor options.

    resources are held for the actor's whole life (default: none, as Ray actors hold 0 CPU while running).
    max_restarts: how many times a crashed actor process is brought back (fresh state; -1 = forever).
    max_concurrency: how many calls may run at once (1 = strictly one at a time, in order).
    """

    name: str | None = None
    get_if_exists: bool = False
    resources: Mapping[str, float] | None = None
    lifetime: Lifetime = Lifetime.EPHEMERAL
    max_restarts: int = 0
    max_concurrency: int = 1

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"actor name must be a non-empty str, got {self.name!r}")
        if self.get_if_exists and self.name is None:
            raise ValueError("get_if_exists=True needs a name")
        normalize_resources(self.resources, "ActorOptions.resources")
        if not isinstance(self.lifetime, Lifetime):
            raise TypeError(f"lifetime must be a fray.Lifetime, got {self.lifetime!r}")
        if self.lifetime is Lifetime.DETACHED and self.name is None:
            raise ValueError("a DETACHED actor needs a name, or nothing could ever find it again")
        _check_optional_int("max_restarts", self.max_restarts, -1)
        _check_optional_int("max_concurrency", self.max_concurrency, 1)


@dataclass(frozen=True)
class JobInfo:
    """What a ClusterContext knows about one job. Times are UNIX seconds (None until they happen)."""

    id: str
    status: JobStatus
    submission_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    entrypoint: str = ""
    exit_code: int | None = None
    message: str = ""
    # Known for jobs fray supervises (a callable, ranks or retries: fray.jobs.supervisor), from its log's record:
    name: str | None = None  # the name it was submitted under (create_job(name=...)), else None
    replicas: int = 1  # its ranks (an elastic job's: its latest attempt's)
    attempts: tuple[JobAttempt, ...] = ()  # each attempt so far, oldest first
    result: Any = None  # a callable's return value (rank 0's), where it is plain data (see docs/jobs.md)
    error: JobError | None = None  # a callable's exception, or why the last attempt failed
    # The ids of the jobs it was submitted to wait for (create_job(after=...)), while it has not started: pending on
    # them, or ended without running because one of them did not succeed. () for a job that started.
    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobAttempt:
    """One run of a job's ranks: its number (from 1), how it ended, the exit code that ended it (the first rank
    to fail, else 0), its times, and what happened in words. `outcome` is its class: "succeeded", "failed",
    "lost" (preempted, or a rank's node lost) or "stopped" ("" while it runs, or where no supervisor judged it);
    `grace` is how many seconds its ranks had between SIGTERM and their end (None: none was sent); `world_size` how
    many ranks it ran (an elastic job's may differ from one attempt to the next; None where no supervisor said)."""

    number: int
    status: JobStatus
    exit_code: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    message: str = ""
    outcome: str = ""
    grace: float | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class JobError:
    """An exception raised by a job's callable: its type's name, its message and its traceback, as text."""

    type: str
    message: str
    traceback: str = ""
    rank: int = 0
