"""The live pages: a job's (`ctx.dashboard()`: progress per function, a task stream, actors, transfers, errors)
and a cluster's (`cluster.dashboard()`, `fray dashboard`: its jobs, their states and attempts, its nodes).

One stdlib HTTP server on loopback (fray.dashboard.server) with its protections serves either page's source: a
job's (fray.dashboard.job_page) reads the job's events (`ctx.events()`) only while a page polls it, and keeps its
aggregates up to date from a cursor (fray.dashboard.model); a cluster's (fray.dashboard.cluster) reads the
cluster's jobs only while a page polls it. See docs/dashboard.md.

`FRAY_DASHBOARD=1` (or a port number) in a driver's environment starts the page at `fray.init()` and prints its
address on stderr, as Jupyter prints its own: `fray dashboard JOB` finds that line in a job's log.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import Protocol

from fray.dashboard.server import Dashboard
from fray.host import settings

__all__ = ["ANNOUNCED", "Dashboard", "announce_from_env"]

ENV = settings.DASHBOARD.name
# the line a driver prints; `fray dashboard JOB` takes the last one in the job's log
ANNOUNCED = re.compile(r"^fray: the live page of this job \(host (?P<host>\S+), pid \d+\): (?P<url>http://\S+)$", re.M)


class _Serves(Protocol):
    def dashboard(self, host: str = ..., port: int = ...) -> str: ...


def announce_from_env(ctx: _Serves) -> str | None:
    """Start ctx's live page if FRAY_DASHBOARD asks for it (1, or the port to serve on), and print its address
    (with its token: the line goes where the driver's stderr goes, a job's private log for a job)."""
    port = settings.DASHBOARD.read()
    if port is None:
        return None
    url = ctx.dashboard(port=port)
    print(f"fray: the live page of this job (host {socket.gethostname()}, pid {os.getpid()}): {url}", file=sys.stderr)
    return url
