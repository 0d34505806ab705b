"""fray's set-up script for the workers with a runtime env on the heads fray starts (fray_ray._setup_worker) starts
each worker as Ray's own script does: the same shell command and variables, Ray's script itself for what it does
not handle, and no Ray imported before the worker. Checked against Ray 2.60's own RuntimeEnvContext."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fray_ray")

from ray._private.runtime_env.context import RuntimeEnvContext
from ray._private.utils import update_envs
from ray.core.generated.common_pb2 import Language

from fray_ray import _ray_start, _setup_worker

WORKER = ["/venv/lib/ray/_private/workers/default_worker.py", "--node-ip-address=127.0.0.1", "--runtime-env-hash=7"]
CONTEXTS: list[dict[str, Any]] = [
    {},
    {"env_vars": {"A": "1"}},
    {"py_executable": "/tmp/envs/pip/abc/virtualenv/bin/python"},
    {"command_prefix": ["source", "/tmp/envs/conda/activate", "env1", "1>&2", "&&"], "env_vars": {"B": "two words"}},
    {"override_worker_entrypoint": "/container/default_worker.py", "java_jars": []},
]


class Exec(Exception):
    """Raised in place of an exec: what would have run."""

    def __init__(self, file: str, args: list[str]) -> None:
        super().__init__(file)
        self.file, self.argv = file, list(args)


def _raise_execvp(file: str, args: list[str]) -> None:
    raise Exec(file, args)


@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: ",".join(sorted(c)) or "empty")
def test_the_worker_runs_the_command_and_variables_rays_script_would(
    context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [*WORKER, "--arg with 'quotes' and $dollars"]
    for key in context.get("env_vars", {}):
        monkeypatch.delenv(key, raising=False)  # (restored after the test: both scripts set them)
    monkeypatch.setattr(os, "execvp", lambda file, args: _raise_execvp(file, args))
    with pytest.raises(Exec) as ray_exec:
        RuntimeEnvContext(**context).exec_worker(list(args), Language.PYTHON)
    rays_env = {key: os.environ[key] for key in context.get("env_vars", {})}
    for key in context.get("env_vars", {}):
        monkeypatch.delenv(key)
    argv = [f"--serialized-runtime-env-context={json.dumps(context)}", "--language=PYTHON", *args]
    with pytest.raises(Exec) as fray_exec:
        _setup_worker.main(argv)
    assert (fray_exec.value.file, fray_exec.value.argv) == (ray_exec.value.file, ray_exec.value.argv)
    assert {key: os.environ[key] for key in context.get("env_vars", {})} == rays_env


@pytest.mark.parametrize("value", ["plain", "$HOME/x", "a${HOME}b", "${FRAY_NEVER_SET_Q}", "$FRAY_NEVER_SET_Q", "$"])
def test_variables_are_expanded_as_ray_expands_them(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRAY_PROBE_VALUE", raising=False)
    update_envs({"FRAY_PROBE_VALUE": value})
    assert _setup_worker.expanded(value) == os.environ["FRAY_PROBE_VALUE"]


@pytest.mark.parametrize(
    ("language", "context"),
    [
        ("JAVA", {}),
        ("PYTHON", {"java_jars": ["/jars/a.jar"]}),
        ("PYTHON", {"a_field_of_a_later_ray": 1}),
    ],
)
def test_what_it_does_not_handle_goes_to_rays_own_script(
    language: str, context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "execv", lambda file, args: _raise_execvp(file, args))
    argv = [f"--serialized-runtime-env-context={json.dumps(context)}", f"--language={language}", *WORKER]
    with pytest.raises(Exec) as done:
        _setup_worker.main(argv)
    assert done.value.file == sys.executable
    assert done.value.argv[1].endswith("ray/_private/workers/setup_worker.py"), done.value.argv
    assert Path(done.value.argv[1]).is_file()
    assert done.value.argv[2:] == argv


def test_the_script_run_by_path_imports_no_ray_and_execs_the_worker() -> None:
    context = {"env_vars": {"FRAY_SET_UP": "<${HOME}>"}, "py_executable": sys.executable}
    code = "import os, sys; print(os.environ['FRAY_SET_UP'], 'ray' in sys.modules)"
    setup = [f"--serialized-runtime-env-context={json.dumps(context)}", "--language=PYTHON"]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", _ray_start.SETUP_WORKER, *setup, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"<{os.environ['HOME']}> False\n"
    imported = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time")]
    assert "json" in imported and not [m for m in imported if m == "ray" or m.startswith("ray.")], imported


def test_ray_start_as_fray_runs_it_names_frays_script_for_every_node_it_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import parameter

    monkeypatch.setattr(parameter.RayParams, "__init__", parameter.RayParams.__init__)  # (put back after the test)
    assert _ray_start.use_fray_setup_worker()
    assert _ray_start.use_fray_setup_worker()  # (twice: wrapped once)
    assert parameter.RayParams().setup_worker_path == _ray_start.SETUP_WORKER
    assert parameter.RayParams(setup_worker_path="/chosen.py").setup_worker_path == "/chosen.py"
    assert Path(_ray_start.SETUP_WORKER).is_file()
