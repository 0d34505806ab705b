"""Start a Monarch host worker that a fray context can attach to (`monarch?hosts=tcp://HOST:PORT,...`).

    python -m fray_monarch.worker --address tcp://127.0.0.1:29500

SECURITY: Monarch 0.7 has no TLS for this path (`ca="trust_all_connections"`): anyone who can connect to the
address can run arbitrary code as this user. The worker binds only to the address given; use loopback or a
trusted private network, never a public interface.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from fray.procfs import children_of
from fray_monarch import _runtime  # noqa: F401 - environment and fault hook before Monarch starts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fray_monarch.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="tcp://HOST:PORT to listen on (e.g. tcp://127.0.0.1:29500)")
    parser.add_argument(
        "--end-with-stdin",
        action="store_true",
        help="exit when standard input ends (how a host launched over ssh ends with the driver that launched it)",
    )
    args = parser.parse_args(argv)
    address: str = args.address
    channel = address.rsplit("@", 1)[-1]  # Monarch's launchers prefix the host's service identity: ID@tcp://...
    if not channel.startswith("tcp://"):
        parser.error("--address must look like tcp://HOST:PORT")
    host = channel[len("tcp://") :].rsplit(":", 1)[0]
    if host in ("*", "0.0.0.0", "[::]", "::"):
        print(
            f"fray_monarch.worker: WARNING: {address} accepts unauthenticated connections that run code on "
            "every interface",
            file=sys.stderr,
        )
    from monarch.actor import run_worker_loop_forever

    if args.end_with_stdin:
        threading.Thread(target=_end_with_stdin, name="fray-worker-stdin", daemon=True).start()

    print(f"fray_monarch.worker: serving on {address}", flush=True)
    run_worker_loop_forever(address=address, ca="trust_all_connections")
    return 0


def _end_with_stdin() -> None:
    """Exit once stdin ends, after the processes this worker started (Monarch's procs, its children): they are
    killed and waited for, then the shared-memory files of dead fray processes on this host are removed."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    try:  # whatever fails here, the process ends (its stderr may be the ssh connection that just closed)
        for pid in children_of(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)  # our own children (their parent pid is ours): no one else's
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while children_of(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        from fray_monarch.arena import reclaim_dead_segments

        reclaim_dead_segments()
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
