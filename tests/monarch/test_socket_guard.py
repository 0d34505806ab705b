"""Another user of the machine cannot reach a monarch context's sockets (issue 29, item 1, high).

Monarch 0.7 serves every process's mailbox on abstract Unix sockets that any local user can connect to; fray's
socket guard closes such connections before Monarch sees them. Loopback TCP is TLS like any other address, and a
driver started without the guard is refused unless its spec accepts that. The attacker is user nobody (setpriv)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _sockets import unguarded_env

from fray.host.procfs import children_of
from fray_monarch import socket_guard

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
as_root = pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root (setpriv)")

DRIVER = """
import os, sys
import fray
ctx = fray.init(sys.argv[1])
pids = {ctx.get(ctx.create_task(os.getpid, ())) for _ in range(8)}
print("ready", flush=True)
sys.stdin.read()
fray.shutdown()
"""

# As nobody: connect to each abstract socket named in argv and say whether its server closed the connection at
# once ("closed": refused) or kept it (it waits for a message: "open").
KNOCK = """
import socket, sys
from concurrent.futures import ThreadPoolExecutor
def knock(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect("\\0" + name)
            return "closed" if s.recv(1) == b"" else "open"
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "open"
        except OSError as exc:
            return f"error {exc}"
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    for name, verdict in zip(sys.argv[1:], pool.map(knock, sys.argv[1:])):
        print(name, verdict)
"""


def _tree(root: int) -> list[int]:
    """`root` and its live descendants."""
    tree = [root]
    for pid in tree:
        tree += children_of(pid)
    return tree


def _abstract_listeners(pids: list[int]) -> list[str]:
    """The names (without '@') of the abstract Unix sockets these processes listen on."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    names = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        listening = int(fields[3], 16) & 0x10000  # __SO_ACCEPTCON
        if listening and fields[6] in inodes and len(fields) > 7 and fields[7].startswith("@"):
            names.append(fields[7][1:])
    return names


def _knock(names: list[str], as_nobody: bool) -> dict[str, str]:
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if as_nobody else []
    env = unguarded_env()  # root's library: nobody cannot read it
    done = subprocess.run(
        [*prefix, sys.executable, "-c", KNOCK, *names], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def _start_driver(spec: str, guarded: bool, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    if env is None:
        env = socket_guard.guarded_environ() if guarded else unguarded_env()
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert driver.stdout is not None
    line = driver.stdout.readline()
    if line.strip() != "ready":
        driver.kill()
        _, err = driver.communicate(timeout=30)
        pytest.fail(f"the driver did not start: {line}{err[-3000:]}")
    return driver


def _stop(driver: subprocess.Popen[str]) -> str:
    try:
        _, err = driver.communicate("", timeout=60)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate(timeout=30)
    return err


@as_root
def test_another_user_cannot_connect_to_a_guarded_contexts_abstract_sockets() -> None:
    driver = _start_driver("monarch?procs=2", guarded=True)
    try:
        time.sleep(0.5)
        pids = _tree(driver.pid)
        names = _abstract_listeners(pids)
        assert len(pids) >= 3 and names, (pids, names)  # the driver and its worker processes, all listening
        as_nobody = _knock(names, as_nobody=True)
        assert set(as_nobody.values()) == {"closed"}, as_nobody
        # this user's own connection to the same sockets is kept: the check tells the two apart
        assert set(_knock(names, as_nobody=False).values()) == {"open"}
    finally:
        err = _stop(driver)
    assert "fray socket guard: refused a Unix-socket connection" in err and f"from uid {NOBODY}" in err


@as_root
def test_without_the_guard_the_same_sockets_are_open_to_another_user() -> None:
    """What the guard closes (and what `unguarded_sockets=true` accepts): this test's knock can fail."""
    driver = _start_driver("monarch?procs=2&unguarded_sockets=true", guarded=False)
    try:
        time.sleep(0.5)
        names = _abstract_listeners(_tree(driver.pid))
        assert names
        assert "open" in set(_knock(names, as_nobody=True).values())
    finally:
        _stop(driver)


def test_a_driver_without_the_guard_is_refused_naming_the_ways_to_start_it() -> None:
    env = unguarded_env()
    done = subprocess.run(
        [sys.executable, "-c", "import fray; fray.init('monarch?procs=1')"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert "abstract Unix sockets" in done.stderr and "python -m fray_monarch.socket_guard" in done.stderr
    assert "unguarded_sockets=true" in done.stderr


def test_the_guard_runs_a_command_under_it_and_prints_its_path() -> None:
    path = subprocess.run(
        [sys.executable, "-m", "fray_monarch.socket_guard"], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    info = os.lstat(path)
    assert info.st_uid == os.getuid() and not info.st_mode & 0o022
    probe = "from fray_monarch.socket_guard import active; print(active())"
    env = unguarded_env()
    under = [sys.executable, "-m", "fray_monarch.socket_guard", sys.executable, "-c", probe]
    assert subprocess.run(under, capture_output=True, text=True, timeout=60, env=env).stdout.strip() == "True"
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert plain.stdout.strip() == "False"


def test_the_documented_command_is_quiet() -> None:
    """`python -m fray_monarch.socket_guard` warned on every call that runpy found the module already imported
    (importing the fray_monarch package imported it): the command users are told to type says nothing else."""
    for args in ([], [sys.executable, "-c", "print('ran')"]):
        done = subprocess.run(
            [sys.executable, "-W", "default", "-m", "fray_monarch.socket_guard", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
        assert done.stdout.strip() == ("ran" if args else str(socket_guard.library()))
    from fray_monarch.cluster.topology import SCHEMA

    assert socket_guard.OPT_OUT in SCHEMA  # the spec option, spelled out there


def _backend_only(spec: str) -> dict[str, str]:
    """An environment with nothing of the guard's: only FRAY_BACKEND names the backend."""
    return {**unguarded_env(), "FRAY_BACKEND": spec}


def test_fray_backend_monarch_alone_runs_the_readme_example_under_the_guard() -> None:
    """`FRAY_BACKEND=monarch python app.py` works as on ray: the driver restarts itself under the guard before
    any of its code runs (fray_monarch_autoguard), keeping its arguments and standard input."""
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "pipeline.py")],
        env=_backend_only("monarch"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok: statistics match" in done.stdout
    assert done.stdout.count("aggregated") == 1  # (what ran before the restart: nothing of the program's)
    probe = "import sys; from fray_monarch.socket_guard import active; print(active(), sys.argv[1:], input())"
    for spec, guarded in (("monarch", True), ("monarch?procs=2", True), ("ray", False)):
        seen = subprocess.run(
            [sys.executable, "-c", probe, "a b", "c"],
            env=_backend_only(spec),
            input="from stdin\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert seen.stdout.strip() == f"{guarded} ['a b', 'c'] from stdin", (spec, seen.stdout, seen.stderr)
    opted_out = subprocess.run(
        [sys.executable, "-c", "from fray_monarch.socket_guard import active; print(active())"],
        env=_backend_only("monarch?unguarded_sockets=true"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert opted_out.stdout.strip() == "False"  # (the spec accepts a driver without it)


@as_root
def test_a_driver_started_by_fray_backend_alone_refuses_another_user() -> None:
    driver = _start_driver("monarch?procs=2", guarded=False, env=_backend_only("monarch"))
    try:
        time.sleep(0.5)
        names = _abstract_listeners(_tree(driver.pid))
        assert names
        assert set(_knock(names, as_nobody=True).values()) == {"closed"}
    finally:
        _stop(driver)


def test_unguarded_sockets_warns_once_naming_what_it_reaches() -> None:
    code = (
        "import fray\n"
        "for _ in range(2):\n"
        "    ctx = fray.init('monarch?procs=1&unguarded_sockets=true')\n"
        "    ctx.get(ctx.create_task(abs, args=(-1,)), timeout=120)\n"
        "    fray.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=unguarded_env(), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("unguarded_sockets=true: this driver and what it starts run without") == 1
    assert "host workers it launches over ssh or Slurm" in done.stderr and "the jobs of a cluster" in done.stderr
