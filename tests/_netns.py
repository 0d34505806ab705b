"""Several "hosts" on this one machine, each its own Linux network namespace, for multi-host tests.

A host has its own network stack (an `eth0` on a private /24, no route out), hostname, /etc/hosts naming every
host of its network, and /dev/shm. One long-lived holder process owns a host's mount and UTS namespaces; every
command for the host enters the holder's namespaces with nsenter, so all of a host's processes share what the holder
sees. Its /sys is a fresh sysfs of its network namespace (`ip netns exec` mounts it): /sys/class/net lists the
host's own links, and nothing is mounted under /sys/fs/cgroup. Needs root, iproute2 (`ip`), nsenter and unshare.

The hosts' veths meet on a bridge inside a namespace of its own (the "switch"), not in the machine's: where
br_netfilter is loaded (Docker loads it), bridged frames cross the iptables FORWARD chain of the bridge's namespace,
and Docker's DROP policy there would cut the hosts off from each other. A new namespace has no rules.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fray.host import procfs

RECORD_DIR = Path("/run/fray-test-netns")
RUN_NETNS = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
KILL_WAIT = 10.0
HOLDER_WAIT = 10.0

_HOLDER_SCRIPT = (
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname "$0" && echo READY '
    "&& exec sleep infinity </dev/null >/dev/null 2>&1"
)


@dataclass(frozen=True)
class Host:
    """One namespaced host. `index` is its position in the list `namespaced_hosts` yields."""

    index: int
    name: str
    address: str
    netns: str
    holder_pid: int

    def argv(self, cmd: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """`cmd` prefixed to run inside this host, starting in `cwd` (default: the caller's cwd)."""
        # Entering a mount namespace moves the cwd to its root; --wd restores Popen's meaning of cwd. nsenter
        # opens the directory before it enters, so a path is resolved as the caller sees it.
        wd = os.path.abspath(os.getcwd() if cwd is None else cwd)
        return [_tool("nsenter"), f"--target={self.holder_pid}", "--mount", "--uts", "--net", f"--wd={wd}", "--", *cmd]

    def popen(self, cmd: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen` of `cmd` inside this host; a new session unless told otherwise."""
        popen_kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.argv(cmd, popen_kwargs.pop("cwd", None)), **popen_kwargs)

    def run(self, cmd: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` of `cmd` inside this host (nsenter execs it: a timeout kills `cmd` itself)."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.run(self.argv(cmd, kwargs.pop("cwd", None)), timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        """Every live process in this host's network namespace but the holder."""
        ns = _netns_id(self.netns)
        return [] if ns is None else [p for p in _pids_in({ns}) if p != self.holder_pid]

    def kill_all(self) -> None:
        """SIGKILL every process in this host but the holder: the machine is lost, with all that ran there."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def shm_files(self) -> list[str]:
        """Names in this host's private /dev/shm, and in its per-user fray-<uid> directories (as dir/name: those
        directories are fray's lasting home there, like ~/.cache, and are not counted themselves)."""
        # /proc/PID/root is the holder's root as its own mount namespace sees it, tmpfs included.
        root = f"/proc/{self.holder_pid}/root/dev/shm"
        found = []
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if name.startswith("fray-") and name[5:].isdigit() and os.path.isdir(path):
                found += [f"{name}/{inner}" for inner in os.listdir(path)]
            else:
                found.append(name)
        return sorted(found)


@dataclass(frozen=True)
class _Names:
    """Every name a network of `count` hosts uses, all derived from its tag (so a record can be short)."""

    tag: str
    count: int

    @property
    def bridge(self) -> str:
        return f"fxb{self.tag}"

    @property
    def switch(self) -> str:
        return f"fray-{self.tag}-sw"

    def netns(self, i: int) -> str:
        return f"fray-{self.tag}-{i}"

    def veth(self, i: int) -> str:
        return f"fxv{self.tag}-{i}"  # at most 15 characters: "fxv" + 6 + "-" + up to 5 digits

    def hostname(self, i: int) -> str:
        return f"fh{i}-{self.tag}"


@functools.cache
def _tool(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") or name


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_tool("ip"), *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def start_time(pid: int) -> int | None:
    """The start time of process pid (clock ticks since boot), None if there is no such process."""
    found = procfs.stat(pid)
    return None if found is None else found.start


def _netns_id(netns: str) -> tuple[int, int] | None:
    """(device, inode) of a named network namespace: /run/netns/NAME pins it, so it is ours while it exists."""
    try:
        st = os.stat(RUN_NETNS / netns)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pids_in(namespaces: set[tuple[int, int]]) -> list[int]:
    found = []
    for pid in procfs.pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:  # gone, or a zombie (it has no namespaces left)
            continue
        if (st.st_dev, st.st_ino) in namespaces:
            found.append(pid)
    return found


def _kill_namespaces(netns_names: Sequence[str]) -> list[int]:
    """SIGKILL every process in these network namespaces until none is left (bounded); the survivors."""
    namespaces = {ns for ns in map(_netns_id, netns_names) if ns is not None}
    deadline = time.monotonic() + KILL_WAIT
    while (pids := _pids_in(namespaces)) and time.monotonic() < deadline:
        for pid in pids:
            # A pidfd names the process, not its number: a pid reused after our scan is not signalled.
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)
                try:
                    st = os.stat(f"/proc/{pid}/ns/net")
                    if (st.st_dev, st.st_ino) in namespaces:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    os.close(fd)
        time.sleep(0.05)
    return _pids_in(namespaces)


def _remove(names: _Names) -> list[int]:
    """Every trace of a network: its processes, namespaces, /etc/netns dirs; the processes that survived."""
    netns = [*(names.netns(i) for i in range(names.count)), names.switch]
    survivors = _kill_namespaces(netns)
    for ns in netns:
        # Its links (eth0, the veths, the bridge) go with the last namespace that holds them.
        if (RUN_NETNS / ns).exists():
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    return survivors


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    RECORD_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(RECORD_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _records() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(RECORD_DIR.glob("*.json")):
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):
            continue


def _pid_namespace() -> int:
    """The inode of this process's PID namespace: a pid names a process only there."""
    return os.stat("/proc/self/ns/pid").st_ino


def stale_cleanup() -> None:
    """Remove the networks whose owner (pid and start time) is gone: what a SIGKILLed pytest left behind. Only
    the owners of this PID namespace are judged: another's pid means nothing here (make test runs its parts in
    namespaces of their own; a part's networks go with its mount namespace when it ends)."""
    here = _pid_namespace()
    with _locked():
        for path, rec in _records():
            if rec.get("owner_pid_namespace", here) != here:
                continue
            if start_time(rec["owner_pid"]) != rec["owner_start"]:
                _remove(_Names(rec["tag"], rec["count"]))
                path.unlink(missing_ok=True)


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 in 10.200-250.x.0 that no address or route here overlaps, nor another live network of ours."""
    taken = [ipaddress.ip_network(r["subnet"]) for _, r in _records()]
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        if route.get("dst", "default") != "default":
            taken.append(ipaddress.ip_network(route["dst"], strict=False))
    for link in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for a in link.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for _ in range(1000):
        net = ipaddress.IPv4Network(f"10.{rng.randint(200, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free /24 in 10.200.0.0-10.250.255.0")


def _start_holder(netns: str, hostname: str) -> subprocess.Popen[bytes]:
    # ip netns exec, unshare and sh all exec: the Popen's pid ends up as the holder's `sleep`.
    cmd = [_tool("ip"), "netns", "exec", netns, _tool("unshare"), "--mount", "--uts", "--propagation", "private"]
    proc = subprocess.Popen(
        [*cmd, "sh", "-c", _HOLDER_SCRIPT, hostname],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], HOLDER_WAIT)
    line = proc.stdout.readline() if ready else b""
    if line.strip() != b"READY":
        proc.kill()
        rest = proc.communicate(timeout=10)[0]
        raise RuntimeError(f"host {hostname}'s holder did not start: {(line + rest).decode(errors='replace')}")
    proc.stdout.close()
    return proc


@contextlib.contextmanager
def namespaced_hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts on one private /24, each resolving every other by name; all removed on exit."""
    if not 1 <= count <= 250:
        raise ValueError(f"count must be 1-250, not {count}")
    stale_cleanup()
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(8), "little"))
    with _locked():
        while True:
            names = _Names(f"{rng.getrandbits(24):06x}", count)
            record = RECORD_DIR / f"{names.tag}.json"
            if not record.exists() and not (RUN_NETNS / names.netns(0)).exists():
                break
        subnet = _pick_subnet(rng)
        owner = {
            "owner_pid": os.getpid(),
            "owner_start": start_time(os.getpid()),
            "owner_pid_namespace": _pid_namespace(),
        }
        # Recorded before anything is made, so a kill at any later point leaves something stale_cleanup finds.
        partial = record.with_suffix(".partial")  # renamed into place: a record is never seen half-written
        partial.write_text(json.dumps({"tag": names.tag, "count": count, "subnet": str(subnet), **owner}))
        partial.replace(record)
    holders: list[subprocess.Popen[bytes]] = []
    try:
        hosts = _make(names, subnet, holders)
        yield hosts
    finally:
        survivors = _remove(names)
        for holder in holders:
            with contextlib.suppress(subprocess.TimeoutExpired):
                holder.wait(KILL_WAIT)
        record.unlink(missing_ok=True)
        if survivors:
            raise RuntimeError(f"processes of hosts {names.tag} survived SIGKILL: {survivors}")


