"""The whole test matrix in parallel parts: `make test` runs this (plain `pytest tests` runs the same tests, one
after another).

The tests are cut into parts: each directory of tests/, each test file at its top, and the conformance suite once
per installed backend. PARALLEL parts run at a time (FRAY_TEST_PARALLEL, default: the machine's cores, at most 3),
the longest first (WEIGHTS: seconds measured on a 2-core machine; a part not listed counts as DEFAULT_WEIGHT). By
default one part more, the shortest left, starts whenever the cores have been idle enough lately (`schedule`): a
part waits part of its time, and a fast machine's cores then idle; a machine the parts keep busy gets no more load
(a part more on a busy 2-core machine once failed a Ray cluster's start: see .agents/test-speed.md).

Many tests look at what the whole machine holds (every process of the user, /dev/shm, /tmp, the user's fray
state directory) to prove that nothing was left behind. Two parts running at once would see each other's work
there, so each part runs in a machine of its own as far as those tests can tell: a PID namespace (it sees only its
own processes; they all die with it), and a mount namespace with its own /dev/shm, /tmp and fray state directory
(empty tmpfs; a checkout under /tmp is bound back at its path). That needs root and `unshare`; without them, or
with FRAY_TEST_PARALLEL=1, the parts run one after another in this process's namespaces.

Each part's output goes to a file; a part's summary line is printed as it ends, and the whole output of every
part that failed is printed at the end. Where the runner can make cgroups (root, cgroup v1's cpuacct or v2), each
part runs in one of its own, and the CPU time it used (every process it started, daemons included) is printed
with its line, and the total at the end: the run is as long as the machine's cores are busy, so that is what a
cut must lower.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _part_cpu import CPU_TABLE_ENV, CoresBusy, CoresTimeline, CpuMeter, cpu_table_descriptor, cpu_table_variable

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
CONFORMANCE = "tests/test_conformance.py"
MAX_PARALLEL = 3
DEFAULT_WEIGHT = 60.0
PART_TIMEOUT = 3600.0  # seconds a part may run before it is killed (with everything it started)
FAILED_TAIL = 400  # lines of a failed part's output printed at the end
PR_SET_PDEATHSIG = 1  # (linux/prctl.h)
_LIBC = ctypes.CDLL(None, use_errno=True)  # (loaded here: a forked child of a threaded process must not load)
EXTRA_WINDOW = 30.0  # seconds of the machine's CPU looked at before one part more than PARALLEL starts ...
EXTRA_BELOW = 0.8  # ... while the cores were less busy than this share of the time over that window
TIMELINE_STEP = 60.0  # seconds of each figure in the cores' timeline printed at the end
SLOWEST = 30  # the slowest steps (setup, call, teardown) over every part, printed at the end
CPU_TOP_ENV = "FRAY_TEST_CPU_TOP"  # (tests/_cpu_per_test.py: how many of a part's costliest tests it lists)
# Seconds each part took in a full run on a 2-core machine (two parts at a time); only their order matters.
WEIGHTS: dict[str, float] = {
    "tests/ray": 680.0,
    f"{CONFORMANCE}::ray": 654.0,
    "tests/monarch": 519.0,
    f"{CONFORMANCE}::monarch": 391.0,
    "tests/unit": 252.0,
    "tests/reliability": 215.0,
    f"{CONFORMANCE}::in_memory": 190.0,
    "tests/test_benchmarks.py": 170.0,
    "tests/test_conformance_process_pool.py": 137.0,
    "tests/test_cli_jobs.py": 90.0,
    "tests/dashboard": 39.0,
    "tests/test_worker_output.py": 37.0,
    "tests/test_interrupts.py": 25.0,
    "tests/test_cli_job_shapes.py": 24.0,
    "tests/test_conformance_process_actors.py": 21.0,
    "tests/test_cli_job_dependencies.py": 7.0,
    "tests/gpu": 4.0,
}


@dataclass
class Part:
    name: str
    args: list[str]
    weight: float
    log: Path | None = None
    code: int | None = None
    seconds: float = 0.0
    summary: str = ""
    skipped_reason: str = ""
    extra: bool = False  # started as the part more than PARALLEL, while the cores idled
    cpu: float | None = None  # CPU seconds of everything the part ran (None: no cgroup to count them in)
    tail: list[str] = field(default_factory=list)
    durations: list[tuple[float, str]] = field(default_factory=list)
    cpu_tests: list[tuple[float, str]] = field(default_factory=list)


def installed_backends() -> list[str]:
    """The backends the conformance suite runs by default here (its plugin's own choice)."""
    code = "from fray.testing.plugin import selected_backends\nclass C:\n    def getoption(self, *a): return None\n"
    code += "print(','.join(selected_backends(C())))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"run_parallel: could not list the installed backends:\n{done.stderr}")
    return [name for name in done.stdout.strip().split(",") if name]


def parts(backends: list[str]) -> list[Part]:
    """Every test of tests/, in parts; the longest first."""
    found: list[Part] = []
    for entry in sorted(TESTS.iterdir()):
        rel = entry.relative_to(REPO).as_posix()
        if entry.is_dir() and any(entry.rglob("test_*.py")):
            found.append(Part(rel, [rel], WEIGHTS.get(rel, DEFAULT_WEIGHT)))
        elif entry.is_file() and entry.name.startswith("test_") and entry.suffix == ".py":
            if rel == CONFORMANCE and backends:
                for name in backends:
                    key = f"{rel}::{name}"
                    found.append(Part(key, [rel, f"--fray-backend={name}"], WEIGHTS.get(key, DEFAULT_WEIGHT)))
            else:
                found.append(Part(rel, [rel], WEIGHTS.get(rel, DEFAULT_WEIGHT)))
    return sorted(found, key=lambda p: -p.weight)


def parallel_count() -> int:
    raw = os.environ.get("FRAY_TEST_PARALLEL", "")
    if raw:
        try:
            count = int(raw)
        except ValueError:
            raise SystemExit(
                f"run_parallel: FRAY_TEST_PARALLEL={raw!r} is not a whole number (1 runs in series)"
            ) from None
        if count < 1:
            raise SystemExit(f"run_parallel: FRAY_TEST_PARALLEL={raw!r}: give 1 or more")
        return count
    return max(1, min(MAX_PARALLEL, os.cpu_count() or 1))


def extra_part_allowed(count: int, why_not: str) -> bool:
    """One part more than `count` while the cores idle: only by default (FRAY_TEST_PARALLEL unset) and where the
    parts run in namespaces of their own, side by side."""
    return count > 1 and not why_not and not os.environ.get("FRAY_TEST_PARALLEL")


def schedule(
    queue: list[Part],
    count: int,
    launch: Callable[[Part], threading.Thread],
    cores: CoresBusy | None,
    tick: float = 1.0,
) -> None:
    """Runs every part of `queue` (the longest first), `count` at a time, each by `launch` (its started thread).
    With `cores`, one part more, the shortest left, whenever the machine's cores were less than EXTRA_BELOW busy over
    the last EXTRA_WINDOW: a part spends part of its time waiting (engines starting, timeouts, subprocesses), which
    leaves the cores idle on a fast machine; on a machine the `count` parts keep busy, none starts, and the load
    stays theirs (one more part on a busy 2-core machine once failed a Ray cluster's start)."""
    running: dict[threading.Thread, Part] = {}
    while queue or running:
        running = {thread: part for thread, part in running.items() if thread.is_alive()}
        while queue and sum(not part.extra for part in running.values()) < count:
            part = queue.pop(0)
            running[launch(part)] = part
        if cores is not None:
            cores.sample()
            busy = cores.busy()
            if queue and not any(part.extra for part in running.values()) and busy is not None and busy < EXTRA_BELOW:
                part = queue.pop()
                part.extra = True
                running[launch(part)] = part
                cores.restart()
        time.sleep(tick)


def isolation_available() -> str:
    """'' where each part can have namespaces of its own, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "" if probe.returncode == 0 else f"unshare failed: {probe.stderr.strip()}"


SOURCES = ("lib", "backends", "tests", "examples", "benchmarks")  # the checkout's Python, compiled before a run


def compile_sources(root: Path = REPO) -> None:
    """Byte-compile the checkout's Python files before the parts start. An editable install is never compiled,
    and where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) no process writes a .pyc: every process the
    tests start (a job's supervisor, a Ray worker, a `fray` command, a rank) would compile each fray module it
    imports again. A wheel is compiled when it is installed; this makes the checkout alike. A .pyc is used only
    while its source is unchanged, so an edit made after this is still what runs."""
    import compileall

    for name in SOURCES:
        if (root / name).is_dir():
            compileall.compile_dir(root / name, quiet=1, workers=0)


# ------------------------------------------------------------------ inside a part's namespaces
def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True, timeout=60)


def _private_dirs() -> None:
    """This mount namespace's own /dev/shm, /tmp and fray state directory (the checkout kept where it is)."""
    from fray.host.state_dir import state_dir

    state = state_dir()
    under_tmp = [p for p in (REPO, Path(sys.prefix)) if p.is_relative_to("/tmp")]
    under_tmp = [p for p in under_tmp if not any(p != q and p.is_relative_to(q) for q in under_tmp)]
    _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm")
    held = Path("/run") / f"fray-tests-{os.getpid()}-{time.monotonic_ns()}"
    if under_tmp:
        held.mkdir(mode=0o700)
        _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(held))
        for i, path in enumerate(under_tmp):
            (held / str(i)).mkdir()
            _mount("--rbind", str(path), str(held / str(i)))
    _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp")
    for i, path in enumerate(under_tmp):
        path.mkdir(parents=True, exist_ok=True)
        _mount("--rbind", str(held / str(i)), str(path))
    if under_tmp:
        _mount("--make-rprivate", str(held))
        subprocess.run(["umount", "-l", str(held)], check=True, timeout=60)
        held.rmdir()
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(state))


