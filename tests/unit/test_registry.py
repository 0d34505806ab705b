"""Backend selection: specs, FRAY_BACKEND, unknown and missing backends, current context."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fray
from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, parse_spec


def test_parse_spec() -> None:
    assert parse_spec("ray") == ("ray", {})
    assert parse_spec("ray?address=h:6379&namespace=x") == ("ray", {"address": "h:6379", "namespace": "x"})
    with pytest.raises(ValueError, match="twice"):
        parse_spec("ray?a=1&a=2")
    with pytest.raises(ValueError):
        parse_spec("")
    with pytest.raises(ValueError):
        parse_spec("ray?novalue")


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(BackendNotAvailableError, match=r"known backends: .*in_memory.*monarch.*ray"):
        fray.init("nope")


def test_missing_first_party_backend_says_how_to_install_it() -> None:
    """Run in a child without the backends on sys.path: fray.init('ray') must say how to install fray-ray."""
    code = (
        "import sys, fray\n"
        "sys.modules['fray_ray'] = None\n"  # behave as if fray-ray were not installed
        "try:\n    fray.init('ray')\nexcept fray.BackendNotAvailableError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "pip install fray-ray" in out, out
    assert FIRST_PARTY["monarch"][1].startswith("pip install fray-monarch")


def test_unknown_option_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown option .bogus.*known options"):
        fray.init("in_memory?bogus=1")
    with pytest.raises(ValueError, match="cpus"):
        fray.init("in_memory?cpus=many")


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("rey", "unknown fray backend 'rey' (did you mean 'ray'?)"),
        ("Ray", "unknown fray backend 'Ray' (did you mean 'ray'?)"),
        ("in_memroy", "unknown fray backend 'in_memroy' (did you mean 'in_memory'?)"),
        ("in_memory?cpu=2", "unknown option 'cpu' for the 'in_memory' backend (did you mean 'cpus'?)"),
        ("monarch?proc=2", "unknown option 'proc' for the 'monarch' backend (did you mean 'procs'?)"),
    ],
)
def test_a_misspelt_backend_or_option_gets_a_did_you_mean(spec: str, hint: str) -> None:
    if spec.startswith("monarch"):
        pytest.importorskip("fray_monarch")
    with pytest.raises((ValueError, fray.BackendNotAvailableError)) as info:
        fray.init(spec)
    assert hint in str(info.value)


def test_env_var_selects_backend_and_init_makes_it_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_BACKEND", "in_memory?cpus=3")
    ctx = fray.init()
    try:
        assert ctx.backend == "in_memory"
        assert ctx.node_resources()[0]["CPU"] == 3
        assert fray.get_job_context() is ctx
    finally:
        fray.shutdown()
    monkeypatch.setenv("FRAY_BACKEND", "nope")
    with pytest.raises(BackendNotAvailableError):
        fray.init()


def test_set_and_clear_job_context() -> None:
    ctx = fray.init("in_memory")
    try:
        fray.clear_job_context()
        other = fray.init("in_memory")
        assert fray.get_job_context() is other
        fray.set_job_context(ctx)
        assert fray.get_job_context() is ctx
        with pytest.raises(TypeError):
            fray.set_job_context("not a context")  # type: ignore[arg-type]
        other.shutdown()
    finally:
        fray.shutdown()
        ctx.shutdown()


def test_cluster_accepts_the_same_spec_as_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))  # (not the user's: jobs they left there)
    with fray.cluster("in_memory?cpus=2") as cluster:
        assert cluster.list_jobs() == []


def test_shut_down_context_refuses_work() -> None:
    ctx = fray.init("in_memory")
    fray.shutdown()
    with pytest.raises(fray.FrayError, match="shut down"):
        ctx.create_task(print)


def test_resources_option_accepts_json_or_pairs() -> None:
    from fray.runtime.options import parse_resources

    assert parse_resources('{"disk": 4, "tag": 1}') == {"disk": 4.0, "tag": 1.0}
    assert parse_resources("disk:4, tag") == {"disk": 4.0, "tag": 1.0}
    with pytest.raises(ValueError):
        parse_resources("disk:-1")
    with fray.init("in_memory?resources=disk:4") as ctx:
        assert ctx.node_resources()[0]["disk"] == 4.0


def capture_context_in_closure_and_use_it() -> int:
    ctx = fray.get_job_context()

    def inner() -> int:
        return int(ctx.get(ctx.put(41))) + 1  # ctx travels inside the closure

    return int(ctx.get(ctx.create_task(inner), timeout=60))


def test_a_context_captured_by_a_task_arrives_as_the_context_there() -> None:
    import pickle

    with fray.init("in_memory") as ctx:
        assert pickle.loads(pickle.dumps(ctx)) is ctx
        assert ctx.get(ctx.create_task(capture_context_in_closure_and_use_it), timeout=60) == 42


def test_using_makes_a_context_current_in_a_block() -> None:
    with fray.init("in_memory") as outer, fray.init("in_memory") as inner, fray.using(outer):
        assert fray.get_job_context() is outer
        with fray.using(inner):
            assert fray.get_job_context() is inner
        assert fray.get_job_context() is outer


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("in_memory?cpus=-1", "cpus=.*must be a number >= 0"),
        ("in_memory?memory=-5", "memory=.*must be a number >= 0"),
        ("in_memory?gpus=nan", "gpus=.*must be a number >= 0"),
        ("in_memory?cpus", "not valid.*key=value"),
    ],
)
def test_spec_options_are_range_checked(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fray.init(spec)


def test_every_backend_declares_its_options_and_shares_the_converters() -> None:
    """One converter per meaning: `log_to_driver=yes` means the same on every backend (monarch once refused it)."""
    from fray.backend import PersistentClusters
    from fray.errors import BackendNotAvailableError
    from fray.registry import get_backend
    from fray.runtime.options import flag, parse_options

    for name in FIRST_PARTY:
        try:
            backend = get_backend(name)
        except BackendNotAvailableError:
            continue
        assert backend.options["log_to_driver"] is flag, name
        for raw, want in (("yes", True), ("Off", False), (" true", True)):
            assert parse_options(name, {"log_to_driver": raw}, backend.options) == {"log_to_driver": want}
        assert (name != "in_memory") == isinstance(backend, PersistentClusters), name
