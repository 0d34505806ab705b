"""The device-share protocol (fray.runtime.device_shares) on its CPU stand-in (memfd segments), with real processes:
one share per reader, leases released by readers and by their death, a dropped value freed when its last lease
goes, a gone producer or a freed value read as ObjectLostError, staging where a reader cannot open a share, and
only this user's processes served."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _sockets import unguarded_env

from fray.errors import FrayError, ObjectLostError
from fray.runtime.borrowing import borrowing, not_borrowing
from fray.runtime.device_shares import (
    SHARED,
    MemfdBuffer,
    ShareRef,
    host_key,
    memfd_memory,
    publish,
    rebuild_shared,
    share_server,
)
from fray.runtime.device_shares.wire import Granted, OpenShare, read_message, send_message
from fray.runtime.receive import receive, receive_into
from fray.runtime.serialization import dumps, loads
from fray.telemetry.transfers import device_stats, since

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root (setpriv)")

# A reader in another process: reads a pickled ShareRef (or a serialized value's bytes) on stdin, rebuilds it,
# prints what it got and the transfer paths it took.
READER = r"""
import os, pickle, sys
from fray.runtime.device_shares import memfd_memory, rebuild_shared
from fray.runtime.serialization import loads_data
from fray.telemetry.transfers import device_stats
kind, payload, refuse = pickle.loads(sys.stdin.buffer.read())
memfd_memory.refuse_open = bool(refuse)
if refuse == "after-grant":  # (a share this process finds it cannot open only once it has it)
    memfd_memory.unopenable = lambda device, where: None
try:
    value = rebuild_shared(payload) if kind == "ref" else loads_data(payload, [], "a value")["weights"]
    print(pickle.dumps((True, value.tobytes(), sorted(device_stats.snapshot()))).hex())
except Exception as exc:
    print(pickle.dumps((False, f"{type(exc).__name__}: {exc}", [])).hex())
