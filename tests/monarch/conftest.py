"""Tests of the Monarch backend itself (real Monarch processes, no mocks). Skipped where it is not installed."""

import pytest

pytest.importorskip("fray_monarch")
