"""Backend selection: specs, FRAY_BACKEND, unknown and missing backends, current context."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

import fray
from fray.errors import BackendNotAvailableError
from fray.in_memory import InMemoryBackend
from fray.registry import FIRST_PARTY, parse_spec
from fray.runtime.options import non_empty_text, positive_int


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


class _Recorder(InMemoryBackend):
    """in_memory, recording the options each entry point of a backend receives."""

    name = "recorder"
    options = {**InMemoryBackend.options, "n": positive_int, "address": non_empty_text, "job": lambda raw: raw}
    seen: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def job_context(self, **options: Any) -> Any:
        self.seen.append(("job_context", options))
        return super().job_context(**{k: v for k, v in options.items() if k not in ("n", "job")})

    def cluster_context(self, **options: Any) -> Any:
        self.seen.append(("cluster_context", options))
        return super().cluster_context()

    def prepare_command(self, options: Mapping[str, Any]) -> None:
        self.seen.append(("prepare_command", dict(options)))

    def persistent_address(self) -> tuple[str | None, str]:
        return "somewhere", ""

    def start_cluster(self, listen: str, **options: Any) -> tuple[dict[str, Any], bool]:
        self.seen.append(("start_cluster", options))
        return {"address": "somewhere", "pid": 1}, False

    def stop_cluster(self) -> None:
        return None


def test_a_backend_receives_its_options_converted_by_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fray.init, fray.cluster and the `fray` command convert a spec's options by the backend's declared
    `options` once, in fray-core: no backend parses them again (test_core_layout checks that none calls
    parse_options). Objects passed from Python reach a converter as they are."""
    import argparse

    from fray.cli.cluster import cluster_start
    from fray.cli.common import open_cluster

    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "state"))
    fray.register_backend("recorder", _Recorder, replace=True)
    _Recorder.seen.clear()
    job = object()
    fray.init("recorder?n=3&cpus=2", job=job, serialize=False)
    fray.shutdown()
    with fray.cluster("recorder?n=4", job_dirs=str(tmp_path)) as cluster:
        assert cluster.job_dirs == str(tmp_path)  # the core's own option, never the backend's
    assert _Recorder.seen == [
        ("job_context", {"n": 3, "cpus": 2.0, "job": job, "serialize": False}),
        ("cluster_context", {"n": 4}),
    ]
    _Recorder.seen.clear()
    with open_cluster(argparse.Namespace(backend=f"recorder?n=5&job_dirs={tmp_path}", address=None), "fray status"):
        pass
    launch = {flag: None for flag in ("job", "hosts", "nodes", "partition", "time")}
    assert cluster_start(argparse.Namespace(backend="recorder?n=6", listen="127.0.0.1", **launch)) == 0
    assert _Recorder.seen == [
        ("prepare_command", {"n": 5, "address": "somewhere"}),
        ("cluster_context", {"n": 5, "address": "somewhere"}),
        ("start_cluster", {"n": 6}),
    ]
    with pytest.raises(ValueError, match=r"option n='0' for the 'recorder' backend is not valid: must be a whole"):
        fray.init("recorder?n=0")
    with pytest.raises(ValueError, match=r"option n='x' for the 'recorder' backend"):
        fray.cluster("recorder", n="x")


def test_a_monarch_clusters_job_spec_reads_back_as_its_converted_options() -> None:
    """A monarch cluster hands its jobs its options as a spec (FRAY_BACKEND) written from the converted values
    its context received: each reads back the same (a resources table as JSON, a flag as true/false)."""
    pytest.importorskip("fray_monarch")
    from fray.registry import backend_options
    from fray_monarch import MonarchBackend
    from fray_monarch.cluster.context import job_spec

    raw = {"procs": "3", "cpus": "2", "resources": "disk:4,tag", "log_to_driver": "no", "object_store_memory": "3e8"}
    converted = backend_options(MonarchBackend(), raw)
    back = backend_options(MonarchBackend(), parse_spec(job_spec(converted, None))[1])
    assert back == {**converted, "job": "local"}


def test_monarch_takes_a_heads_address_for_a_cluster_context_only() -> None:
    """address= is in monarch's schema (fray.cluster("monarch?address=SOCKET") is a client of a recorded head);
    a JobContext refuses it, naming what to use, before anything starts."""
    pytest.importorskip("fray_monarch")
    with pytest.raises(ValueError, match=r"is for fray\.cluster.*hosts="):
        fray.init("monarch?address=/nowhere/sock")
