"""The controller checks what a worker process reports against who reports it (issue 20): a request proves which
process sent it (a credential only that process was given), an object it registers must carry an id of its own
namespace that does not exist yet, and a value it says is stored must be in its own store. Real worker processes
send the reports through the real coordinator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fray
from fray.runtime.serialization import dumps
from fray_monarch.core.protocol import Inline, Span, Stored, WireValue


def _worker() -> object:
    from fray_monarch.workers import process as worker_process

    assert worker_process._worker is not None
    return worker_process._worker.rt


def _put(rt: object, oid: str, value: Inline | Stored, credential: str | None = None) -> str | None:
    """The coordinator's answer to this worker's put: None if accepted, else the refusal's text."""
    who = rt.credential if credential is None else credential  # type: ignore[attr-defined]
    reply = rt.coord.put.call_one(who, oid, WireValue(value)).get(timeout=60)  # type: ignore[attr-defined]
    return None if reply.error is None else str(reply.error)


def report_in_the_name_of_others() -> list[str | None]:
    """A put of this process's own new id, sent with a bare key, a made-up proof, and the driver's key."""
    rt = _worker()
    value = Inline(dumps(1).data)
    forged = [rt.proc_key, f"{rt.proc_key}:{'0' * 64}", "driver"]  # type: ignore[attr-defined]
    return [_put(rt, rt.new_oid(), value, credential) for credential in forged]  # type: ignore[attr-defined]


def report_the_same_id_twice() -> list[str | None]:
    rt = _worker()
    oid = rt.new_oid()  # type: ignore[attr-defined]
    value = Inline(dumps(1).data)
    return [_put(rt, oid, value), _put(rt, oid, Inline(dumps(2).data))]


def report_an_id_of_another_namespace() -> str | None:
    rt = _worker()
    return _put(rt, f"{rt.ctl_key}-driver.999999", Inline(dumps(1).data))  # type: ignore[attr-defined]


def report_a_value_stored_by_another_process() -> str | None:
    rt = _worker()
    fake = Stored(
        oid="",
        host="local",
        owner="driver",  # the driver would be told to free its allocation 1 when this object goes
        address="",
        capability=b"",
        segment="x",
        offset=0,
        length=4096,
        data=Span(0, 10),
        buffers=(),
        private=frozenset(),
        alloc=1,
    )
    return _put(rt, rt.new_oid(), fake)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def ctx() -> Iterator[fray.JobContext]:
    context = fray.init("monarch?procs=1")
    try:
        yield context
    finally:
        fray.shutdown()


def test_a_second_report_of_an_existing_object_is_refused(ctx: fray.JobContext) -> None:
    first, second = ctx.get(ctx.create_task(report_the_same_id_twice), timeout=120)
    assert first is None
    assert second is not None and "already exists" in second


def test_an_id_of_another_process_is_refused(ctx: fray.JobContext) -> None:
    refusal = ctx.get(ctx.create_task(report_an_id_of_another_namespace), timeout=120)
    assert refusal is not None and "not its own" in refusal


def test_a_value_claimed_to_be_stored_by_another_process_is_refused(ctx: fray.JobContext) -> None:
    refusal = ctx.get(ctx.create_task(report_a_value_stored_by_another_process), timeout=120)
    assert refusal is not None and "not by itself" in refusal
    assert ctx.get(ctx.put(b"x" * (2 << 20)), timeout=60) == b"x" * (2 << 20)  # the driver's store is intact


def test_a_request_that_does_not_prove_its_process_is_refused(ctx: fray.JobContext) -> None:
    refusals = ctx.get(ctx.create_task(report_in_the_name_of_others), timeout=120)
    assert len(refusals) == 3 and all(r is not None and "does not prove" in r for r in refusals), refusals
    assert ctx.get(ctx.create_task(report_the_same_id_twice), timeout=120)[0] is None  # its own credential works
