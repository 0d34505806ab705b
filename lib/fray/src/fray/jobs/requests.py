"""What create_job makes of its arguments before a backend sees them: a job's name and the ids it takes, the
command that supervises ranks, retries and callables (fray.jobs.supervisor), and the resources a whole job holds.

Names. A named job's ids are `name.1`, `name.2`, ... one per run (a name has no dot, so no name is also such an
id, and a name alone means its latest run). A backend creates a job under a given id atomically or refuses
(JobExistsError), so of several submitters racing with one name exactly one creates the job and the others find it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle

from fray.errors import InfeasibleResourcesError
from fray.jobs.call import CALL_VAR, encode_call
from fray.jobs.elastic import fitting, replica_bounds
from fray.jobs.policy import GRACE_VAR, JobPolicy
from fray.runtime.resources import format_resources, ranks_fitting, short_of
from fray.types import JobInfo, Resource, normalize_resources

__all__ = [
    "IF_EXISTS",
    "ONE_NODE",
    "PLACEMENTS",
    "JobLaunch",
    "check_name",
    "checked_command",
    "is_name",
    "latest_run",
    "launch_of",
    "name_of",
    "next_id",
    "parse_resources",
    "place",
    "run_of",
]

IF_EXISTS = ("return", "replace", "refuse")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_NAMED_ID = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_-]{0,62})\.(?P<run>[1-9][0-9]*)")
SUPERVISOR = ("-m", "fray.jobs.supervisor")
PLACEMENTS = (None, "pack", "spread")
# A job's ranks as a group all on one node, each rank seeing only its own GPUs, waiting while that node's resources
# are busy: as on the job's host, but apart from its first process (a backend's ClusterContext.ranks_apart).
ONE_NODE = "node"


def is_name(text: str) -> bool:
    return bool(_NAME.fullmatch(text))


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"job name {name!r} is not valid: 1-63 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name


def name_of(job_id: str) -> tuple[str, int] | None:
    """(name, run) of an id a name made, else None."""
    match = _NAMED_ID.fullmatch(job_id)
    if match is None:
        return None
    return match["name"], int(match["run"])


def run_of(job_id: str, name: str) -> int:
    """The run number of `job_id` if it is a run of `name`, else 0."""
    parsed = name_of(job_id)
    return parsed[1] if parsed is not None and parsed[0] == name else 0


def next_id(name: str, jobs: Sequence[JobInfo]) -> str:
    """The id a new run of `name` takes: one after the highest run listed."""
    return f"{name}.{max((run_of(info.id, name) for info in jobs), default=0) + 1}"


def latest_run(jobs: Sequence[JobInfo], name: str) -> str:
    """The id of the highest run of `name` among `jobs` (runs of it all)."""
    return max(jobs, key=lambda info: run_of(info.id, name)).id


def checked_command(entrypoint: object) -> str | list[str]:
    if isinstance(entrypoint, str):
        if not entrypoint.strip():
            raise ValueError("entrypoint must not be empty")
        return entrypoint
    if isinstance(entrypoint, (list, tuple)):
        if not entrypoint or not all(isinstance(a, str) for a in entrypoint):
            raise TypeError("an argv entrypoint must be a non-empty list of strings")
        return list(entrypoint)
    raise TypeError(f"entrypoint must be a str, a list of str or a callable, got {type(entrypoint).__name__}")


def parse_resources(resources: Mapping[str, float] | None) -> dict[str, float]:
    """Resources of one rank, by name (CPU, GPU, memory in bytes, custom), checked as tasks' are."""
    return normalize_resources(resources, "create_job(resources=...)")


