"""fray_monarch.core.environ.publish: variables set in a process where other threads read the environment."""

from __future__ import annotations

import os
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


def test_two_threads_publishing_at_once_both_reach_getenv() -> None:
    """At a worker's start WorkerHost publishes the process's CUDA_VISIBLE_DEVICES while an actor's init publishes
    its variables, on two threads. Each reads the current array and swaps in its own: interleaved (forced here:
    both have read the array before either swaps), the later swap dropped the earlier one's variable from the C
    environment (getenv: CUDA never saw its devices) while os.environ still showed it."""
    code = textwrap.dedent(
        """
        import ctypes, os, threading
        from fray_monarch.core import environ

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        both_read = threading.Barrier(2)
        read = environ._entries

        def read_then_wait():  # the interleaving: each thread has read the array before either swaps its own in
            entries = read()
            try:
                both_read.wait(timeout=1.0)
            except threading.BrokenBarrierError:  # (the other thread waits for this one's publish to end)
                pass
            return entries

        environ._entries = read_then_wait
        threads = [
            threading.Thread(target=environ.publish, args=({"CUDA_VISIBLE_DEVICES": "3"},)),
            threading.Thread(target=environ.publish, args=({"RANK": "1", "LOCAL_RANK": "1"},)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen = {k: libc.getenv(k.encode()) for k in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK")}
        assert seen == {"CUDA_VISIBLE_DEVICES": b"3", "RANK": b"1", "LOCAL_RANK": b"1"}, seen
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
