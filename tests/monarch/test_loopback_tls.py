"""Loopback is no private network: every user of the machine reaches 127.0.0.1 (issue 29, item 1). A host
worker there serves TLS like anywhere else, plain TCP only when asked with --insecure; a driver's `bind=127.0.0.1`
is TLS; and another user's driver cannot attach to this user's loopback worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import fray
from fray.errors import FrayError

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="running a driver as another user needs root (setpriv)")
PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _worker(address: str, *extra: str) -> Iterator[subprocess.Popen[str]]:
    worker = subprocess.Popen(
        [PY, "-m", "fray_monarch.worker", "--address", address, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert "serving on" in line, line + (worker.stdout.read() if worker.poll() is not None else "")
        yield worker
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(30)


def test_a_worker_refuses_plain_tcp_on_loopback_without_insecure() -> None:
    done = subprocess.run(
        [PY, "-m", "fray_monarch.worker", "--address", f"tcp://127.0.0.1:{_free_port()}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "plain TCP" in done.stderr and "every user of this machine" in done.stderr and "tls://" in done.stderr


def test_a_driver_refuses_loopback_tcp_workers_without_insecure() -> None:
    with pytest.raises(ValueError, match="loopback, which every local user reaches"):
        fray.init(f"monarch?hosts=tcp://127.0.0.1:{_free_port()}")


def test_bind_to_loopback_makes_the_drivers_own_transport_tls() -> None:
    probe = (
        "import fray\n"
        "from fray_monarch.net import network\n"
        "ctx = fray.init('monarch?procs=1&bind=127.0.0.1')\n"
        "print(network._monarch_transport()[1])\n"
        "fray.shutdown()\n"
    )
    done = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].lower().startswith("tls"), done.stdout


# As nobody, with a TLS authority of its own: Monarch's own client attaching to the worker at argv[1], as a fray
# driver would (a process of nobody's cannot start this interpreter again, as fray's watchdog does: it lives in
# root's home). An attached host mesh spawns processes and runs actors there: as the worker's user.
INTRUDER = """
import os, sys
from fray_monarch.net import tls
address = sys.argv[1]
identity = tls.issue(tls.own_names("127.0.0.1"))
for var, text in ((tls.ENV_CA, identity.ca), (tls.ENV_CERT, identity.cert), (tls.ENV_KEY, identity.key)):
    path = os.path.join(os.environ["HOME"], var.lower() + ".pem")
    with open(path, "w") as f:
        f.write(text)
    os.environ[var] = path
from monarch.actor import attach_to_workers, enable_transport
enable_transport(address.split("://")[0] + "://127.0.0.1:0")
try:
    attach_to_workers(workers=[address], ca="trust_all_connections").initialized.get(timeout=float(sys.argv[2]))
    print("attached")
except Exception as exc:
    print("refused:", type(exc).__name__, str(exc)[:300])
sys.stdout.flush()
os._exit(0)
"""


def _as_nobody(address: str, home: str, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FRAY_TLS_DIR")}
    env.update(HOME=home, FRAY_TLS_DIR=os.path.join(home, "tls"), TMPDIR=home, MONARCH_FILE_LOG="error")
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            PY,
            "-c",
            INTRUDER,
            address,
            str(timeout),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=home,
    )
    return done.stdout + done.stderr[-2000:]


@as_root
def test_another_user_cannot_attach_to_this_users_loopback_worker() -> None:
    home = tempfile.mkdtemp(prefix="fray-test-nobody-", dir="/tmp")  # /tmp itself: nobody can enter it
    os.chown(home, NOBODY, NOBODY)
    try:
        port = _free_port()
        with _worker(f"tls://127.0.0.1:{port}"):
            out = _as_nobody(f"tls://127.0.0.1:{port}", home, 4)
            assert "refused:" in out and "attached" not in out, out
        # The same worker on plain TCP (--insecure) lets them attach: what the test tells apart.
        port = _free_port()
        with _worker(f"tcp://127.0.0.1:{port}", "--insecure"):
            time.sleep(0.2)
            out = _as_nobody(f"tcp://127.0.0.1:{port}", home, 30)
            assert "attached" in out, out
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", home], check=False)


def test_a_driver_attaches_to_its_own_users_loopback_tls_worker() -> None:
    port = _free_port()
    with _worker(f"tls://127.0.0.1:{port}"):
        probe = (
            "import os, sys, fray\n"
            "ctx = fray.init(sys.argv[1])\n"
            "print(ctx.get(ctx.create_task(os.getuid, ()), timeout=60))\n"
            "fray.shutdown()\n"
        )
        spec = f"monarch?hosts=tls://127.0.0.1:{port}&attach_timeout=30"
        done = subprocess.run([PY, "-c", probe, spec], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0 and done.stdout.strip() == str(os.getuid()), done.stderr[-3000:]


def test_unguarded_sockets_is_a_flag() -> None:
    with pytest.raises((ValueError, FrayError), match="unguarded_sockets"):
        fray.init("monarch?unguarded_sockets=maybe")