def _make(names: _Names, subnet: ipaddress.IPv4Network, holders: list[subprocess.Popen[bytes]]) -> list[Host]:
    addresses = [str(subnet.network_address + i + 1) for i in range(names.count)]
    hostnames = [names.hostname(i) for i in range(names.count)]
    etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(addresses, hostnames, strict=True))
    sw = names.switch
    _ip("netns", "add", sw)
    _ip("-n", sw, "link", "add", "name", names.bridge, "type", "bridge")
    _ip("-n", sw, "link", "set", names.bridge, "up")
    hosts = []
    for i in range(names.count):
        ns = names.netns(i)
        _ip("netns", "add", ns)
        _ip("-n", sw, "link", "add", "name", names.veth(i), "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", names.veth(i), "master", names.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{addresses[i]}/{subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # `ip netns exec` bind-mounts each file of /etc/netns/NS over its /etc namesake for the holder.
        (ETC_NETNS / ns).mkdir(parents=True, exist_ok=True)
        (ETC_NETNS / ns / "hosts").write_text(etc_hosts)
        holders.append(_start_holder(ns, hostnames[i]))
        hosts.append(Host(i, hostnames[i], addresses[i], ns, holders[-1].pid))
    return hosts


@functools.cache
def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (ip netns, mount)"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            return f"namespaced hosts need `{tool}`, not found"
    probe = f"fray-probe-{os.getpid()}-{random.getrandbits(24):06x}"
    steps = [("netns", "add", probe), ("-n", probe, "link", "add", "name", "fxb", "type", "bridge")]
    steps.append(("-n", probe, "link", "add", "name", "fxv", "type", "veth", "peer", "name", "fxp"))
    try:
        for step in steps:
            if (done := _ip(*step, check=False)).returncode != 0:
                return f"`ip {' '.join(step)}` fails here: {done.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def require_namespaced_hosts() -> None:
    """Skip the calling test, naming why, where namespaced hosts cannot be made."""
    import pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


_RECEIVER = """
import json, socket, sys, time
n, repeats = int(sys.argv[1]), int(sys.argv[2])
srv = socket.create_server((sys.argv[3], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
view = memoryview(bytearray(n))
times = []
for i in range(repeats + 1):
    t0 = time.perf_counter()
    conn.sendall(b"g")
    got = 0
    while got < n:
        k = conn.recv_into(view[got:])
        if k == 0:
            raise SystemExit("sender closed early")
        got += k
    if i:
        times.append(time.perf_counter() - t0)
print(json.dumps(times), flush=True)
"""

_SENDER = """
import socket, sys
n, repeats = int(sys.argv[1]), int(sys.argv[2])
conn = socket.create_connection((sys.argv[3], int(sys.argv[4])))
payload = memoryview(bytearray(n))
for _ in range(repeats + 1):
    if conn.recv(1) != b"g":
        raise SystemExit("receiver closed early")
    conn.sendall(payload)
conn.close()
"""


def plain_socket_rate(src: Host, dst: Host, nbytes: int, repeats: int, timeout: float = 120.0) -> list[float]:
    """Seconds per transfer of `nbytes` over one plain TCP connection from a sender in `src` to a receiver in `dst`.

    The receiver times each transfer from its 1-byte request to the last byte, so a time includes one round trip;
    the connection is warmed by one untimed transfer first. A baseline for cross-host data-plane benchmarks.
    """
    args = [str(nbytes), str(repeats)]
    receiver = dst.popen([sys.executable, "-c", _RECEIVER, *args, dst.address], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()
        if not port:
            raise RuntimeError("plain_socket_rate: the receiver did not start")
        sender = src.popen([sys.executable, "-c", _SENDER, *args, dst.name, port])
        try:
            # The sender first: if it cannot connect, the receiver would wait in accept() for the whole timeout.
            sender.wait(timeout)
            out, _ = receiver.communicate(timeout=timeout)
            if sender.returncode != 0 or receiver.returncode != 0:
                raise RuntimeError(
                    f"plain_socket_rate failed: sender {sender.returncode}, receiver {receiver.returncode}"
                )
        finally:
            sender.kill()
            sender.wait()
        times: list[float] = json.loads(out)
        return times
    finally:
        receiver.kill()
        receiver.wait()
