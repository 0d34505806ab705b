"""A private Ray instance on this machine: loopback only, its processes in one watched process group, its temp
dir short enough for Ray's Unix sockets, its workers seeing the driver's own modules, and no dashboard or
autoscaler processes (`WithoutHeadExtras`).

A private instance's processes (GCS, raylet, its agents, the log monitor) are started in one new process
group (`GroupedSpawn`), and that group and the temp dir are handed to fray.host.watchdog: if this process ends without
shutdown (even by SIGKILL), the watchdog kills the group and removes the dir. Ray's workers put themselves in
groups of their own; they exit by themselves within a few seconds of their raylet.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import ray._private.node as ray_node
import ray._private.ray_constants as ray_constants
import ray._private.services as ray_services

from fray.backend import Identity, is_loopback, stop_group, watchdog

__all__ = [
    "LOCAL_ONLY_ENV",
    "LOOPBACK",
    "GroupedSpawn",
    "LocalOnly",
    "WithoutHeadExtras",
    "driver_path_vars",
    "is_loopback_address",
    "short_tmp",
    "stop_private",
    "with_worker_preload",
]

log = logging.getLogger("fray_ray")

LOOPBACK = "127.0.0.1"
# Ray replaces a node address of 127.0.0.1 with the machine's outward address, and then its servers listen on
# every interface, unless "clusters are disabled" (what Ray does on Windows/macOS): then the node address is
# 127.0.0.1 and every server of the instance listens on loopback only. The flag is read from Ray's constants in
# this process and from the environment in the processes Ray starts.
LOCAL_ONLY_ENV = {ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}


def is_loopback_address(address: str) -> bool:
    """The host of a Ray address (`http://h:p`, `h:p`) is this machine's loopback."""
    return is_loopback(address.split("://")[-1].rsplit(":", 1)[0])


class LocalOnly:
    """While active, Ray in this process treats the node as local-only: 127.0.0.1 stays 127.0.0.1."""

    def __enter__(self) -> None:
        self._flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False

    def __exit__(self, *exc_info: object) -> None:
        ray_constants.ENABLE_RAY_CLUSTER = self._flag


class GroupedSpawn:
    """While active, every process Ray starts from this process (GCS, raylet, log monitor; the raylet's
    agents inherit it) joins one new process group, watched by fray.host.watchdog from its first member on; and Ray
    treats this node as local-only (loopback addresses). Used around ray.init under the module lock.

    `env` is added to the environment of each of those processes, and so of every worker the raylet starts: the
    workers' environment without a job runtime_env, with which Ray would start each worker through its
    runtime_env setup (a second Python start, twice a worker's CPU) and leave the workers it prestarted unused."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.pgid: int | None = None
        self.leader: Identity | None = None
        self.env = dict(env or {})

    def __enter__(self) -> GroupedSpawn:
        original = self._original = ray_services.ConsolePopen
        spawn = self

        class GroupedPopen(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                group, then = spawn.pgid or 0, kwargs.get("preexec_fn")

                def join_group() -> None:  # in the child, before exec (Popen's process_group needs 3.11)
                    os.setpgid(0, group)
                    if then is not None:
                        then()

                kwargs["preexec_fn"] = join_group
                kwargs["env"] = {**(kwargs.get("env") or os.environ), **spawn.env, **LOCAL_ONLY_ENV}
                super().__init__(*args, **kwargs)
                if spawn.pgid is None:
                    spawn.pgid = self.pid
                    spawn.leader = Identity.of(self.pid, zombie_ok=True)
                    watchdog.watch_group(self.pid)

        ray_services.ConsolePopen = GroupedPopen  # type: ignore[misc]
        self._cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        return self

    def __exit__(self, *exc_info: object) -> None:
        ray_services.ConsolePopen = self._original  # type: ignore[misc]
        ray_constants.ENABLE_RAY_CLUSTER = self._cluster_flag


class WithoutHeadExtras:
    """While active, a Ray head started in this process runs neither the autoscaler monitor nor the dashboard
    process, and its raylet runs Ray's dashboard agent as a minimal install does (fray_ray._minimal_agent). With
    include_dashboard=False the dashboard process serves Ray's usage-stats reporting only, and ray.init waits for
    it to answer before it returns; the monitor watches for nodes to add or remove, and a private instance has one
    node for its life (a request no node can hold is refused by fray itself); the full agent serves a dashboard's
    modules. All are Python processes started for nothing there. Used around ray.init under the module lock."""

    def __enter__(self) -> None:
        self._saved = (ray_node.Node.start_monitor, ray_node.Node.start_api_server, ray_services.start_ray_process)
        ray_node.Node.start_monitor = _no_monitor  # type: ignore[method-assign]
        ray_node.Node.start_api_server = _no_api_server  # type: ignore[method-assign, assignment]
        start = self._saved[2]

        def start_with_minimal_agent(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
            if process_type == ray_constants.PROCESS_TYPE_RAYLET:
                command = [_with_minimal_agent(arg) for arg in command]
            return start(command, process_type, *args, **kwargs)

        ray_services.start_ray_process = start_with_minimal_agent

    def __exit__(self, *exc_info: object) -> None:
        monitor, api_server, start = self._saved
        ray_node.Node.start_monitor, ray_node.Node.start_api_server = monitor, api_server  # type: ignore[method-assign]
        ray_services.start_ray_process = start


_AGENT_FLAG = "--dashboard_agent_command="
_FULL_AGENT = os.path.realpath(os.path.join(os.path.dirname(ray_services.__file__), os.pardir, "dashboard", "agent.py"))
# A script path, as Ray names its own: `python -m` would look the module up in the raylet's working directory first.
_MINIMAL_AGENT = os.path.join(os.path.dirname(os.path.realpath(__file__)), "_minimal_agent.py")


def _with_minimal_agent(arg: str) -> str:
    """A raylet's argument, with the dashboard agent's script replaced by fray_ray._minimal_agent's."""
    if not arg.startswith(_AGENT_FLAG):
        return arg
    parts = [_MINIMAL_AGENT if os.path.realpath(p) == _FULL_AGENT else p for p in shlex.split(arg[len(_AGENT_FLAG) :])]
    return _AGENT_FLAG + subprocess.list2cmdline(parts)