"""

# A reader that takes a share and dies holding its lease.
DIES_HOLDING = r"""
import os, pickle, socket, sys
from fray.runtime.device_shares.wire import Granted, OpenShare, read_message, send_message
ref = pickle.loads(sys.stdin.buffer.read())
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(ref.address)
send_message(sock, OpenShare(ref.snapshot))
reply, fds = read_message(sock)
assert isinstance(reply, Granted), reply
print("granted", flush=True)
os.kill(os.getpid(), 9)
"""

# A producer that publishes a value, hands its ref out, and ends.
PRODUCER_ENDS = r"""
import pickle, sys
from fray.runtime.device_shares import MemfdBuffer, memfd_memory, publish
ref, token = publish(memfd_memory, MemfdBuffer(b"gone" * 1000), None)
sys.stdout.write(pickle.dumps(ref).hex())
"""


def _run(code: str, payload: object, timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(payload), capture_output=True, timeout=timeout, check=False
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stderr.decode()
    return done.stdout.decode().strip()


def _read_elsewhere(kind: str, payload: object, refuse: bool | str = False) -> tuple[bool, object, list[str]]:
    ok, got, paths = pickle.loads(bytes.fromhex(_run(READER, (kind, payload, refuse))))
    return ok, got, paths


def _eventually(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.01)


@pytest.fixture
def value() -> Iterator[MemfdBuffer]:
    yield MemfdBuffer(os.urandom(256 * 1024))


def test_a_reader_in_another_process_gets_a_copy_of_its_own_through_a_share(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    ok, got, paths = _read_elsewhere("ref", ref)
    assert ok, got
    assert got == value.tobytes()
    assert paths == ["memfd-ipc"]
    server = share_server()
    _eventually(lambda: server.leases() == 0, "the reader's lease released")
    del token
    _eventually(lambda: server.held() == 0, "the dropped value's snapshot freed")


def test_each_reader_has_a_share_of_its_own_and_two_readers_at_once_both_read(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    readers = [
        subprocess.Popen([sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [r.communicate(pickle.dumps(("ref", ref, False)), timeout=60)[0] for r in readers]
    for out in outs:
        ok, got, _ = pickle.loads(bytes.fromhex(out.decode().strip()))
        assert ok and got == value.tobytes()
    _eventually(lambda: share_server().leases() == 0, "both readers' leases released")
    del token


def test_a_value_freed_while_a_reader_holds_a_share_lives_until_the_share_is_released(value: MemfdBuffer) -> None:
    server = share_server()
    before = server.held()
    ref, token = publish(memfd_memory, value, None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(ref.address)
    send_message(sock, OpenShare(ref.snapshot))
    reply, fds = read_message(sock)
    assert isinstance(reply, Granted)
    del token  # the value is freed while this reader still holds its share
    assert server.held() == before + 1, "a leased snapshot was freed under its reader"
    for fd in fds:
        os.close(fd)
    sock.close()  # the reader goes: its lease with it
    _eventually(lambda: server.held() == before, "the snapshot freed with its last lease")


def test_a_reader_that_dies_holding_a_share_has_its_lease_released(value: MemfdBuffer) -> None:
    server = share_server()
    ref, token = publish(memfd_memory, value, None)
    assert _run(DIES_HOLDING, ref) == "granted"
    _eventually(lambda: server.leases() == 0, "the dead reader's lease released")
    before = server.held()
    del token
    assert server.held() == before - 1


def test_a_value_whose_producer_ended_is_object_lost() -> None:
    ref = pickle.loads(bytes.fromhex(_run(PRODUCER_ENDS, None)))
    with pytest.raises(ObjectLostError, match="the process that made it is gone"):
        rebuild_shared(ref)
    ok, got, _ = _read_elsewhere("ref", ref)
    assert not ok and str(got).startswith("ObjectLostError")


def test_a_freed_value_is_object_lost(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    del token
    ok, got, _ = _read_elsewhere("ref", ref)
    assert not ok and "ObjectLostError" in str(got) and "freed" in str(got)


def test_a_reader_that_cannot_open_a_share_gets_the_value_staged_without_asking_for_one(value: MemfdBuffer) -> None:
    # A share asked for and never opened would be device memory its producer may not get back (torch counts
    # each CUDA share until a reader opens and drops it): a reader that knows it cannot open one asks for none.
    server = share_server()
    ref, token = publish(memfd_memory, value, None)
    granted = server.granted()
    ok, got, paths = _read_elsewhere("ref", ref, refuse=True)
    assert ok, got
    assert got == value.tobytes()
    assert paths == ["memfd-ipc-staged"]
    assert server.granted() == granted, "the reader asked for a share it could not open"
    _eventually(lambda: server.leases() == 0, "the staging lease released")
    del token


def test_a_reader_that_cannot_open_the_share_it_was_given_gives_it_back_and_gets_the_value_staged(
    value: MemfdBuffer,
) -> None:
    server = share_server()
    ref, token = publish(memfd_memory, value, None)
    granted = server.granted()
    ok, got, paths = _read_elsewhere("ref", ref, refuse="after-grant")
    assert ok, got
    assert got == value.tobytes()
    assert paths == ["memfd-ipc-staged"]
    assert server.granted() == granted + 1
    _eventually(lambda: server.leases() == 0, "the unopened share's lease released")
    del token
    _eventually(lambda: server.held() == 0, "the dropped value's snapshot freed")


def test_a_serialized_value_in_shared_mode_carries_a_share_and_keeps_its_snapshot(value: MemfdBuffer) -> None:
    server = share_server()
    before = server.held()
    blob = dumps({"weights": value}, device_mode=SHARED)
    assert not blob.buffers, "a shared value's bytes travelled with it"
    assert server.held() == before + 1
    ok, got, paths = _read_elsewhere("data", blob.data)
    assert ok and got == value.tobytes() and paths == ["memfd-ipc"]
    assert loads(blob)["weights"] == value  # (a reader in the producer's own process reads it the same way)
    del blob
    _eventually(lambda: server.held() == before, "the snapshot freed with its serialized value")


def test_staged_and_kept_modes_carry_the_bytes(value: MemfdBuffer) -> None:
    for mode in ("staged", "kept"):
        blob = dumps(value, device_mode=mode)
        assert sum(memoryview(b).nbytes for b in blob.buffers) == value.nbytes
        assert loads(blob) == value


def test_a_share_from_another_host_is_refused_with_a_clear_error(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    elsewhere = ShareRef(ref.address, "another-boot/another-host", ref.snapshot, ref.nbytes, ref.memory, None)
    with pytest.raises(FrayError, match="one host only"):
        rebuild_shared(elsewhere)
    assert host_key() == ref.host
    del token


def test_the_share_socket_is_in_a_directory_only_this_user_can_enter(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    directory = os.lstat(os.path.dirname(ref.address))
    assert stat.S_ISDIR(directory.st_mode) and directory.st_uid == os.getuid()
    assert stat.S_IMODE(directory.st_mode) == 0o700
    del token


# A listener (in a process of its own, without the socket guard that the test process may run under: the guard
# would drop the connection before fray's own check sees it) that reports what fray's peer check says.
CHECKS_PEER = r"""
import socket, sys
from fray.runtime.device_shares.wire import check_peer_is_this_user
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
import os; os.chmod(sys.argv[1], 0o777)
listener.listen(1)
print("listening", flush=True)
listener.settimeout(30)
sock, _ = listener.accept()
try:
    check_peer_is_this_user(sock)
    print("accepted", flush=True)
