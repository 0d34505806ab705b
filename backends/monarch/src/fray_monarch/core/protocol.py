"""The typed messages between the controller (driver process) and the worker processes.

Values travel as `Inline` (small: the bytes ride in the control message) or `Stored` (large: a small locator on
the control plane; the bytes stay in the owner's shared-memory store and go straight to the reader).
"""

from __future__ import annotations

import enum
import logging
import operator
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from fray.backend import Blob, RemoteError

__all__ = [
    "BACKEND",
    "ActorCall",
    "ActorDesc",
    "ActorReply",
    "Inline",
    "ProcInfo",
    "Reply",
    "Span",
    "StoreConfig",
    "Stored",
    "StreamItem",
    "TaskItem",
    "TaskResult",
    "Value",
    "WireValue",
    "WorkerSetup",
    "send_reply",
]

BACKEND = "monarch"  # the backend name refs and handles carry

ActorDesc = tuple[str, str, frozenset[str], str | None]  # an actor: (its id, class name, public methods, name)


_T = TypeVar("_T")


def _positional(cls: type[_T]) -> type[_T]:
    """Pickle instances as (class, field values). A dataclass's default pickling (a state dict, set field by
    field) is most of the cost of packing an actor's reply; these messages ride in every call."""
    get = operator.attrgetter(*(f.name for f in fields(cls)))  # type: ignore[arg-type]
    if len(fields(cls)) == 1:  # type: ignore[arg-type]
        reduce: Callable[[Any], Any] = lambda self: (cls, (get(self),))  # noqa: E731
    else:
        reduce = lambda self: (cls, get(self))  # noqa: E731
    cls.__reduce__ = reduce  # type: ignore[assignment,method-assign]
    return cls


# A message's status (a StrEnum member) is pickled as the plain str it equals: a member pickles as a call of its
# class, which packing and unpacking every reply would pay, where a str is a few bytes. The
# receiver's plain str compares equal to the member. (str.__str__ of a member is its value, an exact str.)
_plain_str = str.__str__


# Smaller values ride in control messages; larger ones stay in their owner's store: about where an actor's result
# starts to come back faster stored than inline (docs/backends/monarch.md, "The data plane").
INLINE_LIMIT = 1024 * 1024


@dataclass(frozen=True)
class StoreConfig:
    """How the object stores of one context are set up (see data/store.py)."""

    budget: int  # bytes of shared memory per fray host (object_store_memory)
    host_ids: tuple[str, ...]  # the fray host of each mesh host; "local" is the driver's own
    bind_hosts: tuple[str, ...]  # where each mesh host's transfer servers listen
    driver_bind: str = "127.0.0.1"
    inline_limit: int = INLINE_LIMIT
    transport: str = "auto"  # between hosts: auto (RDMA where ibverbs exists, else tcp), tcp, tls (encrypted), rdma


@_positional
@dataclass(frozen=True)
class Inline:
    """A small serialized value carried in the message itself."""

    data: bytes
    buffers: tuple[bytes, ...] = ()
    private: frozenset[int] = frozenset()

    @property
    def nbytes(self) -> int:
        if not self.buffers:
            return len(self.data)
        return len(self.data) + sum(len(b) for b in self.buffers)

    @staticmethod
    def of(blob: Blob) -> Inline:
        if not blob.buffers:
            return Inline(blob.data)
        return Inline(blob.data, tuple(bytes(memoryview(b)) for b in blob.buffers), blob.private)


@_positional
@dataclass(frozen=True)
class Span:
    offset: int  # from the start of the allocation
    length: int


