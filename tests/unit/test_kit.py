"""fray.kit: what its remote service lets in (a private socket, the key proved before anything is read, only the
hooks a worker may call), a registered backend found by the processes fray starts, and the processes of the
example ProcessPoolExecutor backend ending with their driver however it ends."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from fray.errors import FrayError, SerializationError
from fray.host import procfs
from fray.in_memory import InMemoryJobContext
from fray.kit import remote
from fray.registry import REGISTERED_ENV

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def service() -> Iterator[remote.RemoteService]:
    ctx = InMemoryJobContext({"CPU": 2.0})
    service = remote.RemoteService(ctx)
    yield service
    service.close()
    ctx.shutdown()


def test_the_socket_is_in_a_private_directory_removed_at_close(service: remote.RemoteService) -> None:
    where = Path(service.setup.address).parent
    info = os.lstat(where)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    service.close()
    assert not where.exists()


def test_a_peer_without_the_key_gets_nothing_and_the_service_goes_on(service: remote.RemoteService) -> None:
    with pytest.raises(AuthenticationError):
        Client(service.setup.address, "AF_UNIX", authkey=b"not the key" * 3)
    worker = remote.worker_context(service.setup)  # a worker with the key is still served
    ref = worker._put([1, 2, 3])
    assert worker._get([ref], 10) == [[1, 2, 3]]
    assert worker.backend == "in_memory" and worker.capabilities == service.setup.capabilities


def test_only_the_hooks_a_worker_may_call_are_answered(service: remote.RemoteService) -> None:
    client = remote._Client(service.setup)
    with pytest.raises(FrayError, match="'_shutdown', which is no hook a worker may call"):
        client.call("_shutdown")
    assert client.call("node_resources") == [{"CPU": 2.0}]


def test_close_ends_the_threads_serving_workers_that_are_still_connected(service: remote.RemoteService) -> None:
    """A worker's connection is served by a thread of its own until the worker hangs up; a worker still
    connected when its driver's context shuts down (a pool process slow to end) must not keep that thread."""
    client = remote._Client(service.setup)
    assert client.call("node_resources") == [{"CPU": 2.0}]
    serving = [t for t in threading.enumerate() if t.name == "fray-kit-request"]
    assert serving
    service.close()
    for thread in serving:
        thread.join(2.0)
    assert not [t for t in serving if t.is_alive()]


def test_a_reply_that_cannot_be_pickled_fails_the_call_not_the_service() -> None:
    ctx = InMemoryJobContext({"CPU": 2.0}, serialize=False)  # (stores a value as it is: a lock too)
    service = remote.RemoteService(ctx)
    try:
        worker = remote.worker_context(service.setup)
        with pytest.raises(SerializationError, match="the reply to _get"):
            worker._get([ctx.put(threading.Lock())], 10)
        assert worker._get([ctx.put(1)], 10) == [1]  # the same connection is still served
    finally:
        service.close()
        ctx.shutdown()


def test_a_registered_backend_is_found_by_a_process_fray_starts() -> None:
    """A job's bare fray.init() in another process finds the backend registered here (REGISTERED_ENV)."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO / "examples")!r})
import subprocess, fray
from process_pool_backend import ProcessPoolBackend
fray.register_backend("pool_here", ProcessPoolBackend)
child = "from fray.registry import get_backend; print(type(get_backend('pool_here')).__name__)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip())
"""
    env = {k: v for k, v in os.environ.items() if k != REGISTERED_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ProcessPoolBackend"


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import fray
    from process_pool_backend import ProcessPoolBackend

    def where() -> int:
        return os.getpid()

    if __name__ == "__main__":
        fray.register_backend("process_pool", ProcessPoolBackend)
        ctx = fray.init("process_pool?cpus=2")
        print("WORKER", ctx.get(ctx.create_task(where), timeout=120), flush=True)
        if sys.argv[1] == "exit":
            sys.exit(0)
        time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["exit", "SIGTERM", "SIGKILL"])
def test_the_pools_processes_end_with_their_driver(how: str, tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # (its socket directory is made there)
    proc = subprocess.Popen(
        [sys.executable, str(script), how, str(REPO / "examples")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("WORKER "), line
        worker = int(line.split()[1])
        assert worker != proc.pid
        if how != "exit":
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not procfs.gone(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procfs.gone(worker), f"the pool's process {worker} outlived its driver ({how})"
        while list(tmp_path.glob("fray-kit-*")) and time.monotonic() < deadline:  # (the watchdog removes it)
            time.sleep(0.1)
        assert list(tmp_path.glob("fray-kit-*")) == [], "the driver's socket directory outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_started_after_its_driver_shut_down_ends_quietly(tmp_path: Path) -> None:
    """A pool may still be starting a process when its driver shuts down (its socket removed): that process ends at
    once, without the initializer's traceback that concurrent.futures would print for each one."""
    script = textwrap.dedent(
        f"""
        from fray.kit import remote
        remote.start_worker(remote.WorkerSetup({str(tmp_path / "gone.sock")!r}, b"k" * 32, "in_memory", frozenset()))
        print("still running")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


class _LoadsNowhere:
    """Pickles in the worker, cannot be unpickled by the driver (as a class only the worker can import)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_refuse_to_load, ())


def _refuse_to_load() -> None:
    raise ImportError("no module named 'only_in_the_worker'")


def test_a_request_the_driver_cannot_load_fails_that_request_naming_why(service: remote.RemoteService) -> None:
    worker = remote.worker_context(service.setup)
    with pytest.raises(SerializationError, match="a worker's request") as info:
        worker._put(_LoadsNowhere())
    assert "only_in_the_worker" in str(info.value)
    ref = worker._put([1, 2])  # the same connection is still served
    assert worker._get([ref], 10) == [[1, 2]]


@pytest.mark.parametrize("where", ["process_pool", "in_memory runtime_env"])
def test_a_task_whose_worker_crashed_is_rerun_up_to_max_retries(where: str, tmp_path: Path) -> None:
    """As Ray: a crashed worker's task is re-run up to max_retries, whatever retry_exceptions says."""
    sys.path.insert(0, str(REPO / "examples"))
    from process_pool_backend import ProcessPoolBackend

    from fray import RuntimeEnv, TaskOptions, register_backend
    from fray.errors import WorkerCrashedError
    from fray.registry import get_backend, job_context_from
    from fray.testing import workloads

    if where == "process_pool":
        register_backend("process_pool", ProcessPoolBackend, replace=True)
        ctx = job_context_from(get_backend("process_pool"), {"cpus": "2"})
        options = TaskOptions()
    else:
        ctx = InMemoryJobContext({"CPU": 2.0})
        options = TaskOptions(runtime_env=RuntimeEnv(env={"FRAY_TEST_CHILD": "1"}))
    try:
        again = TaskOptions(max_retries=1, runtime_env=options.runtime_env)
        ref = ctx.create_task(workloads.crash_first, args=(str(tmp_path / "again"),), options=again)
        assert ctx.get(ref, timeout=120) == "ok after 1 crash"
        once = TaskOptions(max_retries=0, runtime_env=options.runtime_env)
        with pytest.raises(WorkerCrashedError):
            ctx.get(ctx.create_task(workloads.crash_first, args=(str(tmp_path / "once"),), options=once), timeout=120)
    finally:
        ctx.shutdown()
