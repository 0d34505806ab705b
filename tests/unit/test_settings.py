"""fray.host.settings declares every `FRAY_*` variable fray's source names, docs/settings.md shows the declarations
as they are, and a setting reads its variable as declared: the default where unset or blank, a clear error for a
value it does not accept."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from fray.errors import FrayError
from fray.host import settings
from fray.host.settings import SETTINGS, SettingError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "lib", ROOT / "backends"]
NAME = re.compile(r"FRAY_[A-Z_]+")
# Variables the conformance suite sets for its own cases: test data, not settings.
TEST_ONLY = {"FRAY_CONFORMANCE_VAR", "FRAY_JOB_VAR", "FRAY_TEST_MARK"}
# Where a quoted variable name may stay: the declarations; the start-up hook that runs in every Python process of
# the environment and imports nothing of fray's until it must; the test workloads and the conformance suite, which
# read a job's variables as a user's program does.
QUOTED_ALLOWED = ("fray/host/settings.py", "fray_monarch_autoguard.py", "fray/testing/")


def _sources() -> list[Path]:
    return [p for root in SOURCES for p in root.rglob("*.py") if "__pycache__" not in p.parts]


def test_every_variable_named_in_the_source_is_declared() -> None:
    declared = {s.name for s in SETTINGS}
    named: dict[str, set[str]] = {}
    for path in _sources():
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert len(named) > 20
    missing = {name: sorted(paths) for name, paths in named.items() if name not in declared | TEST_ONLY}
    assert missing == {}, "declare these in fray.host.settings (and regenerate docs/settings.md)"


def test_no_variable_name_is_spelled_out_beside_its_declaration() -> None:
    quoted = re.compile(r"""(?<!["'])(["'])FRAY_[A-Z_]+\1""")  # a string that is the name (not a docstring's start)
    spelled = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        if not any(str(path).endswith(a) or f"/{a}" in str(path) for a in QUOTED_ALLOWED)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if quoted.search(line)
    ]
    assert spelled == [], "name a variable by its declaration: settings.X.name"


def test_declarations_are_whole() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)) and len(names) > 20
    for s in SETTINGS:
        assert s.name.startswith("FRAY_") and s.about.endswith(".") and s.reader and s.kind.accepts
        assert s.backend in (None, "ray", "monarch"), s.name
        assert s.reader.startswith("fray_ray" if s.backend == "ray" else "fray_monarch" if s.backend else "fray.")
    internal = {s.name for s in SETTINGS if s.internal}
    assert {"FRAY_JOB_CALL", "FRAY_JOB_RESULT_FD", "FRAY_SOCKET_GUARD_RESTARTED", "FRAY_GPU_IDS"} <= internal
    assert {"FRAY_BACKEND", "FRAY_EVENTS", "FRAY_STATE_DIR", "FRAY_SPMD_HANG_TIMEOUT"}.isdisjoint(internal)


def test_the_docs_table_is_current() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings.with_table(page), (
        "docs/settings.md is stale: python -c 'import fray.host.settings as s; s.write_table(\"docs/settings.md\")'"
    )
    for s in SETTINGS:
        assert f"| `{s.name}` |" in page


def test_unset_or_blank_is_the_default_and_a_value_is_converted() -> None:
    assert settings.BACKEND.read({}) == "in_memory"
    assert settings.BACKEND.read({"FRAY_BACKEND": "  "}) == "in_memory"
    assert settings.BACKEND.raw({"FRAY_BACKEND": " ray "}) == "ray"
    assert settings.EVENTS.read({}) is None
    assert settings.EVENTS.read({"FRAY_EVENTS": "Off"}) is False
    assert settings.EVENTS.read({"FRAY_EVENTS": "1"}) is True
    assert settings.SPMD_HANG_TIMEOUT.read({}) == 30.0
    assert settings.SPMD_HANG_TIMEOUT.read({"FRAY_SPMD_HANG_TIMEOUT": "0"}) == math.inf
    assert settings.EVENTS_CAPACITY.read({"FRAY_EVENTS_CAPACITY": "10"}) == 1000
    assert settings.DASHBOARD.read({"FRAY_DASHBOARD": "1"}) == 0
    assert settings.DASHBOARD.read({"FRAY_DASHBOARD": "8265"}) == 8265
    assert settings.DASHBOARD.read({"FRAY_DASHBOARD": "no"}) is None
    assert settings.GPUS.read({"FRAY_GPUS": "2,0"}) == (2, 0)
    assert settings.STATE_DIR.read({"FRAY_STATE_DIR": "~/s"}) == Path.home() / "s"
    assert settings.JOB_STOP_GRACE.read({"FRAY_JOB_STOP_GRACE": "0.0"}) == 0.0
    assert settings.lookup("FRAY_JOB_ATTEMPT") is settings.JOB_ATTEMPT


def test_take_reads_and_removes() -> None:
    env = {"FRAY_JOB_RESULT_FD": "7", "OTHER": "x"}
    assert settings.JOB_RESULT_FD.take(env) == 7
    assert env == {"OTHER": "x"}
    assert settings.JOB_RESULT_FD.take(env) is None


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        (settings.EVENTS, "maybe"),
        (settings.EVENTS_CAPACITY, "lots"),
        (settings.SPMD_HANG_TIMEOUT, "soon"),
        (settings.DASHBOARD, "99999"),
        (settings.GPUS, "0,GPU-1"),
        (settings.JOB_STOP_GRACE, "-1"),
        (settings.REGISTERED_BACKENDS, "[1]"),
    ],
)
def test_a_bad_value_names_the_variable_its_value_and_what_it_accepts(
    setting: settings.Setting[object], value: str
) -> None:
    with pytest.raises(SettingError) as caught:
        setting.read({setting.name: value})
    message = str(caught.value)
    assert setting.name in message and repr(value) in message and setting.kind.accepts in message
    assert isinstance(caught.value, FrayError) and isinstance(caught.value, ValueError)


def test_the_readers_use_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    from fray.host.state_dir import state_dir
    from fray.runtime.current import held_from_env
    from fray.runtime.gang import hang_timeout

    monkeypatch.setenv("FRAY_SPMD_HANG_TIMEOUT", "never")
    with pytest.raises(FrayError, match="FRAY_SPMD_HANG_TIMEOUT='never'"):
        hang_timeout()
    monkeypatch.setenv("FRAY_STATE_DIR", "/x/state")
    assert state_dir() == Path("/x/state")
    assert held_from_env({"FRAY_GPUS": "1,3"}) == (1, 3)