def _end_namespace(signum: int, _frame: object) -> None:
    """PID 1 ending ends every process of its namespace (the kernel kills them): the part is stopped whole."""
    os._exit(128 + signum)


def inside(args: list[str]) -> int:
    """As PID 1 of a part's namespace: its private directories, then pytest; reaps every orphan until pytest
    ends (an init's duty), and returns pytest's exit code. A PID 1 ignores the signals it has no handler for:
    SIGTERM, SIGINT and SIGHUP (the runner stopped, a Ctrl-C) end the namespace."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _end_namespace)
    _private_dirs()
    table = cpu_table_descriptor()
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        pass_fds=() if table is None else (table,),
    )
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


# ------------------------------------------------------------------ the runner
def _die_with_parent() -> None:
    """In a part's first process, before it runs: SIGKILL when the runner's thread that started it ends."""
    if _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def run_part(part: Part, logs: Path, isolated: bool) -> None:
    part.log = logs / (part.name.replace("/", "_").replace(":", "_") + ".log")
    command = [sys.executable, str(Path(__file__).resolve()), "--inside", *part.args]
    if isolated:
        command = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private", *command]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *part.args]
    meter = CpuMeter.make(part.name) if os.geteuid() == 0 else None

    def before_exec() -> None:
        _die_with_parent()  # (the runner killed: its parts with it, however it ended)
        if meter is not None:
            meter.enter()

    env = dict(os.environ)
    # Rust error values capture no backtrace where RUST_BACKTRACE is set (resolving one reads a library's debug
    # info, in every Monarch process fray stops); a panic still prints its own (RUST_BACKTRACE decides that).
    env.setdefault("RUST_LIB_BACKTRACE", "0")
    start = time.monotonic()
    # (the table goes by a descriptor: the part's /tmp, where the logs are, is not this one)
    with part.log.open("wb") as out, part.log.with_suffix(".cpu.tsv").open("w") as table:
        if meter is not None:  # (its pytest lists the tests that used the most CPU: tests/_cpu_per_test.py)
            env[CPU_TOP_ENV] = str(SLOWEST)
            env[CPU_TABLE_ENV] = cpu_table_variable(table.fileno())
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=before_exec,
            pass_fds=(table.fileno(),),
        )
        try:
            part.code = proc.wait(timeout=PART_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # (its own session: started above)
            proc.wait()
            part.code = -1
            out.write(f"\nrun_parallel: {part.name} ran past {PART_TIMEOUT:.0f} s and was killed\n".encode())
    part.seconds = time.monotonic() - start
    if meter is not None:
        part.cpu = meter.seconds()
        meter.remove()
    lines = part.log.read_text(errors="replace").splitlines()
    part.summary = next((line for line in reversed(lines) if line.startswith("=") and " in " in line), "")
    part.tail = lines[-FAILED_TAIL:]
    part.durations = slowest_steps(lines)
    part.cpu_tests = costliest_tests(lines)


def costliest_tests(lines: list[str]) -> list[tuple[float, str]]:
    """(CPU seconds, test) of each line of tests/_cpu_per_test.py's table ("12.34s cpu tests/...")."""
    found = []
    for line in lines:
        head, _, rest = line.strip().partition("s cpu ")
        if rest and head.replace(".", "", 1).isdigit():
            found.append((float(head), rest.strip()))
    return found


