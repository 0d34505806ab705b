"""The Coordinator: a Monarch actor in the driver's process through which worker processes reach their
controller (its WorkerService: same process, same tables). Each request is answered with a Reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fray.remote_errors import portable
from fray_monarch import _runtime, instances
from fray_monarch._monarch import Actor, endpoint
from fray_monarch.protocol import Reply, WireValue

if TYPE_CHECKING:  # not at run time: every worker process imports this module (to unpickle its handle to the
    # coordinator), and the service would bring the whole controller with it
    from fray_monarch.service import WorkerService


class Coordinator(Actor):
    """Lives in the controller process; serves workers' create_task/create_actor/get/put... against the
    controller's own tables (shared memory, same process), through its WorkerService."""

    def __init__(self, ctl_key: str) -> None:
        self.ctl_key = ctl_key

    def _service(self) -> WorkerService:
        service: WorkerService = instances.controller(self.ctl_key).service
        return service

    def __supervise__(self, failure: Any) -> bool:
        """Meshes spawned while serving a worker's request (nested actors, replacement and env processes) are
        owned by this actor. Unhandled, one such process dying would kill the coordinator itself, and with it
        every later worker report. Deaths are detected and handled by the controller's watch calls."""
        _runtime.log.debug("fray coordinator: child mesh failed: %s", failure)
        return True

    def _safe(self, request: Callable[[WorkerService], Any]) -> Reply:
        """The answer to a request: its value, or the exception it raised (the caller raises it)."""
        try:
            return Reply(request(self._service()))
        except BaseException as exc:
            return Reply(error=portable(exc))

    def _answer(self, port: Any, request: Callable[[WorkerService], None]) -> None:
        """A request answered on its response port later (get, wait, the next stream item)."""
        try:
            request(self._service())
        except BaseException as exc:
            port.send(Reply(error=portable(exc)))

    @endpoint
    def done(self, proc_key: str, results: list[Any], holds: list[str], releases: list[str]) -> None:
        try:
            self._service().report(proc_key, results, holds, releases)
        except Exception:
            _runtime.log.exception("fray coordinator: bad worker report")

    @endpoint
    def submit(self, proc_key: str, fn_data: bytes, call: WireValue, deps: list[str], options: Any) -> Reply:
        return self._safe(lambda s: s.submit(proc_key, fn_data, call, deps, options))

    @endpoint
    def create_actor(
        self, proc_key: str, cls_data: bytes, call: WireValue, deps: list[str], options: Any, member: Any = None
    ) -> Reply:
        return self._safe(lambda s: s.create_actor(proc_key, cls_data, call, deps, options, member))

    @endpoint
    def call_actor(self, proc_key: str, aid: str, method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_actor(proc_key, aid, method, call, deps))

    @endpoint
    def create_group(
        self, proc_key: str, cls_data: bytes, call: WireValue, deps: list[str], options: Any, spec: Any
    ) -> Reply:
        return self._safe(lambda s: s.create_group(proc_key, cls_data, call, deps, options, spec))

    @endpoint
    def call_group(self, proc_key: str, aids: list[str], method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_group(proc_key, aids, method, call, deps))

    @endpoint
    def kill_group(self, aids: list[str]) -> Reply:
        return self._safe(lambda s: s.kill_group(aids))

    @endpoint
    def call_actor_stream(self, proc_key: str, aid: str, method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_actor_stream(proc_key, aid, method, call, deps))

    @endpoint
    def stream_close(self, sid: str) -> None:
        try:
            self._service().close_stream(sid)
        except Exception:
            _runtime.log.debug("fray coordinator: stream close failed", exc_info=True)

    @endpoint(explicit_response_port=True)
    def stream_next(self, port: Any, proc_key: str, sid: str, timeout: float | None) -> None:
        self._answer(port, lambda s: s.stream_next(port, proc_key, sid, timeout))

    @endpoint
    def put(self, proc_key: str, oid: str, value: WireValue) -> Reply:
        return self._safe(lambda s: s.put(proc_key, oid, value))

    @endpoint
    def get_actor(self, name: str) -> Reply:
        return self._safe(lambda s: s.get_actor(name))

    @endpoint
    def kill(self, aid: str) -> Reply:
        return self._safe(lambda s: s.kill(aid))

    @endpoint
    def cancel(self, oid: str) -> Reply:
        return self._safe(lambda s: s.cancel(oid))

    @endpoint(explicit_response_port=True)
    def get(self, port: Any, proc_key: str, oids: list[str], timeout: float | None) -> None:
        self._answer(port, lambda s: s.get(port, proc_key, oids, timeout))

    @endpoint(explicit_response_port=True)
    def wait(self, port: Any, proc_key: str, oids: list[str], num_returns: int, timeout: float | None) -> None:
        self._answer(port, lambda s: s.wait(port, proc_key, oids, num_returns, timeout))
