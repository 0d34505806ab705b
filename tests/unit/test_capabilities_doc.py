"""docs/backends.md shows the capabilities the installed backends really declare (the conformance run checks the
cells against what it shows: fray.testing.capability_table, the `fray_capabilities_doc` ini option)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, get_backend
from fray.runtime.capabilities import Capability
from fray.testing.capability_table import NO, UNTESTED, YES, documented_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_capabilities_table_in_docs_matches_the_code() -> None:
    for name in FIRST_PARTY:
        try:
            get_backend(name)
        except BackendNotAvailableError:
            pytest.skip(
                f"backend {name!r} is not installed here, so its column cannot be checked (make test installs it)"
            )
    documented = documented_table(DOC.read_text())
    assert sorted(documented) == sorted(FIRST_PARTY)
    for name, cells in documented.items():
        have = get_backend(name).capabilities
        assert list(cells) == [c.value for c in Capability], f"the rows of {name!r}: one per capability, in order"
        for cap in Capability:
            allowed = (YES, UNTESTED) if cap in have else (NO,)
            assert cells[cap.value] in allowed, (
                f"`{cap.value}` on {name}: the docs say {cells[cap.value]!r}, the backend declares it "
                f"{'present' if cap in have else 'missing'}; regenerate the table (docs/testing.md)"
            )
