"""tests/run_parallel.py, which `make test` runs: its parts hold every test once, and a part runs in namespaces of
its own (what it leaves in /dev/shm, /tmp or the fray state directory, and the processes it leaves, go with it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

import _part_cpu  # noqa: E402
import run_parallel  # noqa: E402


def test_the_parts_hold_every_test_file_once_and_the_suite_once_per_backend() -> None:
    parts = run_parallel.parts(["in_memory", "ray"])
    files = sorted(p.relative_to(TESTS.parent).as_posix() for p in TESTS.rglob("test_*.py"))
    held = []
    for part in parts:
        path = TESTS.parent / part.args[0]
        held += [p.relative_to(TESTS.parent).as_posix() for p in (path.rglob("test_*.py") if path.is_dir() else [path])]
    suite = "tests/test_conformance.py"
    assert sorted(set(held)) == files
    others = [h for h in held if h != suite]
    assert len(others) == len(set(others))  # no file in two parts
    assert [p.args for p in parts if p.args[0] == suite] in (
        [[suite, "--fray-backend=ray"], [suite, "--fray-backend=in_memory"]],
        [[suite, "--fray-backend=in_memory"], [suite, "--fray-backend=ray"]],
    )
    weights = [p.weight for p in parts]
    assert weights == sorted(weights, reverse=True)  # the longest first


def test_a_bad_parallel_count_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAY_TEST_PARALLEL", "two")
    with pytest.raises(SystemExit, match="not a whole number"):
        run_parallel.parallel_count()
    monkeypatch.setenv("FRAY_TEST_PARALLEL", "0")
    with pytest.raises(SystemExit, match="give 1 or more"):
        run_parallel.parallel_count()


def test_by_default_as_many_parts_run_as_there_are_cores_at_most_three(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRAY_TEST_PARALLEL", raising=False)
    for cores, parallel in ((1, 1), (2, 2), (16, 3)):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert run_parallel.parallel_count() == parallel
    monkeypatch.setenv("FRAY_TEST_PARALLEL", "3")
    assert run_parallel.parallel_count() == 3


LEAVES_THINGS = textwrap.dedent(
    """
    import os, subprocess, sys
    from pathlib import Path
    from fray.host.state_dir import state_dir

    def test_leaves_things() -> None:
        tag = os.environ["TAG"]
        for where in (Path("/dev/shm"), Path("/tmp"), state_dir()):
            assert not (where / (tag + "-outside")).exists()  # the machine's own: not seen here
        Path("/dev/shm", tag).write_text("x")
        Path("/tmp", tag).write_text("x")
        (state_dir() / tag).write_text("x")
        left = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(os.environ["PIDFILE"]).write_text(str(left.pid))
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_part_sees_and_leaves_only_its_own_things() -> None:
    from fray.host.state_dir import state_dir

    part = TESTS / "unit" / f"_part_probe_{os.getpid()}.py"  # (no test file name: collected only when named)
    tag, pidfile = f"fray-part-probe-{os.getpid()}", part.with_suffix(".pid")  # (outside /tmp: seen here)
    outside = [where / (tag + "-outside") for where in (Path("/dev/shm"), Path("/tmp"), state_dir())]
    part.write_text(LEAVES_THINGS)
    for path in outside:
        path.write_text("x")
    try:
        done = subprocess.run(
            [
                *["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"],
                *[sys.executable, str(TESTS / "run_parallel.py"), "--inside", str(part), "-q"],
            ],
            env={**os.environ, "TAG": tag, "PIDFILE": str(pidfile)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        left_pid = pidfile.read_text().strip() if pidfile.exists() else ""
    finally:
        for path in (part, pidfile, *outside):
            path.unlink(missing_ok=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for where in (Path("/dev/shm"), Path("/tmp"), state_dir()):
        assert not (where / tag).exists()
    # the sleep it left was in its PID namespace: gone with it (its pid there means nothing here: not signalled)
    assert left_pid.isdigit()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _sleeps_with(tag):
        time.sleep(0.1)
    assert not _sleeps_with(tag)


def _sleeps_with(tag: str) -> list[int]:
    """Processes here whose environment carries `tag` (the part's leftover sleep, were it still alive)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if f"TAG={tag}".encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_the_slowest_steps_are_read_from_each_parts_durations_table() -> None:
    lines = [
        "============================= slowest 30 durations =============================",
        "35.20s call     tests/test_conformance.py::test_50_actors[ray]",
        "0.50s setup    tests/ray/test_ray_events.py::test_x",
        "3 passed in 1.00s",
        "12s is not a duration line",
    ]
    assert run_parallel.slowest_steps(lines) == [
        (35.2, "call tests/test_conformance.py::test_50_actors[ray]"),
        (0.5, "setup tests/ray/test_ray_events.py::test_x"),
    ]


SLEEPS = textwrap.dedent(
    """
    import os, subprocess, time
    from pathlib import Path

    def test_sleeps() -> None:
        subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(os.environ["READY"]).write_text("ready")
        time.sleep(300)
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
@pytest.mark.parametrize("how", ["SIGTERM to the part", "the runner's thread ends"])
def test_a_part_stopped_ends_with_everything_it_started(how: str) -> None:
    """A PID 1 ignores the signals it has no handler for: a part's must end on SIGTERM, and a part must end when
    the runner's thread that started it ends (PDEATHSIG), or a killed runner leaves its parts running."""
    part = TESTS / "unit" / f"_part_sleeps_{os.getpid()}.py"
    tag, ready = f"fray-part-sleeps-{os.getpid()}", part.with_suffix(".ready")
    part.write_text(SLEEPS)
    env = {**os.environ, "TAG": tag, "READY": str(ready)}
    command = [
        *["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"],
        *[sys.executable, str(TESTS / "run_parallel.py"), "--inside", str(part), "-q"],
    ]
    started: list[subprocess.Popen[bytes]] = []
    try:
        if how == "SIGTERM to the part":
            started.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        else:
            release = threading.Event()

            def start() -> None:  # (PDEATHSIG fires when this thread ends: once released)
                started.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        preexec_fn=run_parallel._die_with_parent,
                    )
                )
                release.wait(180)

            thread = threading.Thread(target=start)
            thread.start()
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists() and len(_sleeps_with(tag)) >= 3  # PID 1, pytest, sleep
        if how != "SIGTERM to the part":
            release.set()
            thread.join()
        else:
            first = Path(f"/proc/{started[0].pid}/task/{started[0].pid}/children").read_text().split()
            os.kill(int(first[0]), signal.SIGTERM)  # (PID 1 of the part: unshare's one child, started here)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _sleeps_with(tag):
            time.sleep(0.1)
        assert not _sleeps_with(tag)
        assert started[0].wait(30) != 0
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        part.unlink()
        ready.unlink(missing_ok=True)


BURNS_CPU = """
import os, time
from pathlib import Path

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_burn():
    done = Path(os.environ["DONE"])
    if os.fork() == 0:  # an orphan daemon, as Ray's and monarch's are: its CPU counts for the part too
        if os.fork() == 0:
            os.setsid()
            burn(1.5)
            done.write_text("burnt")
        os._exit(0)
    os.wait()
    burn(0.2)
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists()
"""


def test_a_parts_cpu_time_counts_every_process_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = _part_cpu.CpuMeter.make("probe")
    if probe is None or os.geteuid() != 0 or run_parallel.isolation_available():
        pytest.skip("needs root, unshare and a cgroup to count a part's CPU in (cgroup v1 cpuacct or v2)")
    probe.remove()
    part_file = TESTS / "unit" / f"_part_cpu_probe_{os.getpid()}.py"  # (no test file name: collected only when named)
    part_file.write_text(BURNS_CPU)
    monkeypatch.setenv("DONE", str(TESTS / "unit" / f"_part_cpu_probe_{os.getpid()}.done"))
    part = run_parallel.Part("cpu-probe", [str(part_file), "-q"], 1.0)
    try:
        run_parallel.run_part(part, tmp_path, isolated=True)
    finally:
        part_file.unlink(missing_ok=True)
        Path(os.environ["DONE"]).unlink(missing_ok=True)
    assert part.code == 0, "\n".join(part.tail)
    assert part.cpu is not None and part.cpu >= 1.5  # the orphan's 1.5 s (pytest and the test: under 1.5 s)
    [(seconds, test)] = part.cpu_tests  # the part's own table of its costliest tests (tests/_cpu_per_test.py)
    assert test == f"tests/unit/{part_file.name}::test_burn" and 1.5 <= seconds <= part.cpu
    [(cpu, wall, listed)] = [line.split("\t") for line in part.log.with_suffix(".cpu.tsv").read_text().splitlines()]
    assert (cpu, listed) == (f"{seconds:.2f}", test) and float(wall) >= 1.5  # every test's, to a file, with its wall
    assert not list(_part_cpu.CGROUP_ROOT.rglob(f"fray-test-part-{os.getpid()}-*"))  # each part's cgroup removed


def test_the_checkouts_sources_are_compiled_even_where_python_writes_no_bytecode(tmp_path: Path) -> None:
    (tmp_path / "lib" / "pkg").mkdir(parents=True)
    (tmp_path / "lib" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helper.py").write_text("VALUE = 2\n")
    script = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import run_parallel, pathlib; "
    script += f"run_parallel.compile_sources(pathlib.Path({str(tmp_path)!r}))"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    tag = sys.implementation.cache_tag
    assert (tmp_path / "lib" / "pkg" / "__pycache__" / f"mod.{tag}.pyc").is_file()
    assert (tmp_path / "tests" / "__pycache__" / f"helper.{tag}.pyc").is_file()


def test_a_cpu_table_descriptor_is_used_only_where_it_is_the_file_run_parallel_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest starts again under the socket guard (tests/conftest.py) and keeps the variable and the descriptor;
    a pytest that a test starts keeps the variable only, and its descriptor of that number is another file."""
    with (tmp_path / "table").open("w") as table, (tmp_path / "other").open("w") as other:
        fd, st = table.fileno(), os.fstat(table.fileno())
        assert _part_cpu.cpu_table_variable(fd) == f"{fd}:{st.st_dev}.{st.st_ino}"
        monkeypatch.setenv(run_parallel.CPU_TABLE_ENV, f"{fd}:{st.st_dev}.{st.st_ino}")
        assert _part_cpu.cpu_table_descriptor() == fd
        monkeypatch.setenv(run_parallel.CPU_TABLE_ENV, f"{other.fileno()}:{st.st_dev}.{st.st_ino}")
        assert _part_cpu.cpu_table_descriptor() is None
    monkeypatch.setenv(run_parallel.CPU_TABLE_ENV, f"{fd}:{st.st_dev}.{st.st_ino}")  # (closed now)
    assert _part_cpu.cpu_table_descriptor() is None


def _stat(busy: int, idle: int) -> str:
    return f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0  {busy} 0 0 {idle} 0 0 0 0 0 0\n"


def test_how_busy_the_cores_were_is_read_over_a_whole_window() -> None:
    reads = iter([_stat(0, 0), _stat(0, 0), _stat(50, 50), _stat(80, 120), _stat(230, 120)])
    cores = _part_cpu.CoresBusy(10.0, read=lambda: next(reads))
    cores.restart(now=0.0)
    cores.sample(now=5.0)
    assert cores.busy() is None  # (not a whole window yet)
    cores.sample(now=10.0)
    assert cores.busy() == 80 / 200
    cores.sample(now=25.0)
    assert cores.busy() == 1.0  # (the last window only: 10 s to 25 s, every jiffy busy)


def test_the_cores_timeline_has_the_busy_share_of_each_interval() -> None:
    reads = iter([_stat(0, 0), _stat(150, 50), _stat(150, 250), _stat(250, 250)])
    timeline = _part_cpu.CoresTimeline(read=lambda: next(reads))
    assert timeline.shares() == []
    for _ in range(3):
        timeline.sample()
    assert timeline.shares() == [0.75, 0.0, 1.0]


@pytest.mark.parametrize("busy_share", [0.0, 1.0])
def test_one_part_more_starts_only_while_the_cores_idle(busy_share: float) -> None:
    """One part at a time: on idle cores the shortest part left starts beside the first as the extra one, and the
    next one once that has ended; on busy cores none does, and the parts run one after another, the longest first."""
    todo = [run_parallel.Part(name, [], weight) for name, weight in (("long", 3.0), ("middle", 2.0), ("short", 1.0))]
    jiffies = iter(range(0, 10**9, 100))
    cores = _part_cpu.CoresBusy(
        0.05, read=lambda: _stat(int((j := next(jiffies)) * busy_share), int(j * (1 - busy_share)))
    )
    release = threading.Event()
    started: list[str] = []

    def launch(part: run_parallel.Part) -> threading.Thread:
        started.append(part.name)
        thread = threading.Thread(target=release.wait, args=(0.5 if part.name == "long" else 0.0,))
        thread.start()
        return thread

    runner = threading.Thread(target=run_parallel.schedule, args=(list(todo), 1, launch, cores, 0.01))
    runner.start()
    runner.join(timeout=30)
    release.set()
    assert not runner.is_alive()
    if busy_share == 0.0:
        assert started == ["long", "short", "middle"] and [p.extra for p in todo] == [False, True, True]
    else:
        assert started == ["long", "middle", "short"] and not any(p.extra for p in todo)
