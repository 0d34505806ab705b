"""Under fray's socket guard a process connects to an abstract Unix socket only if this user (or root) holds it:
an abstract name is free again once its process dies, and another user who bound it would receive what this
user's processes still send there. The squatter is user nobody (setpriv)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fray_monarch import socket_guard

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="binding as another user needs root (setpriv)")


# As nobody: listen on an abstract name (as if bound after the victim's process that held it died), say "bound",
# then report whether anything connected and what it sent, within 5 s.
SQUAT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\\0" + sys.argv[1]); s.listen(4); s.settimeout(5)
print("bound", flush=True)
try:
    conn, _ = s.accept()
    conn.settimeout(2)
    print("got", repr(conn.recv(100)), flush=True)
except (TimeoutError, OSError) as exc:
    print("nothing", type(exc).__name__, flush=True)
"""

CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\\0" + sys.argv[1])
    s.sendall(b"a message for my own process")
    print("sent", flush=True)
except OSError as exc:
    print("refused", exc.errno, flush=True)
"""


@as_root
@pytest.mark.parametrize("guarded", [True, False])
def test_a_guarded_process_sends_nothing_to_an_abstract_name_another_user_took(guarded: bool) -> None:
    """An abstract name is free again once its process dies: another user who binds it would receive what this
    user's processes still send there. Under the guard such a connect fails before anything is sent. (Monarch 0.7
    was not seen sending to a dead process's names; the guard does not rely on that.)"""
    name = f"fray-test-squat-{os.getpid()}-{guarded}"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FRAY_BACKEND")}  # started unguarded
    squatter = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", SQUAT, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "bound"
        victim_env = socket_guard.guarded_environ() if guarded else env
        done = subprocess.run(
            [sys.executable, "-c", CONNECT, name], capture_output=True, text=True, timeout=60, env=victim_env
        )
        heard = squatter.communicate(timeout=30)[0]
    finally:
        squatter.kill()
    if guarded:
        assert done.stdout.strip() == "refused 111", done.stdout + done.stderr  # ECONNREFUSED
        assert f"refused to connect to an abstract Unix socket held by uid {NOBODY}" in done.stderr
        assert "a message" not in heard
    else:  # what the guard prevents
        assert done.stdout.strip() == "sent" and "a message for my own process" in heard
