"""Start a Monarch host worker that a fray context can attach to (`monarch?hosts=tcp://HOST:PORT,...`).

    python -m fray_monarch.worker --address tcp://127.0.0.1:29500

SECURITY: Monarch 0.7 has no TLS for this path (`ca="trust_all_connections"`): anyone who can connect to the
address can run arbitrary code as this user. The worker binds only to the address given; use loopback or a
trusted private network, never a public interface.
"""

from __future__ import annotations

import argparse
import sys

from fray_monarch import _runtime  # noqa: F401 - environment and fault hook before Monarch starts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fray_monarch.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="tcp://HOST:PORT to listen on (e.g. tcp://127.0.0.1:29500)")
    args = parser.parse_args(argv)
    address: str = args.address
    if not address.startswith("tcp://"):
        parser.error("--address must look like tcp://HOST:PORT")
    host = address[len("tcp://") :].rsplit(":", 1)[0]
    if host in ("*", "0.0.0.0", "[::]", "::"):
        print(
            f"fray_monarch.worker: WARNING: {address} accepts unauthenticated connections that run code on "
            "every interface",
            file=sys.stderr,
        )
    from monarch.actor import run_worker_loop_forever

    print(f"fray_monarch.worker: serving on {address}", flush=True)
    run_worker_loop_forever(address=address, ca="trust_all_connections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
