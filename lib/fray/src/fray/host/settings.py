"""Every `FRAY_*` environment variable fray reads or sets, declared once: its name, its default, what it accepts
(a typed converter), the module that reads it, what it does, and whether it is for users or set by fray for its own
processes (internal). The table of docs/settings.md is generated from these declarations (`write_table`);
tests/unit/test_settings.py fails while it is stale, and while a `FRAY_*` name in fray's source is not declared.

A reader asks its setting: `settings.EVENTS.read()` is the value (the default where the variable is unset or
blank), `read(env)` reads another environment (a job's, a task's), `take()` reads and removes it (a value meant for
this process only). A value the converter refuses raises SettingError naming the variable, the value and what it
accepts. A writer names the variable by its declaration: `{settings.JOB_ATTEMPT.name: "2"}`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from fray.errors import FrayError

__all__ = ["SETTINGS", "Kind", "Setting", "SettingError", "docs_table", "lookup", "with_table", "write_table"]

T = TypeVar("T")
K = TypeVar("K", covariant=True)  # a Kind[bool] converts for a Setting[bool | None] too


class SettingError(FrayError, ValueError):
    """A `FRAY_*` variable holds a value its setting does not accept."""


@dataclass(frozen=True)
class Kind(Generic[K]):
    """How a variable's text becomes its value: `convert` raises ValueError for text outside `accepts`."""

    accepts: str  # in words, for errors and the docs
    convert: Callable[[str], K]


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    kind: Kind[T]
    default: T
    reader: str  # the module that reads it
    about: str  # one sentence: what it does
    internal: bool = False  # set by fray in the processes it starts, not by users
    backend: str | None = None  # the backend it belongs to (None: fray-core)
    shown_default: str | None = None  # the default in words, where `default` is decided at use

    def raw(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The variable's text, stripped; None where it is unset or blank."""
        value = environ.get(self.name)
        return value.strip() if value is not None and value.strip() else None

    def is_set(self, environ: Mapping[str, str] = os.environ) -> bool:
        return self.raw(environ) is not None

    def read(self, environ: Mapping[str, str] = os.environ) -> T:
        """The value in `environ`: the default where unset or blank; SettingError where the converter refuses it."""
        text = self.raw(environ)
        if text is None:
            return self.default
        try:
            return self.kind.convert(text)
        except ValueError as exc:
            raise SettingError(
                f"{self.name}={text!r} is not valid ({exc}): it accepts {self.kind.accepts}; unset it for the "
                f"default ({self.default_text()})"
            ) from None

    def take(self, environ: MutableMapping[str, str] = os.environ) -> T:
        """read(environ), and the variable removed from it: a value for this process, not for its children."""
        try:
            return self.read(environ)
        finally:
            environ.pop(self.name, None)

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


# ------------------------------------------------------------------------------------------------- converters
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _flag(text: str) -> bool:
    word = text.lower()
    if word in _ON or word in _OFF:
        return word in _ON
    raise ValueError("not a switch")


def _integer(text: str) -> int:
    return int(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise ValueError("not a number of seconds, 0 or more")
    return value


def _seconds_or_off(text: str) -> float:
    value = float(text)  # 0 or less turns the check off: never
    return math.inf if value <= 0 else value


def _capacity(text: str) -> int:
    return max(1000, int(text))  # a smaller ring would drop a single task's events


def _port_or_any(text: str) -> int | None:
    if text.lower() in _OFF:
        return None
    if text.lower() in _ON:
        return 0
    if text.isdigit() and int(text) < 65536:
        return int(text)
    raise ValueError("neither a switch nor a port number")


def _gpu_ids(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


FLAG = Kind("1, on, true or yes; 0, off, false or no", _flag)
TEXT = Kind("any text", str)
PATH = Kind("a path (~ is expanded)", lambda text: Path(text).expanduser())
INTEGER = Kind("a whole number", _integer)
SECONDS = Kind("a number of seconds, 0 or more", _seconds)
SECONDS_OR_OFF = Kind("a number of seconds (0: off)", _seconds_or_off)
CAPACITY = Kind("a whole number of events (at least 1000 are kept)", _capacity)
PORT_OR_ANY = Kind("1 (any free port), a port number, or 0, off, false or no", _port_or_any)
ID_LIST = Kind("GPU ids, comma-separated", _gpu_ids)
JSON_OBJECT = Kind("a JSON object", _json_object)


# ------------------------------------------------------------------------------------------------- for users
# fmt: off
BACKEND = Setting(
    "FRAY_BACKEND", TEXT, "in_memory", "fray.registry",
    "The backend spec of a bare `fray.init()` / `fray.cluster()` and of the `fray` commands (`ray?namespace=x`).")
EVENTS: Setting[bool | None] = Setting(
    "FRAY_EVENTS", FLAG, None, "fray.telemetry.events",
    "Whether contexts record events for the timeline and the live page; a context's `events` option overrides it.",
    shown_default="the backend's choice (in_memory off, ray and monarch on)")
EVENTS_CAPACITY = Setting(
    "FRAY_EVENTS_CAPACITY", CAPACITY, 100_000, "fray.telemetry.events",
    "How many events each process keeps in its ring before it drops the oldest.", shown_default="100,000")
DASHBOARD: Setting[int | None] = Setting(
    "FRAY_DASHBOARD", PORT_OR_ANY, None, "fray.dashboard",
    "A driver starts its live page at `fray.init()` (on this port, or any free one) and prints its address.",
    shown_default="off")
STATE_DIR: Setting[Path | None] = Setting(
    "FRAY_STATE_DIR", PATH, None, "fray.host.state_dir",
    "Where fray keeps what outlives one process (detached jobs, clusters, named jobs' directories).",
    shown_default="$XDG_STATE_HOME/fray, else ~/.local/state/fray")
SPMD_HANG_TIMEOUT = Setting(
    "FRAY_SPMD_HANG_TIMEOUT", SECONDS_OR_OFF, 30.0, "fray.runtime.gang",
    "Seconds without a heartbeat after which an SPMD member counts as dead (read when a group is created).")
JOB_ATTEMPT = Setting(
    "FRAY_JOB_ATTEMPT", INTEGER, 1, "fray.jobs.dirs",
    "Set by fray in a job's ranks: which attempt of the job this is (1 for the first); programs may read it.")
GPUS = Setting(
    "FRAY_GPUS", ID_LIST, (), "fray.runtime.current",
    "Set by fray in a process it starts for work holding GPUs: their ids (what `fray.current_gpus()` says).",
    shown_default="unset")
PINNED_KEEP_BYTES = Setting(
    "FRAY_PINNED_KEEP_BYTES", INTEGER, 1 << 30, "fray.runtime.pinned",
    "Bytes of pinned host memory (for staging device values) a process keeps for reuse once unused; beyond that, "
    "or after 60 s unused, it gives them back.", shown_default="1073741824 (1 GiB)")
TLS_DIR: Setting[Path | None] = Setting(
    "FRAY_TLS_DIR", PATH, None, "fray_monarch.net.tls",
    "The directory of the user's certificate authority for Monarch's TLS (the same on every host).",
    backend="monarch", shown_default="~/.fray/tls")
MONARCH_DEBUG = Setting(
    "FRAY_MONARCH_DEBUG", FLAG, False, "fray_monarch.driver.client",
    "A `get` that times out also prints the driver's state of its actors and calls to stderr.", backend="monarch")

# ------------------------------------------------------------------------------------------------- internal
REGISTERED_BACKENDS: Setting[dict[str, Any] | None] = Setting(
    "FRAY_REGISTERED_BACKENDS", JSON_OBJECT, None, "fray.registry",
    "The backends registered in a parent process (`register_backend`), for the processes it starts to import.",
    internal=True)
JOB_CALL: Setting[str | None] = Setting(
    "FRAY_JOB_CALL", TEXT, None, "fray.jobs.run_call",
    "A callable job's pickled call (base64), for its ranks.", internal=True)
JOB_CALL_FILE: Setting[Path | None] = Setting(
    "FRAY_JOB_CALL_FILE", PATH, None, "fray.jobs.call",
    "A private file holding FRAY_JOB_CALL's value, where a job's environment is shown to others.", internal=True)
JOB_RESULT_FD: Setting[int | None] = Setting(
    "FRAY_JOB_RESULT_FD", INTEGER, None, "fray.jobs.run_call",
    "The pipe a callable job's rank writes its outcome to.", internal=True)
JOB_NAME: Setting[str | None] = Setting(
    "FRAY_JOB_NAME", TEXT, None, "fray.jobs.dirs",
    "A named job's name, which names its directory (`fray.job_dir()`).", internal=True)
JOB_DIRS: Setting[str | None] = Setting(
    "FRAY_JOB_DIRS", TEXT, None, "fray.jobs.dirs",
    "The cluster's `job_dirs` option (where named jobs' directories are), in its jobs' environment.",
    internal=True, shown_default="the state directory's job-dirs")
JOB_RESUMING: Setting[bool | None] = Setting(
    "FRAY_JOB_RESUMING", FLAG, None, "fray.jobs.dirs",
    "The supervisor's look at the job's directory before an attempt's ranks start (`fray.resuming()`).",
    internal=True)
JOB_OWNER: Setting[int | None] = Setting(
    "FRAY_JOB_OWNER", INTEGER, None, "fray.jobs.supervisor",
    "The process a job dies with (not a detached job's): a supervisor whose owner ended starts no further attempt.",
    internal=True)
JOB_RECOVERY: Setting[str | None] = Setting(
    "FRAY_JOB_RECOVERY", TEXT, None, "fray.jobs.recovery",
    "A supervised job run again after its hosts were lost at once: its attempts so far, the lost one last (JSON).",
    internal=True)
JOB_STOP_GRACE: Setting[float | None] = Setting(
    "FRAY_JOB_STOP_GRACE", SECONDS, None, "fray.jobs.local",
    "A supervised job's ranks' grace between SIGTERM and SIGKILL, in its environment (the backend waits longer).",
    internal=True)
JOB_STOP_SIGNALS_ALL = Setting(
    "FRAY_JOB_STOP_SIGNALS_ALL", FLAG, False, "fray.jobs.supervisor",
    "Set by a backend whose stop signals every process of a job itself, so the supervisor does not signal again.",
    internal=True)
JOB_STOP_MARK: Setting[Path | None] = Setting(
    "FRAY_JOB_STOP_MARK", PATH, None, "fray.jobs.signals",
    "The file whose presence tells a detached job's supervisor that its stop was asked for.", internal=True)
GPU_IDS = Setting(
    "FRAY_GPU_IDS", TEXT, "", "fray.runtime.gpus",
    "Beside a CUDA_VISIBLE_DEVICES of UUIDs or MIG names: the host's id of each entry (`entry=id,...`).",
    internal=True, shown_default="unset")
SPMD_HEARTBEAT: Setting[float | None] = Setting(
    "FRAY_SPMD_HEARTBEAT", SECONDS, None, "fray_ray._remote",
    "Seconds between an SPMD member's heartbeats, in its environment.", internal=True, backend="ray")
GPU_RENDEZVOUS: Setting[str | None] = Setting(
    "FRAY_GPU_RENDEZVOUS", TEXT, None, "fray_ray._gpus",
    "An SPMD member's group life, where its members show each other their GPUs.", internal=True, backend="ray")
SOCKET_GUARD_RESTARTED = Setting(
    "FRAY_SOCKET_GUARD_RESTARTED", FLAG, False, "fray_monarch.socket_guard",
    "Set in a driver started again under the socket guard, so that it is never restarted twice.",
    internal=True, backend="monarch")
TLS_RUNTIME_DIR = Setting(
    "FRAY_TLS_RUNTIME_DIR", TEXT, "", "fray_monarch.net.tls",
    "`<pid>:<dir>`: the process that chose this process's TLS identity paths (unset: the user chose them).",
    internal=True, backend="monarch", shown_default="unset")
TASK_RESOURCES = Setting(
    "FRAY_TASK_RESOURCES", TEXT, "", "fray_monarch.driver.proc_rec",
    "`resource=amount,...`: the capacity of a process sized for tasks bigger than a process's share.",
    internal=True, backend="monarch", shown_default="unset")
# fmt: on

SETTINGS: tuple[Setting[Any], ...] = tuple(v for v in list(globals().values()) if isinstance(v, Setting))


def lookup(name: str) -> Setting[Any]:
    """The setting of the variable `name` (KeyError naming the declared ones if there is none)."""
    for setting in SETTINGS:
        if setting.name == name:
            return setting
    raise KeyError(f"{name} is not a fray setting; fray.host.settings declares {', '.join(s.name for s in SETTINGS)}")


# ------------------------------------------------------------------------------------------------- the docs
BEGIN = "<!-- settings table: generated by fray.host.settings.write_table; edit the declarations, not the table -->"
END = "<!-- end of the settings table -->"


def docs_table() -> str:
    """The Markdown table of every setting, users' first (docs/settings.md holds it between BEGIN and END)."""
    rows = ["| Variable | Default | Accepts | What it does | For |", "| --- | --- | --- | --- | --- |"]
    for setting in sorted(SETTINGS, key=lambda s: (s.internal, s.backend or "", s.name)):
        who = "internal" if setting.internal else "users"
        where = f" ({setting.backend})" if setting.backend else ""
        cells = [f"`{setting.name}`", setting.default_text(), setting.kind.accepts, setting.about, who + where]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def with_table(text: str) -> str:
    """`text` (a docs page) with the table between its BEGIN and END lines made current."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the page has no settings table to replace: it needs the lines {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n{docs_table()}\n{END}{tail}"


def write_table(page: str | Path) -> None:
    """Make the table in `page` current: `python -c 'import fray.host.settings as s; s.write_table("docs/settings.md")'`
    (the docs of this repository; tests/unit/test_settings.py fails while they are stale)."""
    path = Path(page)
    path.write_text(with_table(path.read_text()))