@dataclass(frozen=True)
class JobLaunch:
    """A job's shape beyond its command: its ranks, budgets and grace (fray.jobs.policy), callable and each rank's
    resources. An elastic job (min_replicas set: fray.jobs.elastic) has `replicas` ranks at most, and once placed
    on one host exactly that many."""

    replicas: int = 1
    policy: JobPolicy = field(default_factory=JobPolicy)
    per_rank: dict[str, float] = field(default_factory=dict)
    call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = None
    placement: str | None = None  # None: every rank on the job's host; "pack"/"spread": a group over the nodes;
    # ONE_NODE: a group on one node
    min_replicas: int | None = None  # elastic: at least this many ranks (None: exactly `replicas`)

    def __post_init__(self) -> None:
        replica_bounds(self.replicas if self.min_replicas is None else (self.min_replicas, self.replicas))
        if self.placement not in (*PLACEMENTS, ONE_NODE):
            _bad_placement(self.placement)
        gpus = self.per_rank.get("GPU", 0.0)
        if gpus != int(gpus):
            raise ValueError(f"a job's rank holds whole GPUs, got resources GPU={gpus}")

    @property
    def on_one_node(self) -> bool:
        """Whether its ranks run together on one node (the job's host, or ONE_NODE)."""
        return self.placement in (None, ONE_NODE)

    @property
    def supervised(self) -> bool:
        elastic = self.min_replicas is not None  # (its record says each attempt's world size)
        return self.call is not None or self.replicas > 1 or elastic or self.policy.max_retries > 0 or self.policy.asked

    def whole_job(self) -> list[Resource]:
        """What the job's own process holds: each rank's resources times the ranks, on one host; nothing when its
        ranks are a group over the nodes (the group's members hold them, each its own)."""
        if self.placement is not None:
            return []
        return [Resource(name, qty * self.replicas) for name, qty in self.per_rank.items()]

    def over_nodes(self, placement: str | None) -> JobLaunch:
        return replace(self, placement=placement)

    def command(self, entrypoint: str | list[str] | None, python: str) -> list[str]:
        """The supervisor's argv for this job (entrypoint None: the callable)."""
        argv = [python, *SUPERVISOR]
        if self.min_replicas is not None and not self.on_one_node:  # counted at each attempt's start
            argv += ["--replicas", f"{self.min_replicas}:{self.replicas}"]
        elif self.replicas > 1:
            argv += ["--replicas", str(self.replicas)]
        if self.policy.max_retries:
            argv += ["--retries", str(self.policy.max_retries)]
        argv += self.policy.argv()
        if self.placement is not None:
            argv += ["--placement", self.placement, "--rank-resources", json.dumps(self.per_rank)]
        elif self.per_rank.get("GPU"):
            argv += ["--gpus-per-rank", str(int(self.per_rank["GPU"]))]
        if entrypoint is None:
            assert self.call is not None
            fn = self.call[0]
            label = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
            return [*argv, "--call", label]
        if isinstance(entrypoint, str):
            return [*argv, "--", "/bin/sh", "-c", entrypoint]
        return [*argv, "--", *entrypoint]

    def call_env(self) -> dict[str, str]:
        """The variables of a supervised job: its ranks' grace (which its backend waits for before SIGKILL), and
        FRAY_JOB_CALL for a callable: SerializationError (naming what) or ValueError (too big) now, at submission,
        rather than in the job."""
        grace = {GRACE_VAR: repr(self.policy.stop_grace)}
        if self.call is None:
            return grace
        fn, args, kwargs = self.call
        where = getattr(fn, "__qualname__", repr(fn))
        try:
            cloudpickle.dumps(fn)
        except Exception as exc:
            # (the serializer's diagnosis only on this failure: a job's supervisor imports this module, not it)
            from fray.runtime.serialization import unpicklable_code

            raise unpicklable_code(fn, exc) from exc
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            from fray.runtime.serialization import find_unserializable_argument

            raise find_unserializable_argument(where, args, kwargs, exc) from exc
        return {**grace, CALL_VAR: encode_call(payload)}


def _bad_placement(placement: object) -> None:
    raise ValueError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, got {placement!r}")


