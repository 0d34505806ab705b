"""A private instance's workers register Ray's serialization add-ons (pydantic, starlette, pyarrow) when they
first import those libraries, not by importing them as each worker starts (fray_ray._lazy_addons); the
serializers are Ray's own. Real Ray, no mocks."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fray_ray")

from ray import cloudpickle

from fray_ray import RayJobContext

# (fray_ray._lazy_addons is imported inside the tests only: a worker imports this module for its classes, and the
# module would set itself up there whatever the instance asked for)

LIBRARIES = ("pydantic", "pyarrow", "starlette")


class Probe:
    def libraries(self) -> list[str]:
        return sorted(name for name in LIBRARIES if name in sys.modules)

    def arrow_table(self) -> tuple[bool, Any]:
        import pyarrow as pa

        registered = pa.Table in cloudpickle.CloudPickler.dispatch and pa.Schema in cloudpickle.CloudPickler.dispatch
        return registered, pa.table({"x": [1, 2, 3]})

    def pydantic_fields_registered(self) -> bool:
        from pydantic.v1.fields import ModelField

        return ModelField in cloudpickle.CloudPickler.dispatch


class ArrowAtStart:
    """Imports pyarrow before the worker has serialized anything."""

    def __init__(self) -> None:
        import pyarrow  # noqa: F401

    def registered(self) -> bool:
        import pyarrow as pa

        return pa.Table in cloudpickle.CloudPickler.dispatch


def test_a_worker_that_never_uses_them_never_loads_them(ctx: RayJobContext) -> None:
    probe = ctx.create_actor(Probe)
    ctx.get(probe.libraries())
    assert ctx.get(probe.libraries()) == []


def test_a_library_imported_later_gets_rays_serializers_at_once(ctx: RayJobContext) -> None:
    probe = ctx.create_actor(Probe)
    assert ctx.get(probe.libraries()) == []
    registered, table = ctx.get(probe.arrow_table())
    assert registered
    assert table.column("x").to_pylist() == [1, 2, 3]
    assert ctx.get(probe.pydantic_fields_registered())
    assert ctx.get(probe.libraries())[:2] == ["pyarrow", "pydantic"]


def test_a_library_imported_before_the_first_result_gets_them_too(ctx: RayJobContext) -> None:
    early = ctx.create_actor(ArrowAtStart)
    ctx.get(early.registered())  # (the worker makes its serialization context as it sends its first result)
    assert ctx.get(early.registered())


def test_a_driver_is_left_as_it_is(ctx: RayJobContext) -> None:
    import ray.util.serialization_addons as addons

    from fray_ray._lazy_addons import install

    before = addons.apply
    assert not install()
    assert addons.apply is before


def test_what_waits_on_a_module_runs_once_after_its_first_import(tmp_path: Path) -> None:
    from fray_ray._lazy_addons import AfterImport

    (tmp_path / "fray_addons_probe_mod.py").write_text("VALUE = 7\n")
    finder, seen = AfterImport(), []
    finder.add("fray_addons_probe_mod", lambda: seen.append(sys.modules["fray_addons_probe_mod"].VALUE))
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module("fray_addons_probe_mod")
        assert seen == [7]  # after the module's body ran
        assert finder.waiting() == []
        assert type(module.__loader__).__name__ == "SourceFileLoader"  # its own loader, not the finder's
        importlib.reload(module)
        assert seen == [7]
        finder.add("fray_addons_probe_mod", lambda: seen.append(0))  # already imported: at once
        assert seen == [7, 0]
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fray_addons_probe_mod", None)