@_positional
@dataclass(frozen=True)
class Stored:
    """Where a large value lives: an allocation in the shared-memory store of its owner process.

    A reader on the same host maps the spans; one on another host pulls the allocation's raw bytes from
    `address`, proving `capability` (data/transfer.py). The pickle stream (`data`) rides here, in `pickle`; when too
    large for a control message it stays in the allocation and `digest` (its SHA-256) rides here instead, checked
    before unpickling. `oid` is the object that keeps the allocation alive: a reader holds a ref to it while its
    mapping lives."""

    oid: str
    host: str  # the fray host (two fray hosts never share memory, even on one machine)
    owner: str  # the owner process's key ("driver" for the controller's own store)
    address: str  # "ip:port" of the owner's transfer server ("": none, the context has one host)
    capability: bytes  # the right to read this allocation from its owner (b"": no transfer server)
    segment: str  # the store file, in this user's directory of the owner's host's /dev/shm
    offset: int  # start of the allocation in the segment (page aligned)
    length: int
    data: Span
    buffers: tuple[Span, ...]
    private: frozenset[int]
    alloc: int  # the allocation's id in the owner's store, to free it
    pickle: bytes | None = None  # the pickle stream (None: it is too large to ride here, see digest)
    digest: bytes = b""  # SHA-256 of the pickle stream left in the allocation (set where other hosts may read it)
    rdma: Any = None  # a Monarch RDMABuffer over the allocation, where the owner offers RDMA

    @property
    def nbytes(self) -> int:
        return self.data.length + sum(s.length for s in self.buffers)


Value = Inline | Stored


@_positional
@dataclass(frozen=True)
class WireValue:
    """A value and the ids of the refs pickled inside it (kept alive as long as the value is)."""

    value: Value
    contained: tuple[str, ...] = ()


@_positional
@dataclass(frozen=True)
class TaskItem:
    """One task sent to a worker process."""

    id: str
    fn_key: str
    fn_data: bytes | None  # None when that process has the function already
    args: WireValue
    deps: tuple[Value, ...]  # the values of top-level ref arguments, in order
    resources: dict[str, float] = field(default_factory=dict)
    stream: bool = False  # a generator: each item is reported as a StreamItem as it is produced
    name: str | None = None  # TaskOptions.name: its output lines' label (default: the function's __name__)
    gpus: tuple[
        int, ...
    ] = ()  # the GPUs it holds (fray.runtime.gpus ids; the process sees them), for fray.current_gpus()


@_positional
@dataclass(frozen=True)
class StreamItem:
    """One item of a stream (a streaming task's or an actor method's generator), sent as it is produced: a value
    stored under `oid` (chosen by the producer, stored there when large), an error (the generator raised), or
    the end of the stream (`end`, after `index` items)."""

    stream: str
    index: int
    oid: str = ""
    value: WireValue | None = None
    error: RemoteError | None = None
    end: bool = False


class TaskStatus(enum.StrEnum):
    """How a task ended, as its worker reports it (TaskResult.status)."""

    OK = "ok"  # its value
    ERR = "err"  # its RemoteError
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TaskResult:
    """A worker's report of one task: ok (value), err (RemoteError) or cancelled."""

    id: str
    status: str  # a TaskStatus; the plain str equal to it once it has crossed the wire (see _plain_str)
    value: WireValue | None = None
    error: RemoteError | None = None

    def __reduce__(self) -> Any:  # as _positional's, with the status as a plain str
        return (TaskResult, (self.id, _plain_str(self.status), self.value, self.error))


@_positional
@dataclass(frozen=True)
class ActorCall:
    """One call of an actor's method, as its host's `call` endpoint gets it: one argument, compacted (see
    compact): Monarch's pickling of four arguments (two of them dataclasses) costs every call several times that
    of one int."""

    oid: str
    method: str
    call: WireValue
    deps: list[str]


class ReplyStatus(enum.StrEnum):
    """How an actor's init or method call went, as its host answers (ActorReply.status)."""

    OK = "ok"  # its value
    ERR = "err"  # its RemoteError
    DEAD = "dead"  # the actor is dead (the reason says why)


# Bound once: looking a member up on its class costs more than the compare, and calls compare per reply.
_OK = ReplyStatus.OK


@dataclass(frozen=True)
class ActorReply:
    """An actor host's answer to init or a method call: ok (value), err (RemoteError) or dead (reason)."""

    status: str  # a ReplyStatus; the plain str equal to it once it has crossed the wire (see _plain_str)
    value: WireValue | None = None
    error: Any = None
    reason: str = ""

    def __reduce__(self) -> Any:  # as _positional's, with the status as a plain str
        return (ActorReply, (_plain_str(self.status), self.value, self.error, self.reason))


