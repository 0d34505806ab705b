"""What an actor host (hosts.FrayActorHost) sends its replies through, and what it says of them: a group
member's answers tagged with their object id, a call's reply sent plain when it can be, the end event of a call
from its reply (fray.telemetry.events)."""

from __future__ import annotations

from typing import Any

from fray.backend import ERROR, ended
from fray_monarch.core.protocol import ActorReply, PlainReply, ReplyStatus, compact, group_answer, plain_data

_OK = ReplyStatus.OK  # (bound once: compared per reply, and a member's lookup on its class costs more)

__all__ = ["CompactingPort", "TaggedPort", "end_data"]


def end_data(reply: Any) -> dict[str, str] | None:
    """A call's end event's data from its reply (fray.telemetry.events.ended): None unless it failed."""
    if type(reply) is not ActorReply or reply.status == _OK:
        return None
    if reply.status == ReplyStatus.DEAD:
        return {"status": ERROR, "error": "ActorDiedError"}
    return ended(reply.error)


class TaggedPort:
    """A member's answer to a group broadcast: sent to the shared reply port with its object id."""

    __slots__ = ("oid", "port")

    def __init__(self, port: Any, oid: str) -> None:
        self.port = port
        self.oid = oid

    def send(self, reply: ActorReply | PlainReply) -> None:
        if type(reply) is tuple:  # (_invoke's plain reply: the value's pickle)
            self.port.send((self.oid, reply[0], None))
            return
        assert isinstance(reply, ActorReply)
        self.port.send(group_answer(self.oid, reply))


class CompactingPort:
    """A call's response port that sends the reply plain (protocol.PlainReply) when it can, else compacted
    (protocol.compact); the caller reads either (ActorRegistry.reply)."""

    __slots__ = ("port",)

    def __init__(self, port: Any) -> None:
        self.port = port

    def send(self, reply: ActorReply | PlainReply) -> None:
        if type(reply) is tuple:
            self.port.send(reply)
            return
        assert isinstance(reply, ActorReply)
        data = plain_data(reply.value) if reply.status == _OK else None
        if data is not None:
            self.port.send((data,))
        else:
            self.port.send(compact(reply, None if reply.value is None else reply.value.value))
