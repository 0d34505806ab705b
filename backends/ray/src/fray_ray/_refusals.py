"""The value behind the ref of a call fray refused (fray_ray._gangs.route: the call's SPMD group restarts or is
dead), and the check a get makes for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fray.errors import FrayError

__all__ = ["Refusal", "raise_refusals"]


class Refusal:
    """The value behind a refused call's ref (`route`): its get raises `error`. A put value, not a failing Ray
    task: Ray would log every failed object nobody read as an "Unhandled error"."""

    __slots__ = ("after", "error", "waits")

    def __init__(self, error: FrayError, waits: bool = False, after: int = -1) -> None:
        self.error = error
        self.waits = waits  # the group restarts: the get waits for it and sends the call then (fray_ray._resend)
        self.after = after  # (waits for a life later than this one: a member's process was ending)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Refusal, (self.error, self.waits, self.after))


def raise_refusals(values: Sequence[Any]) -> None:
    """Raise the error of the first Refusal among the values a get returned."""
    for value in values:
        if type(value) is Refusal:
            raise type(value.error)(str(value.error))
