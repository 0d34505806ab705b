"""CPU time for tests/run_parallel.py: a cgroup of its own for each part (what every process it started used), the
descriptor by which a part's pytest (tests/_cpu_per_test.py) writes every test's CPU to the runner's table, and how
busy the machine's cores have been lately (`CoresBusy`: whether one more part would find them idle)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU_TABLE_ENV = "FRAY_TEST_CPU_TABLE"  # (tests/_cpu_per_test.py: "fd:dev.inode" of the file for every test's CPU)


def cpu_table_variable(fd: int) -> str:
    """CPU_TABLE_ENV's value for the table open as `fd`: its number, and the file it is (read back below)."""
    st = os.fstat(fd)
    return f"{fd}:{st.st_dev}.{st.st_ino}"


def cpu_table_descriptor() -> int | None:
    """The descriptor run_parallel opened for this part's table of every test's CPU; None where this process does
    not hold that file (a process that a test starts inherits the variable, not the descriptor, whose number may
    then be another file's or none)."""
    value = os.environ.get(CPU_TABLE_ENV, "")
    try:
        fd = int(value.partition(":")[0])
        return fd if cpu_table_variable(fd) == value else None
    except (ValueError, OSError):
        return None


CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuMeter:
    """A cgroup of its own for one part: what its processes use (their children's too: a cgroup is inherited)."""

    path: Path
    usage_file: str  # cpuacct.usage (v1: nanoseconds) or cpu.stat (v2: usage_usec)

    @staticmethod
    def make(name: str) -> CpuMeter | None:
        """A fresh cgroup for the part `name`, or None where none can be made here (not root, no cgroupfs...)."""
        slug = "".join(c if c.isalnum() else "_" for c in name)
        leaf = f"fray-test-part-{os.getpid()}-{slug}"
        if (CGROUP_ROOT / "cpuacct" / "cpuacct.usage").exists():
            where, usage = CGROUP_ROOT / "cpuacct" / leaf, "cpuacct.usage"
        elif (CGROUP_ROOT / "cgroup.controllers").exists():
            mine = Path("/proc/self/cgroup").read_text().splitlines()[0].partition("::")[2].lstrip("/")
            where, usage = CGROUP_ROOT / mine / leaf, "cpu.stat"
        else:
            return None
        try:
            where.mkdir()
        except OSError:
            return None
        return CpuMeter(where, usage)

    @staticmethod
    def current() -> CpuMeter | None:
        """The cgroup this process runs in, to read (a part's own, inside run_parallel), or None."""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return CpuMeter(CGROUP_ROOT / "cpuacct" / path.lstrip("/"), "cpuacct.usage")
            if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
                return CpuMeter(CGROUP_ROOT / path.lstrip("/"), "cpu.stat")
        return None

    def enter(self) -> None:
        """Move the calling process into the cgroup (a part's first process, before it runs anything)."""
        try:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:  # then the part's CPU is not counted, and reads as 0
            pass

    def seconds(self) -> float:
        text = (self.path / self.usage_file).read_text()
        if self.usage_file == "cpuacct.usage":
            return int(text) / 1e9
        fields = dict(line.split() for line in text.splitlines())
        return int(fields["usage_usec"]) / 1e6

    def remove(self) -> None:
        """Once the part's processes are gone (the last ones may take a moment to leave)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


PROC_STAT = Path("/proc/stat")


def busy_jiffies(stat: str) -> tuple[int, int]:
    """(busy, total) time of all the machine's cores so far, in jiffies, from /proc/stat's text: idle and iowait
    are not busy (a part waiting on its disk leaves the cores to others)."""
    # user nice system idle iowait irq softirq steal (guest time is counted within user)
    fields = [int(value) for value in stat.splitlines()[0].split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


class CoresBusy:
    """How busy the machine's cores were over the last `window` seconds: every process on it, not only the parts'."""

    def __init__(self, window: float, read: Callable[[], str] = PROC_STAT.read_text) -> None:
        self.window = window
        self._read = read
        self._samples: deque[tuple[float, int, int]] = deque()
        self.restart()

    def restart(self, now: float | None = None) -> None:
        """Forget what was seen: `busy()` then waits for a whole window from now."""
        self._samples.clear()
        self.sample(now)

    def sample(self, now: float | None = None) -> None:
        busy, total = busy_jiffies(self._read())
        now = time.monotonic() if now is None else now
        self._samples.append((now, busy, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()

    def busy(self) -> float | None:
        """The busy share of the cores over the last window (0 to 1); None until a whole window has been seen."""
        (start, busy_before, total_before), (end, busy_now, total_now) = self._samples[0], self._samples[-1]
        if end - start < self.window or total_now == total_before:
            return None
        return (busy_now - busy_before) / (total_now - total_before)


class CoresTimeline:
    """How busy the machine's cores were, interval by interval over a whole run: printed at its end, it shows
    where the parts left the cores idle (what a better packing of the parts could still use)."""

    def __init__(self, read: Callable[[], str] = PROC_STAT.read_text) -> None:
        self._read = read
        self._samples: list[tuple[int, int]] = [busy_jiffies(read())]

    def sample(self) -> None:
        self._samples.append(busy_jiffies(self._read()))

    def shares(self) -> list[float]:
        """The busy share of each interval between two samples (0 to 1)."""
        pairs = zip(self._samples, self._samples[1:], strict=False)
        return [(b1 - b0) / (t1 - t0) if t1 > t0 else 0.0 for (b0, t0), (b1, t1) in pairs]
