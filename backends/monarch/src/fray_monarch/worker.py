"""`python -m fray_monarch.worker --address tls://HOST:PORT`: start a Monarch host worker that a fray context can
attach to. The entry point users type; the worker itself is cluster/host_worker.py."""

from __future__ import annotations

import sys

from fray_monarch.cluster.host_worker import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
