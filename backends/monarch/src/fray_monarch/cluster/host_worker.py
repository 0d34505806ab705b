"""Start a Monarch host worker that a fray context can attach to (`monarch?hosts=tls://HOST:PORT,...`).

    python -m fray_monarch.worker --address tls://10.0.0.2:29500

Over TLS (the default) the worker and every driver present certificates from the user's own authority (net/tls.py:
~/.fray/tls or FRAY_TLS_DIR, made on first use; every host needs the same one), and nothing without one can
attach. `--address tcp://HOST:PORT --insecure` serves plain TCP instead (on loopback too: every local user
reaches it): anyone who can connect to the address can then run arbitrary code as this user. The worker binds only
to the address given, never to every interface unless told so, and restarts itself under fray's socket guard
(socket_guard.py), which keeps other local users out of Monarch's Unix sockets.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

from fray.backend import children_of
from fray.errors import FrayError
from fray_monarch import socket_guard
from fray_monarch.core import runtime  # noqa: F401 - environment and fault hook before Monarch starts
from fray_monarch.net import tls
from fray_monarch.net.network import host_of, is_loopback, scheme_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fray_monarch.worker", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="tls://HOST:PORT to listen on (or tcp://HOST:PORT with --insecure)")
    where.add_argument("--slurm", metavar="SCHEME:PORT", help=argparse.SUPPRESS)  # job_launch.FraySlurmJob's srun
    parser.add_argument("--insecure", action="store_true", help="allow plain TCP on an address other machines reach")
    parser.add_argument(
        "--unguarded-sockets",
        action="store_true",
        help="run without fray's socket guard (other local users can then reach Monarch's sockets here)",
    )
    parser.add_argument("--identity-from-stdin", action="store_true", help=argparse.SUPPRESS)  # FraySSHJob sends it
    parser.add_argument(
        "--end-with-stdin",
        action="store_true",
        help="exit when standard input ends (how a host launched over ssh ends with the driver that launched it)",
    )
    args = parser.parse_args(argv)
    address: str = args.address or _slurm_address(args.slurm)
    try:
        host = host_of(address)[0]
    except ValueError as exc:
        parser.error(str(exc))
    scheme = scheme_of(address)
    if scheme == "ipc":
        parser.error("--address takes tls://HOST:PORT or tcp://HOST:PORT")
    if scheme == "tcp" and not args.insecure:
        reach = "every user of this machine" if is_loopback(host) else "other machines"
        parser.error(
            f"{address} is plain TCP on an address {reach} can reach: anyone who can connect could run code as "
            "this user. Use tls://, or add --insecure on a network and machine you trust"
        )
    if not args.unguarded_sockets:
        try:  # Monarch's abstract Unix sockets here: only this user's processes may connect (socket_guard.py)
            socket_guard.restart_guarded("fray_monarch.worker", list(sys.argv[1:] if argv is None else argv))
        except FrayError as exc:
            parser.error(f"{exc} (for this worker: --unguarded-sockets)")
    try:
        if scheme == "tls":
            tls.install(_identity(host, args.identity_from_stdin))
    except FrayError as exc:
        parser.error(str(exc))
    if host in ("*", "0.0.0.0", "[::]", "::") and scheme == "tcp":
        print(
            f"fray_monarch.worker: WARNING: {address} accepts unauthenticated connections that run code on "
            "every interface",
            file=sys.stderr,
        )
    from monarch.actor import run_worker_loop_forever

    _end_on_sigterm()
    if args.end_with_stdin:
        threading.Thread(target=_end_with_stdin, name="fray-worker-stdin", daemon=True).start()

    print(f"fray_monarch.worker: serving on {address}", flush=True)
    run_worker_loop_forever(address=address, ca="trust_all_connections")  # the only value Monarch 0.7 takes
    return 0


def _slurm_address(spec: str) -> str:
    """`SCHEME://<this node's name>:PORT`, behind the service identity of this node's rank (SLURM_NODEID), both of
    this run of the allocation (SLURM_RESTART_COUNT: one more each time Slurm requeued it; slurm_alloc.run_port)."""
    from monarch._src.job.service_identity import ranked_service_proc_id_from_env, service_proc_addr

    from fray_monarch.cluster.slurm_alloc import run_identity, run_port

    scheme, _, port = spec.partition(":")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    identity = ranked_service_proc_id_from_env(rank_env="SLURM_NODEID")
    if identity is not None:
        identity = run_identity(identity, restarts)
    return str(service_proc_addr(f"{scheme}://{socket.gethostname()}:{run_port(int(port), restarts)}", identity))


def _identity(host: str, from_stdin: bool) -> tls.Identity:
    """This worker's TLS identity: the line its launcher sent first on stdin, or issued here by the user's
    authority (made if this machine has none: then the drivers and other hosts need a copy of it)."""
    if from_stdin:
        line = bytearray()
        while not line.endswith(b"\n"):  # byte by byte: what follows on stdin is _end_with_stdin's
            chunk = os.read(0, 1)
            if not chunk:
                raise FrayError("standard input ended before the TLS identity the launcher sends")
            line += chunk
        return tls.Identity.from_json(line.decode())
    made = not (tls.tls_dir() / tls.CA_CERT).exists()
    identity = tls.issue(tls.own_names(host))
    if made:
        print(
            f"fray_monarch.worker: made a new TLS authority in {tls.tls_dir()}: drivers and other hosts need the "
            "same one (copy that directory, 0700, to them)",
            file=sys.stderr,
        )
    return identity


def _end_with_stdin() -> None:
    """Exit once stdin ends (see _finish)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    _finish()


def _end_on_sigterm() -> None:
    """SIGTERM (scancel, `fray cluster stop`, a service manager) ends this worker the way the end of its stdin
    does. Python runs a signal handler only in the main thread, which stays inside Monarch's loop; CPython's own
    C handler also writes the signal's number to the wakeup fd, from whichever thread took it, and a thread of
    ours reads it there."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd)
    # A Python handler, so CPython's C handler is installed; should the main thread run it (or another handler
    # take the wakeup fd over), it ends the worker too.
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: threading.Thread(target=_finish, name="fray-worker-finish", daemon=True).start(),
    )

    def wait() -> None:
        while True:
            got = os.read(read_fd, 64)
            if not got or signal.SIGTERM in got:
                _finish()

    threading.Thread(target=wait, name="fray-worker-sigterm", daemon=True).start()


_finishing = threading.Lock()


def _finish() -> None:
    """Exit after the processes this worker started (Monarch's procs, its children, fray's watchdog among them):
    they are killed and waited for, then the shared-memory files of dead fray processes on this host are
    removed. This worker's TLS files go first: the watchdog that would remove them is one of those children."""
    _finishing.acquire()  # once, whichever comes first; the other caller waits here until the process is gone
    try:  # whatever fails here, the process ends (its stderr may be the ssh connection that just closed)
        tls.remove()  # first: a scheduler's SIGKILL may follow its SIGTERM within seconds (Slurm's KillWait)
        for pid in children_of(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)  # our own children (their parent pid is ours): no one else's
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while children_of(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        from fray_monarch.data.arena import reclaim_dead_segments

        reclaim_dead_segments()
    finally:
        os._exit(0)