def slowest_steps(lines: list[str]) -> list[tuple[float, str]]:
    """(seconds, "when test") of each line of pytest's --durations table ("12.34s call     tests/...")."""
    found = []
    for line in lines:
        head, _, rest = line.partition("s ")
        if rest and head.replace(".", "", 1).isdigit() and rest.split()[0] in ("setup", "call", "teardown"):
            found.append((float(head), " ".join(rest.split())))
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inside"]:
        return inside(argv[1:])
    if argv:
        raise SystemExit("run_parallel: takes no arguments (FRAY_TEST_PARALLEL sets how many parts run at once)")
    count = parallel_count()
    why_not = isolation_available() if count > 1 else "FRAY_TEST_PARALLEL=1"
    if why_not:
        count = 1
    todo = parts(installed_backends())
    compile_sources()
    cores = CoresBusy(EXTRA_WINDOW) if extra_part_allowed(count, why_not) else None
    more = ", one more while the cores idle" if cores is not None else ""
    print(f"run_parallel: {len(todo)} parts, {count} at a time{more}" + (f" (in series: {why_not})" if why_not else ""))
    logs = Path(tempfile.mkdtemp(prefix="fray-test-logs-"))
    lock = threading.Lock()
    began = time.monotonic()

    def run_and_report(part: Part) -> None:
        run_part(part, logs, isolated=not why_not)
        with lock:
            verdict = "ok" if part.code == 0 else f"FAILED (exit {part.code})"
            at = time.monotonic() - began
            cpu = "" if part.cpu is None else f" (CPU {part.cpu:.0f} s)"
            extra = " [the extra part]" if part.extra else ""
            print(f"[{at:6.0f} s] {part.name}: {verdict} in {part.seconds:.0f} s{cpu}{extra}  {part.summary}")
            sys.stdout.flush()

    def launch(part: Part) -> threading.Thread:
        # (a daemon thread: a Ctrl-C ends the runner at once, and each part's PDEATHSIG ends the part with it)
        thread = threading.Thread(target=run_and_report, args=(part,), name=f"fray-test-part-{part.name}", daemon=True)
        thread.start()
        return thread

    timeline = CoresTimeline()

    def sample_timeline() -> None:
        while True:
            time.sleep(TIMELINE_STEP)
            timeline.sample()

    threading.Thread(target=sample_timeline, name="fray-test-cores-timeline", daemon=True).start()
    schedule(list(todo), count, launch, cores)
    failed = [p for p in todo if p.code != 0]
    steps = sorted((step for part in todo for step in part.durations), reverse=True)[:SLOWEST]
    print(f"\nrun_parallel: the slowest {len(steps)} steps of every part")
    for seconds, what in steps:
        print(f"{seconds:8.2f}s {what}")
    costliest = sorted((test for part in todo for test in part.cpu_tests), reverse=True)[:SLOWEST]
    if costliest:
        print(f"\nrun_parallel: the {len(costliest)} tests that used the most CPU (their fixtures' set-up included)")
        for seconds, what in costliest:
            print(f"{seconds:8.2f}s cpu {what}")
    for part in failed:
        print(f"\n{'#' * 30} {part.name}: exit {part.code}, the last {FAILED_TAIL} lines {'#' * 30}")
        print("\n".join(part.tail))
    total = time.monotonic() - began
    print(f"\nrun_parallel: {len(todo) - len(failed)} of {len(todo)} parts passed in {total:.0f} s", end="")
    print(f"; failed: {', '.join(p.name for p in failed)}" if failed else "")
    shares = " ".join(f"{share:.0%}" for share in timeline.shares())
    print(f"run_parallel: the cores' busy share, every {TIMELINE_STEP:.0f} s: {shares}")
    counted = [p.cpu for p in todo if p.cpu is not None]
    if counted:
        cores = os.cpu_count() or 1
        print(
            f"run_parallel: the parts used {sum(counted):.0f} CPU seconds, {sum(counted) / (total * cores):.0%} of "
            f"{cores} cores over the run"
        )
    if not failed:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        print(f"run_parallel: every part's whole output is in {logs}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
