"""fray_monarch.core.environ.publish: variables set in a process where other threads read the environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_published_variables_reach_getenv_os_environ_and_children_while_threads_read() -> None:
    code = textwrap.dedent(
        """
        import ctypes, os, subprocess, sys, threading
        from fray_monarch.core.environ import publish

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        stop = threading.Event()

        def read():  # as Monarch's Rust threads do, through libc, while variables are added
            while not stop.is_set():
                libc.getenv(b"HYPERACTOR_PROCESS_NAME")

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        for i in range(300):
            publish({f"FRAY_ENV_TEST_{i}": str(i), "FRAY_ENV_TEST_SAME": str(i)})
        stop.set()
        for t in readers:
            t.join()
        assert libc.getenv(b"FRAY_ENV_TEST_299") == b"299" and libc.getenv(b"FRAY_ENV_TEST_SAME") == b"299"
        assert os.environ["FRAY_ENV_TEST_7"] == "7" and os.environ["FRAY_ENV_TEST_SAME"] == "299"
        assert os.environ["PATH"] and libc.getenv(b"PATH")  # what was there stays
        out = subprocess.run(["sh", "-c", "echo $FRAY_ENV_TEST_42"], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "42", out.stdout
        publish({"FRAY_ENV_TEST_42": None})  # None removes it
        assert libc.getenv(b"FRAY_ENV_TEST_42") is None and "FRAY_ENV_TEST_42" not in os.environ
        assert os.environ["FRAY_ENV_TEST_41"] == "41"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
