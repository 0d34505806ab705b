"""The wire messages between the monarch driver and its workers: every typed message survives pickling (they
pickle positionally), and a group member's answer travels as the value's bytes alone when it can."""

from __future__ import annotations

import pickle
import threading

import pytest

from fray.runtime.remote_errors import capture_exception
from fray.runtime.serialization import dumps, loads
from fray_monarch.core.protocol import (
    ActorReply,
    Inline,
    Reply,
    ReplyStatus,
    Span,
    Stored,
    StreamItem,
    TaskItem,
    TaskResult,
    TaskStatus,
    WireValue,
    compact,
    expand,
    group_answer,
    plain_call,
    plain_data,
    read_group_answer,
)


def _wire(value: object, contained: tuple[str, ...] = ()) -> WireValue:
    return WireValue(Inline.of(dumps(value)), contained)


def test_every_message_round_trips() -> None:
    stored = Stored(
        "o1", "local", "p3", "127.0.0.1:5", "tok", "seg", 4096, 64, Span(0, 8), (Span(8, 8),), frozenset({0}), 7
    )
    messages = [
        Inline(b"data", (b"buf",), frozenset({0})),
        Span(1, 2),
        stored,
        _wire([1, 2], ("ref-1",)),
        TaskItem("t1", "fn", None, _wire(((1,), {})), (Inline(b"x"),), {"CPU": 1.0}, True, "name"),
        StreamItem("s1", 3, "o2", _wire(5)),
        TaskResult("t1", TaskStatus.OK, _wire("x")),
        ActorReply(ReplyStatus.DEAD, reason="gone"),
        Reply(value=[1], timed_out=True),
    ]
    for message in messages:
        assert pickle.loads(pickle.dumps(message)) == message
        assert expand(compact(message, None)) == message


def test_a_status_goes_on_the_wire_as_the_plain_str_it_equals() -> None:
    # (a member would pickle as a call of its class: more bytes, and ~3 us more to unpack a reply)
    for member, plain in (
        (ActorReply(ReplyStatus.DEAD, reason="r"), ActorReply("dead", reason="r")),
        (TaskResult("t", TaskStatus.CANCELLED), TaskResult("t", "cancelled")),
    ):
        assert pickle.dumps(member, protocol=5) == pickle.dumps(plain, protocol=5)
        back = pickle.loads(pickle.dumps(member, protocol=5))
        assert type(back.status) is str and back.status == member.status and back == member


def test_group_answer_is_the_value_bytes_alone_for_a_plain_value() -> None:
    reply = ActorReply(ReplyStatus.OK, _wire({"a": 1}))
    oid, data, rest = message = group_answer("base.3", reply)
    assert (oid, rest) == ("base.3", None) and data == plain_data(reply.value)
    back_oid, back = read_group_answer(message)
    assert back_oid == "base.3" and back.status == ReplyStatus.OK and back.value is not None
    assert loads_value(back) == {"a": 1}


def test_group_answer_carries_the_whole_reply_otherwise() -> None:
    with_refs = ActorReply(ReplyStatus.OK, _wire("x", ("ref-9",)))
    with_buffers = ActorReply(ReplyStatus.OK, WireValue(Inline(b"d", (b"buffer",))))
    try:
        raise KeyError("k")
    except KeyError as exc:
        failed = ActorReply(ReplyStatus.ERR, error=capture_exception(exc))
    for reply in (with_refs, with_buffers, failed, ActorReply(ReplyStatus.DEAD, reason="its process died")):
        oid, data, rest = group_answer("b.0", reply)
        assert data is None and rest is not None
        assert read_group_answer((oid, data, rest)) == ("b.0", reply)


def test_an_actor_call_and_its_reply_go_plain_when_they_can() -> None:
    plain = _wire(([1, 2], {"k": "v"}))
    assert plain_call("o-1", "add", plain, []) == ("o-1", "add", plain_data(plain))
    assert plain_call("o-1", "add", plain, ["dep-1"]) is None  # a ref argument: the whole ActorCall goes
    assert plain_call("o-1", "add", _wire("x", ("ref-9",)), []) is None
    assert plain_call("o-1", "add", WireValue(Inline(b"d", (b"buffer",))), []) is None
    dead = ActorReply(ReplyStatus.DEAD, reason="gone")  # a reply that is not a plain value goes compacted, as before
    assert expand(compact(dead, None)) == dead and expand(None) is None


def loads_value(reply: ActorReply) -> object:
    assert reply.value is not None and isinstance(reply.value.value, Inline)
    from fray.runtime.serialization import Blob

    return loads(Blob(reply.value.value.data, list(reply.value.value.buffers)))


class _PublicOnly:
    """A real Monarch port receiver seen only through its public `recv()` (as if Monarch's internals were gone)."""

    def __init__(self, receiver: object) -> None:
        self.recv = receiver.recv  # type: ignore[attr-defined]


@pytest.mark.parametrize("public_only", [False, True], ids=["one-coroutine", "public-fallback"])
def test_receive_each_hands_over_every_message_in_order_until_none(public_only: bool) -> None:
    from monarch.actor import Channel

    from fray_monarch.core import runtime

    port, receiver = Channel.open()
    got: list[object] = []
    all_in = threading.Event()

    def handle(message: object) -> None:
        got.append(message)
        if len(got) == 3:
            all_in.set()

    reader = runtime.receive_each(_PublicOnly(receiver) if public_only else receiver, handle, "test-reader")
    for message in (("a", 1), ("b", 2), ("c", 3)):
        port.send(message)
    assert all_in.wait(30)
    port.send(None)
    reader.join(30)
    assert not reader.is_alive()
    assert got == [("a", 1), ("b", 2), ("c", 3)]