def launch_of(
    entrypoint: object,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    policy: JobPolicy,
    replicas: int | tuple[int, int],
    resources: Mapping[str, float] | None,
    placement: str | None,
) -> JobLaunch:
    """create_job's arguments beyond the command, checked."""
    call = None
    if callable(entrypoint) and not isinstance(entrypoint, (str, list, tuple)):
        if not isinstance(args, (list, tuple)):
            raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
        call = (entrypoint, tuple(args), dict(kwargs or {}))
    elif args or kwargs:
        raise TypeError("args and kwargs go with a callable entrypoint; a command takes its arguments in it")
    if placement not in PLACEMENTS:
        _bad_placement(placement)
    low, high = replica_bounds(replicas)
    elastic = isinstance(replicas, (tuple, list))
    return JobLaunch(high, policy, parse_resources(resources), call, placement, low if elastic else None)


def place(
    launch: JobLaunch, nodes: Callable[[], list[dict[str, Any]]], multi_host: bool, backend: str, apart: bool = False
) -> JobLaunch:
    """Where a job's ranks go (create_job's placement), checked against the nodes' totals (`nodes()`: a
    ClusterContext's node_status): a job whose ranks could never be placed is refused now
    (InfeasibleResourcesError), as a task or a group is. `apart` (ClusterContext.ranks_apart): a supervised job's
    ranks that hold resources and have no placement are a group on one node (ONE_NODE), the job's first process
    holding nothing."""
    if apart and launch.placement is None and launch.per_rank and launch.supervised:
        launch = launch.over_nodes(ONE_NODE)
    if launch.min_replicas is not None:
        return _place_elastic(launch, nodes, multi_host, backend)
    if not launch.per_rank or (launch.replicas == 1 and launch.placement is None):
        return launch  # (one rank on the job's host: the backend's own check of a job's resources applies)
    if launch.placement is None and not multi_host:
        return launch  # one node: the backend's own check of a job's resources applies
    totals = [dict(node["total"]) for node in nodes() if node.get("total")]
    if not totals:
        return launch  # nothing known of the nodes: the backend decides when the job runs
    whole = {name: qty * launch.replicas for name, qty in launch.per_rank.items()}
    if launch.on_one_node:
        if any(not short_of(total, whole) for total in totals):
            return launch  # they fit one node: all on it
        launch = launch.over_nodes("pack")
    held = sum(ranks_fitting(total, launch.per_rank) for total in totals)
    if held < launch.replicas:
        raise InfeasibleResourcesError(
            f"the job's {launch.replicas} ranks need {format_resources(launch.per_rank)} each, and the "
            f"{len(totals)} node(s) of this {backend} cluster hold {held} such ranks at most; lower its "
            "replicas or resources"
        )
    return launch


def _place_elastic(
    launch: JobLaunch, nodes: Callable[[], list[dict[str, Any]]], multi_host: bool, backend: str
) -> JobLaunch:
    """An elastic job's ranks (fray.jobs.elastic). On the job's host, as many as the largest node's totals hold, up
    to max: the job holds their resources from its start, so each of its attempts has that many. Over the nodes
    (placement, or where more fit over them than on one), the supervisor counts them at each attempt's start
    against the nodes then. Fewer than min could ever fit: refused now, as a fixed job of min ranks would be."""
    assert launch.min_replicas is not None
    low, high = launch.min_replicas, launch.replicas
    if not launch.per_rank:
        return launch  # nothing limits them: max ranks
    totals = [dict(node["total"]) for node in nodes() if node.get("total")]
    if not totals:  # nothing known of the nodes: min ranks, and the backend decides when they run
        return replace(launch, replicas=low) if launch.on_one_node else launch
    one, every = fitting(totals, launch.per_rank)
    if not multi_host:
        every = one
    if launch.on_one_node and one < high and every > one:
        launch = launch.over_nodes("pack")
    most = one if launch.on_one_node else every
    if most < low:
        raise InfeasibleResourcesError(
            f"the job's ranks need {format_resources(launch.per_rank)} each, and the {len(totals)} node(s) of this "
            f"{backend} cluster hold {most} such ranks at most{' on one node' if launch.on_one_node else ''}, "
            f"fewer than its min of {low}; lower its min replicas or resources"
        )
    return replace(launch, replicas=min(high, most)) if launch.on_one_node else launch
