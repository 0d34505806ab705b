"""A pytest plugin that lists the tests that used the most CPU, where run_parallel asks for it (FRAY_TEST_CPU_TOP):
each test's share of its part's cgroup (every process the part runs, the engines' daemons included). The run is
CPU-bound on a small machine, so a test's wall time says little about what it costs the run. Every test's figure
also goes to the descriptor FRAY_TEST_CPU_TABLE names (tab-separated CPU seconds, wall seconds and test id,
costliest first): where the CPU goes, and which tests mostly wait (wall far above CPU)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from _part_cpu import CpuMeter, cpu_table_descriptor
from run_parallel import CPU_TOP_ENV


class CpuPerTest:
    def __init__(self, meter: CpuMeter, top: int, table: int | None) -> None:
        self._meter = meter
        self._top = top
        self._table = table
        self._spent: list[tuple[float, float, str]] = []  # CPU s, wall s, test id

    def _seconds(self) -> float | None:
        try:
            return self._meter.seconds()
        except (OSError, ValueError, KeyError):  # (a figure is missing from the table, never a test's failure)
            return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        before = self._seconds()
        started = time.monotonic()
        yield
        after = self._seconds()
        if before is not None and after is not None:
            self._spent.append((after - before, time.monotonic() - started, item.nodeid))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        everything = sorted(self._spent, reverse=True)
        if self._table is not None:
            with os.fdopen(self._table, "w") as out:
                out.writelines(f"{seconds:.2f}\t{wall:.2f}\t{nodeid}\n" for seconds, wall, nodeid in everything)
        costliest = everything[: self._top]
        terminalreporter.write_sep("=", f"the {len(costliest)} tests that used the most CPU")
        for seconds, _, nodeid in costliest:
            terminalreporter.write_line(f"{seconds:8.2f}s cpu {nodeid}")


def register(config: pytest.Config) -> None:
    """Registers the plugin where run_parallel asked for it and this process's cgroup can be read."""
    top = os.environ.get(CPU_TOP_ENV, "")
    if not top.isdigit():
        return
    meter = CpuMeter.current()
    if meter is None:
        return
    try:
        meter.seconds()
    except (OSError, ValueError, KeyError):
        return
    config.pluginmanager.register(CpuPerTest(meter, int(top), cpu_table_descriptor()), "fray-cpu-per-test")