@_positional
@dataclass(frozen=True)
class Reply:
    """The answer of the coordinator (or a job runner) to a request: a value, an error to raise, or a timeout."""

    value: Any = None
    error: Any = None  # an exception, or a RemoteError
    timed_out: bool = False

    def unwrap(self) -> Any:
        """The value; raises the error (rebuilt) if there is one."""
        if self.error is not None:
            from fray.backend import rebuild

            raise rebuild(self.error)
        return self.value


def send_reply(port: Any, reply: Reply) -> None:
    """Answer a worker's request on its response port; the worker may have died meanwhile (nothing to tell)."""
    try:
        port.send(reply)
    except Exception:
        logging.getLogger("fray_monarch").debug("fray: reply to a gone worker dropped", exc_info=True)


def compact(message: Any, value: Value | None) -> Any:
    """A message whose value is Inline (or absent), pickled here with the C pickler: Monarch's own pickling of
    these dataclasses costs far more per message (a group broadcast sends many). A Stored value may carry an
    RDMABuffer, which only Monarch's pickling handles: such a message goes as it is."""
    if isinstance(value, Stored):
        return message
    return pickle.dumps(message, protocol=5)


def expand(message: Any) -> Any:
    return pickle.loads(message) if isinstance(message, bytes) else message


def plain_data(value: WireValue | None) -> bytes | None:
    """The pickle of a value that is small, has no out-of-band buffers and holds no refs (most arguments and
    results), else None. Such a value travels in a group message as these bytes alone: unpickling the
    dataclasses around it, in every member and in the driver for every answer, cost more than the rest of
    fray's part of a group call."""
    if value is None or value.contained or type(value.value) is not Inline or value.value.buffers:
        return None
    return value.value.data


# The plain forms of an actor call and its reply, for the usual case of small arguments and results without
# buffers or refs: tuples of strings and bytes, which pickle several times faster than the dataclasses around them
# (ActorCall(WireValue(Inline(...)))) and rebuild as fast, on each side of every call.
PlainCall = tuple[str, str, bytes]  # (object id, method, the arguments' pickle)
PlainReply = tuple[bytes]  # (the value's pickle,): an ok reply


def plain_call(oid: str, method: str, call: WireValue, deps: list[str]) -> PlainCall | None:
    """The plain form of a call, when it has one (no deps, plain arguments)."""
    data = None if deps else plain_data(call)
    return None if data is None else (oid, method, data)


def group_answer(oid: str, reply: ActorReply) -> tuple[str, bytes | None, Any]:
    """A member's answer to a group broadcast: (object id, the value's pickle, None) for an ok reply with a
    plain value; (object id, None, the whole reply compacted) otherwise."""
    data = plain_data(reply.value) if reply.status == _OK else None
    if data is not None:
        return (oid, data, None)
    return (oid, None, compact(reply, reply.value.value if reply.value is not None else None))


def read_group_answer(message: tuple[str, bytes | None, Any]) -> tuple[str, ActorReply]:
    oid, data, rest = message
    if data is not None:
        return oid, ActorReply(_OK, WireValue(Inline(data)))
    return oid, expand(rest)


@dataclass(frozen=True)
class ProcInfo:
    """What a worker process says of itself when pinged."""

    pid: int
    machine: str  # machine_id(): the same value means the same kernel, so the pid can be watched here


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker process (and each actor host in it) is started with."""

    ctl_key: str
    proc_key: str
    coord: Any  # the coordinator actor in the driver, which serves this process's requests
    capacity: dict[str, float]
    nodes: list[dict[str, float]]
    sys_path: list[str]
    host_id: str  # the fray host this process belongs to
    bind_host: str  # where its transfer server listens ("": its address that routes to driver_host)
    store_budget: int
    inline_limit: int
    transport: str
    log_file: str | None = None  # log_to_driver=false: the process's fds 1 and 2 go to this file (None: console)
    # ("host:port", key) of the driver's lifeline (net/lifeline.py; the key proves proc_key only), for processes on
    # other hosts: None on this one
    lifeline: tuple[str, bytes] | None = None
    driver_host: str = "127.0.0.1"  # the address the driver listens on
    credential: str = ""  # "<proc_key>:<proof>": what the process's requests to the coordinator carry
