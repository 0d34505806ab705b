"""The three distributions share one version, declare their metadata, and ship type information."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import fray

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {"fray-core": "lib/fray", "fray-ray": "backends/ray", "fray-monarch": "backends/monarch"}


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_one_version_and_full_metadata(name: str) -> None:
    path = ROOT / DISTRIBUTIONS[name]
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    assert project["name"] == name
    assert project["version"] == fray.__version__
    assert project["license"] == "Apache-2.0" and project["classifiers"] and project["readme"]
    assert (path / project["readme"]).exists()
    if name != "fray-core":
        assert f"fray-core=={fray.__version__}" in project["dependencies"]


@pytest.mark.parametrize(
    "package", ["lib/fray/src/fray", "backends/ray/src/fray_ray", "backends/monarch/src/fray_monarch"]
)
def test_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").exists()