def _no_monitor(_node: ray_node.Node) -> None:
    return None


def _no_api_server(_node: ray_node.Node, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
    return None


def stop_private(leader: Identity | None, temp_dir: str) -> None:
    """After ray.shutdown(): end whatever of the instance's group is left, then remove its temp dir (only once
    nothing writes there any more), and take both off the watchdog's list."""
    if leader is not None:
        if not stop_group(leader, grace=5.0):
            log.warning("process group %d of a private Ray did not end", leader.pid)
        watchdog.forget_group(leader.pid)
    shutil.rmtree(temp_dir, ignore_errors=True)
    watchdog.forget_path(temp_dir)


# Loaded by each worker of a private instance before its first task (see the module).
WORKER_PRELOAD = "fray_ray._lazy_addons"


def with_worker_preload(init_kwargs: dict[str, Any]) -> dict[str, Any]:
    """ray.init's arguments for a private instance: the user's, with fray's module in the workers' preload."""
    system_config = dict(init_kwargs.get("_system_config") or {})
    preload = list(system_config.get("preload_python_modules") or [])
    system_config["preload_python_modules"] = [WORKER_PRELOAD, *(m for m in preload if m != WORKER_PRELOAD)]
    return {**init_kwargs, "_system_config": system_config}


def driver_path_vars() -> dict[str, str]:
    """Workers of a private local Ray see the modules this driver sees: its sys.path entries outside the Python
    installation (a script's directory, a test directory pytest inserted) go to the workers' PYTHONPATH.
    Installed packages are left out, so a task's pip runtime_env is never shadowed."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    extra: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path == p or path.startswith(p + os.sep) for p in prefixes):
            continue
        if path not in extra:
            extra.append(path)
    if os.environ.get("PYTHONPATH"):
        extra.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(extra)} if extra else {}


# Ray puts unix sockets under the temp dir, and a unix socket path has at most 107 bytes. The longest one, with
# fray's temp dir under `base`: base + "/fray-rayc-XXXXXXXX" (19) + "/session_YYYY-MM-DD_HH-MM-SS_ffffff_PID"
# (42 with a 7-digit pid) + "/sockets/" (9) + the socket's name: the dashboard's "dash_<ModuleName>"
# ("dash_TaskEventsHead", 19, in Ray 2.60; a margin of 5 for modules to come).
_SOCKET_PATH_MAX = 107
_UNDER_BASE = 19 + 42 + 9 + 24


def short_tmp() -> str:
    """The directory for a private Ray's temp dir: RAY_TMPDIR or the usual temp dir if Ray's longest socket path
    fits under it, else /tmp."""
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return base if len(base.rstrip("/")) + _UNDER_BASE <= _SOCKET_PATH_MAX else "/tmp"
