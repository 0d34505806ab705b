"""The Coordinator: a Monarch actor in the driver's process through which worker processes reach their
controller (its WorkerService: same process, same tables). Each request is answered with a Reply. A request on a
process's behalf carries that process's credential (WorkerSetup.credential), never a bare key a worker could
make up: Monarch 0.7 does not tell an endpoint who sent a message."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fray.backend import portable
from fray_monarch.core import runtime
from fray_monarch.core.monarch_api import Actor, endpoint
from fray_monarch.core.protocol import Reply, WireValue
from fray_monarch.driver import instances

if TYPE_CHECKING:  # not at run time: every worker process imports this module (to unpickle its handle to the
    # coordinator), and the service would bring the whole controller with it
    from fray_monarch.driver.service import WorkerService


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
        runtime.log.debug("fray coordinator: child mesh failed: %s", failure)
        return True

    def _who(self, credential: str) -> str:
        """The worker process a request comes from, as its credential proves (FrayError: it proves none)."""
        proc_key: str = instances.controller(self.ctl_key).pool.proven(credential)
        return proc_key

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
    def done(
        self, credential: str, results: list[Any], holds: list[str], releases: list[str], events: Any = None
    ) -> None:
        """A worker's reports, with the events its tasks recorded (fray.telemetry.events, plain data) since its last."""
        try:
            self._service().report(self._who(credential), results, holds, releases)
            if events is not None:
                instances.controller(self.ctl_key).events.deliver(events)
        except Exception:
            runtime.log.exception("fray coordinator: bad worker report")

    @endpoint
    def events(self, credential: str, batch: Any) -> None:
        """A worker's new events (fray.telemetry.events, plain data), kept as they came until the driver reads them."""
        try:
            self._who(credential)  # (only a worker of this context's adds to its events)
            instances.controller(self.ctl_key).events.deliver(batch)
        except Exception:
            runtime.log.exception("fray coordinator: bad events from a worker")

    @endpoint
    def submit(self, credential: str, fn_data: bytes, call: WireValue, deps: list[str], request: Any) -> Reply:
        return self._safe(lambda s: s.submit(self._who(credential), fn_data, call, deps, request))

    @endpoint
    def create_actor(
        self, credential: str, cls_data: bytes, call: WireValue, deps: list[str], request: Any, member: Any = None
    ) -> Reply:
        return self._safe(lambda s: s.create_actor(self._who(credential), cls_data, call, deps, request, member))

    @endpoint
    def call_actor(self, credential: str, aid: str, method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_actor(self._who(credential), aid, method, call, deps))

    @endpoint
    def create_group(self, credential: str, cls_data: bytes, call: WireValue, deps: list[str], group: Any) -> Reply:
        return self._safe(lambda s: s.create_group(self._who(credential), cls_data, call, deps, group))

    @endpoint
    def call_group(self, credential: str, aids: list[str], method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_group(self._who(credential), aids, method, call, deps))

    @endpoint
    def kill_group(self, aids: list[str]) -> Reply:
        return self._safe(lambda s: s.kill_group(aids))

    @endpoint
    def call_actor_stream(self, credential: str, aid: str, method: str, call: WireValue, deps: list[str]) -> Reply:
        return self._safe(lambda s: s.call_actor_stream(self._who(credential), aid, method, call, deps))

    @endpoint
    def stream_close(self, sid: str) -> None:
        try:
            self._service().close_stream(sid)
        except Exception:
            runtime.log.debug("fray coordinator: stream close failed", exc_info=True)

    @endpoint(explicit_response_port=True)
    def stream_next(self, port: Any, credential: str, sid: str, timeout: float | None) -> None:
        self._answer(port, lambda s: s.stream_next(port, self._who(credential), sid, timeout))

    @endpoint
    def put(self, credential: str, oid: str, value: WireValue) -> Reply:
        return self._safe(lambda s: s.put(self._who(credential), oid, value))

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
    def get(self, port: Any, credential: str, oids: list[str], timeout: float | None) -> None:
        self._answer(port, lambda s: s.get(port, self._who(credential), oids, timeout))

    @endpoint(explicit_response_port=True)
    def wait(self, port: Any, credential: str, oids: list[str], num_returns: int, timeout: float | None) -> None:
        self._answer(port, lambda s: s.wait(port, self._who(credential), oids, num_returns, timeout))