except Exception as exc:
    print(f"refused: {exc}", flush=True)
"""


@as_root
def test_a_connection_from_another_user_is_refused() -> None:
    base = Path(tempfile.mkdtemp(prefix="fray-test-shares-", dir="/tmp"))
    try:
        base.chmod(0o777)
        path = str(base / "s")
        server = subprocess.Popen(
            [sys.executable, "-c", CHECKS_PEER, path], stdout=subprocess.PIPE, text=True, env=unguarded_env()
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        connect = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.recv(1)"
        subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", connect],
            timeout=60,
            check=True,
        )
        said = server.stdout.readline().strip()
        server.wait(timeout=30)
        assert said.startswith("refused:") and f"uid {NOBODY}, not this user's" in said, said
    finally:
        for entry in base.iterdir():
            entry.unlink()
        base.rmdir()


def test_a_forked_child_serves_its_own_values(value: MemfdBuffer) -> None:
    parent_address = share_server().address
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: report its server's address and whether it serves a value of its own)
        try:
            ref, _token = publish(memfd_memory, MemfdBuffer(b"child"), None)
            ok = rebuild_shared(ref).tobytes() == b"child"
            os.write(write, pickle.dumps((ref.address, ok)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        address, ok = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert ok and address != parent_address


def test_a_context_counts_the_device_loads_of_its_own_time_only(value: MemfdBuffer) -> None:
    import fray
    from fray.telemetry.transfers import device_stats

    device_stats.record("memfd-ipc", 123, 0.001)  # a load before the context began
    ctx = fray.init("in_memory")
    try:
        assert "memfd-ipc" not in ctx.transfer_stats()
        ref, token = publish(memfd_memory, value, None)
        rebuild_shared(ref)
        stats = ctx.transfer_stats()
        assert stats["memfd-ipc"].count == 1 and stats["memfd-ipc"].bytes == value.nbytes
        del token
    finally:
        ctx.shutdown()


def test_a_get_into_the_callers_memory_borrows_the_snapshot_and_gives_its_lease_back_after(value: MemfdBuffer) -> None:
    """In a borrowing scope (a get into `out`), the reader opens the share and reads the producer's snapshot itself
    (`memfd-ipc-out`), holding its lease until the scope ends; outside one, or in a not_borrowing scope inside it,
    it copies as ever (`memfd-ipc`)."""
    ref, token = publish(memfd_memory, value, None)
    server = share_server()
    out = {"w": MemfdBuffer(bytes(value.nbytes))}
    before = device_stats.snapshot()
    with borrowing():
        lent = rebuild_shared(ref)
        assert server.leases() == 1, "the borrowed snapshot's lease is held while it is read"
        with not_borrowing():
            own = rebuild_shared(ref)
        assert receive_into(out, {"w": lent}) is out
    assert out["w"].tobytes() == own.tobytes() == value.tobytes()
    assert sorted(since(device_stats.snapshot(), before)) == ["memfd-ipc", "memfd-ipc-out"]
    _eventually(lambda: server.leases() == 0, "the borrowed snapshot's lease given back")
    del token


def test_a_get_into_memory_that_does_not_fit_the_value_gives_its_borrows_back(value: MemfdBuffer) -> None:
    ref, token = publish(memfd_memory, value, None)
    with pytest.raises(ValueError, match=r"out\['w'\] is a MemfdBuffer of 3 bytes, but the value there is"):
        receive({"w": MemfdBuffer(b"abc")}, lambda: {"w": rebuild_shared(ref)})
    _eventually(lambda: share_server().leases() == 0, "the lease of a get that failed given back")
    del token
