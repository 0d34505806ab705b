"""The set-up step of a Ray worker whose runtime env is not empty, on the heads fray starts: what Ray's own
`ray/_private/workers/setup_worker.py` does (set the env's variables, then exec the worker under the env's
interpreter and command prefix), without importing Ray first.

The raylet starts every worker that has a runtime env (a job's supervisor always has one: Ray's job manager gives it
variables of its own; a job's tasks and actors have the job's) as `python <setup worker> <worker command>`. Ray's
set-up script imports Ray to read its one argument, so each such worker starts a whole Ray-importing interpreter
before the worker itself. This script is run by path (RayParams.setup_worker_path, fray_ray._ray_start) and imports
the standard library alone. Where the runtime env context holds anything this script does not handle the way
Ray's does (another language or platform, a field it does not know, Java jars), it hands the same arguments to Ray's
script instead, so the worker starts exactly as Ray would start it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys
from typing import Any

# The fields of Ray 2.60's RuntimeEnvContext (ray/_private/runtime_env/context.py), the serialized context's keys.
KNOWN_FIELDS = frozenset({"command_prefix", "env_vars", "py_executable", "override_worker_entrypoint", "java_jars"})
_UNSET_VARIABLE = re.compile(r"\$\{[A-Z0-9_]+\}")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Ray's set-up arguments, and the worker's command (every other argument, in order)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", type=str)
    parser.add_argument("--language", type=str)
    return parser.parse_known_args(argv)


def handled_here(language: str | None, context: dict[str, Any]) -> bool:
    """Whether this script starts the worker as Ray's set-up script would: a Python worker on Linux whose context
    has only the fields it knows and no Java jars."""
    return (
        sys.platform == "linux"
        and language == "PYTHON"
        and set(context) <= KNOWN_FIELDS
        and not context.get("java_jars")
    )


def expanded(value: str) -> str:
    """A runtime env variable's value as Ray sets it: `$X` and `${X}` of this environment replaced, and a `${X}`
    this environment lacks replaced by nothing (ray._private.utils.update_envs)."""
    return _UNSET_VARIABLE.sub("", os.path.expandvars(value))


def worker_command(context: dict[str, Any], passthrough: list[str]) -> str:
    """The shell command Ray's RuntimeEnvContext.exec_worker runs for a Python worker on Linux: the env's command
    prefix, then `exec` of the env's interpreter on the worker's arguments (each quoted; the prefix and interpreter
    as given, as Ray leaves them)."""
    args = list(passthrough)
    if context.get("override_worker_entrypoint") and args:
        args[0] = context["override_worker_entrypoint"]
    executable = context.get("py_executable") or sys.executable
    parts = [*(context.get("command_prefix") or []), "exec", executable, *(shlex.quote(a) for a in args)]
    return " ".join(parts)


def rays_setup_worker() -> str:
    """The path of Ray's own set-up script, found without importing Ray."""
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        raise SystemExit("fray_ray._setup_worker: Ray is not installed for this interpreter")
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")


def main(argv: list[str]) -> None:
    known, passthrough = parse(argv)
    context = json.loads(known.serialized_runtime_env_context or "{}")
    if not isinstance(context, dict) or not handled_here(known.language, context):
        script = rays_setup_worker()
        os.execv(sys.executable, [sys.executable, script, *argv])
    for key, value in (context.get("env_vars") or {}).items():
        os.environ[key] = expanded(value)
    os.execvp("bash", ["bash", "-c", worker_command(context, passthrough)])


if __name__ == "__main__":
    main(sys.argv[1:])
