"""A monarch cluster that outlives the command that started it: `fray cluster start --backend monarch`.

    python -m fray_monarch.cluster.head DIR   (started by MonarchBackend.start_cluster; DIR holds spec.json, the
                                                spec options as fray-core converted them)

The head is one process, in a session of its own, that launches the hosts the spec asks for (job=ssh|slurm|
process, or attaches to hosts= workers), runs a job runner on each, and records itself in the state directory
(`clusters/monarch.json`: its process identity, the hosts' addresses, who holds them, its socket). Later
commands reach it through that Unix socket (a directory of its own, mode 0700): `fray job ...` and `fray status`
ask it, one JSON request per connection, JSON answers (nothing is unpickled); `fray.init("monarch")` attaches to
the recorded hosts itself. SIGTERM (`fray cluster stop`) stops its jobs, ends the hosts it launched and removes
the record. Killed outright, its watchdog and the hosts' lifelines end what it launched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socketserver
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fray.backend import Identity, Resource, RuntimeEnv, state_dir
from fray_monarch.cluster.head_record import NAME, encode_info

__all__ = ["Head", "main"]


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        try:
            message = json.loads(self.rfile.readline())
            reply: dict[str, Any] = {"value": self.server.head.answer(message)}
        except Exception as exc:
            reply = {"error": type(exc).__name__, "message": str(exc)}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, head: Head) -> None:
        self.head = head
        super().__init__(path, _Handler)


class Head:
    """What the head process serves: the jobs of its cluster context, and its hosts."""

    def __init__(self, options: dict[str, Any]) -> None:
        from fray_monarch.cluster.context import MonarchClusterContext, job_spec
        from fray_monarch.cluster.topology import topology

        self.top = topology(options)
        remote = self.top.host_mesh is not None
        self.hostset = self.top.hostset
        jobs_reach = job_spec(options, self.hostset)
        self.cluster = MonarchClusterContext(
            self.top.hosts, self.top.stores.driver_bind, self.top.release, remote, self.hostset, jobs_reach
        )

    def answer(self, message: dict[str, Any]) -> Any:
        op = message.get("op")
        job = str(message.get("id", ""))
        if op == "submit":
            env = RuntimeEnv(
                env=message.get("env", {}),
                package_requirements=message.get("packages", []),
                minimum_resources=[Resource(k, v) for k, v in (message.get("resources") or {}).items()],
            )
            made = self.cluster.create_job(
                message["entrypoint"], env=env, working_dir=message.get("working_dir"), job_id=message.get("id")
            )
            return str(made)
        if op == "list":
            return [encode_info(info) for info in self.cluster.list_jobs()]
        if op == "info":
            return encode_info(self.cluster.get_job(job))
        if op == "logs":
            return self.cluster.get_job_logs(job)
        if op == "log_end":
            return self.cluster.raw_log_end(job, int(message["lines"]))
        if op == "stop":
            return self.cluster.stop_job(job)
        if op == "delete":
            return self.cluster.delete_job(job)
        if op == "wait":
            return encode_info(self.cluster.wait_job(job, message.get("timeout")))
        if op == "status":
            return self.cluster.node_status()
        raise ValueError(f"unknown request {op!r}")

    def close(self) -> None:
        self.cluster.shutdown()  # its jobs end, and the hosts it launched


def main(argv: list[str]) -> int:
    record_dir = Path(argv[0])
    options = json.loads((record_dir / "spec.json").read_text())  # converted already (persistent.start)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        head = Head(options)
    except Exception as exc:  # told to the starter, which prints it
        print("error " + json.dumps(f"{type(exc).__name__}: {exc}"), flush=True)
        return 1
    socket_dir = tempfile.mkdtemp(prefix="fray-head-", dir="/tmp")  # short: a Unix socket path has 107 bytes
    path = os.path.join(socket_dir, "sock")
    server = _Server(path, head)
    try:
        record = {
            "backend": NAME,
            "pid": os.getpid(),
            "leader": me.record() if (me := Identity.of(os.getpid())) else None,
            "socket": path,
            "hosts": head.hostset.addresses,
            "names": head.hostset.names,
            "holder": head.hostset.holder,
            "local": head.hostset.local,
            "address": path,
            "started": time.time(),
        }
        state_dir.record_cluster(NAME, record)
        print("ready " + json.dumps(record), flush=True)
        os.dup2(2, 1)  # the starter has stopped reading: anything printed later goes to the head's log
        threading.Thread(target=server.serve_forever, name="fray-head", daemon=True).start()
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        head.close()
        current = state_dir.read_cluster(NAME)
        if current is not None and current.get("pid") == os.getpid():
            state_dir.forget_cluster(NAME)
        shutil.rmtree(socket_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
