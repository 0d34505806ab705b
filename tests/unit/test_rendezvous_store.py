"""The rendezvous store fray serves for an SPMD group (in rank 0's process) and for a job's ranks (in the job's
supervisor) listens from the start and loads torch only when a rank connects: a group or a job whose code never
calls torch.distributed does not pay torch's import. Real torch.distributed clients, a real supervisor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fray.host.net import free_port

pytest.importorskip("torch.distributed", reason="torch is not installed (the rendezvous is torch.distributed's)")

RANK_ZERO = textwrap.dedent(
    """
    import os, sys
    from datetime import timedelta
    from fray.runtime.rendezvous import serve_store
    serve_store(os.environ)
    print("LOADED_BEFORE", "torch" in sys.modules, flush=True)
    from torch.distributed import TCPStore
    client = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, False, timeout=timedelta(seconds=60))
    client.set("key", "value")
    print("READ", client.get("key").decode(), flush=True)
    """
)

RANK_WITHOUT_TORCH = textwrap.dedent(
    """
    import os
    maps = open(f"/proc/{os.getppid()}/maps").read()  # the supervisor's: is torch's library loaded there?
    print("SUPERVISOR_HAS_TORCH", "libtorch" in maps, flush=True)
    """
)


# A store still being made in torch's C++ when the process ends (here: made, then waiting 1 s for a key no one
# sets), while the interpreter is still finalizing (a slow __del__ of a module's object) when the making returns.
EXIT_WHILE_MAKING = textwrap.dedent(
    """
    import socket, sys, time, types
    from datetime import timedelta
    from fray.runtime.rendezvous import LazyStore

    class SlowToMake(LazyStore):
        def _make_store(self):
            store = super()._make_store()
            try:
                store.wait(["never set"], timedelta(seconds=1))  # (in torch's C++, the GIL let go)
            except Exception:
                pass
            return store

    class SlowToFinalize:
        def __del__(self, sleep=time.sleep):
            sleep(1.5)

    sys.modules["slow_to_finalize"] = types.ModuleType("slow_to_finalize")
    sys.modules["slow_to_finalize"].it = SlowToFinalize()  # (a module's dict is cleared as the process ends)
    import torch.distributed
    store = SlowToMake("127.0.0.1", 0, 1)
    rank = socket.create_connection(("127.0.0.1", store.port))  # a rank connects: the store is being made
    time.sleep(0.5)
    print("EXITING", flush=True)
    """
)


# A rank connecting to a store that could not be made, with a 3 s rendezvous timeout: torch's client waits for the
# server's first answer without its timeout, as long as the socket it reached stays open.
RANK_OF_A_STORE_NOT_MADE = textwrap.dedent(
    """
    import os, threading
    from datetime import timedelta
    from torch.distributed import TCPStore
    from fray.runtime.rendezvous import LazyStore

    class CannotMake(LazyStore):
        def _make_store(self):
            raise RuntimeError("no store here")

    store = CannotMake("127.0.0.1", 0, 2)
    outcome = []

    def rank():
        try:
            TCPStore("127.0.0.1", store.port, 2, False, timeout=timedelta(seconds=3))
            outcome.append("connected")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=rank, daemon=True)
    thread.start()
    thread.join(20)
    print("RANK", outcome[0] if outcome else "still waiting", flush=True)
    os._exit(0)  # (not a normal end: a rank still waiting is in torch's C++)
    """
)


def test_rank_zero_serves_its_groups_store_without_loading_torch_until_a_rank_connects() -> None:
    env = {
        **os.environ,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    done = subprocess.run([sys.executable, "-c", RANK_ZERO], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "LOADED_BEFORE False" in done.stdout, f"torch loaded before a rank connected: {done.stdout}"
    assert "READ value" in done.stdout  # the store, made once the rank (this same process) connected, serves


def test_a_process_that_ends_while_its_store_is_being_made_ends_cleanly() -> None:
    done = subprocess.run([sys.executable, "-c", EXIT_WHILE_MAKING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # (not SIGABRT from torch's C++)
    assert "EXITING" in done.stdout


def test_a_rank_of_a_store_that_could_not_be_made_fails_by_its_timeout() -> None:
    done = subprocess.run([sys.executable, "-c", RANK_OF_A_STORE_NOT_MADE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "RANK Dist" in done.stdout, done.stdout + done.stderr[-2000:]  # (torch's DistNetworkError or DistStoreError)
    assert "could not serve the rendezvous store" in done.stderr  # (and fray's log says why)


def test_a_jobs_supervisor_does_not_load_torch_for_ranks_that_never_rendezvous() -> None:
    ranks = [sys.executable, "-c", RANK_WITHOUT_TORCH]
    done = subprocess.run(
        [sys.executable, "-m", "fray.jobs.supervisor", "--replicas", "2", "--", *ranks],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("SUPERVISOR_HAS_TORCH False") == 2, done.stdout
