"""docs/backends.md shows the capabilities the installed backends really declare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fray.cli import capabilities_table
from fray.errors import BackendNotAvailableError
from fray.registry import FIRST_PARTY, get_backend

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_capabilities_table_in_docs_matches_the_code() -> None:
    for name in FIRST_PARTY:
        try:
            get_backend(name)
        except BackendNotAvailableError:
            pytest.skip(
                f"backend {name!r} is not installed here, so its column cannot be checked (make test installs it)"
            )
    documented = re.search(r"<!-- capabilities-table -->\n(.*?)\n<!-- /capabilities-table -->", DOC.read_text(), re.S)
    assert documented is not None
    assert documented.group(1).strip() == capabilities_table().strip(), "run `fray capabilities` and paste the table"
