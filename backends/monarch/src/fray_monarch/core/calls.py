"""A call's arguments as they travel: top-level ObjectRef arguments become markers filled with their values
where the call runs (refs nested in containers stay refs), and the rest is serialized once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fray.backend import Blob, ObjectRef, dumps, find_unserializable_argument
from fray.errors import FrayError
from fray_monarch.core.objects import DepMarker, RefPayload
from fray_monarch.core.protocol import WireValue

__all__ = ["Call", "contained_ids", "fill_deps", "pack_call", "split_refs"]


@dataclass(slots=True)
class Call:
    """A call ready to send: its arguments (`args`, with markers for the top-level refs), the ids of those refs
    (`deps`, whose values are filled in where it runs), and what must stay alive until it is sent (`keep`)."""

    args: WireValue
    deps: list[str]
    keep: list[Any]


def split_refs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    """Replace top-level ObjectRef arguments by DepMarkers; return the payloads they stood for."""
    deps: list[Any] = []

    def swap(value: Any) -> Any:
        if isinstance(value, ObjectRef):
            deps.append(value.payload)
            return DepMarker(len(deps) - 1)
        return value

    new_args = tuple(swap(a) for a in args)
    new_kwargs = {k: swap(v) for k, v in kwargs.items()}
    return new_args, new_kwargs, deps


def fill_deps(
    args: tuple[Any, ...], kwargs: dict[str, Any], values: list[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def fill(value: Any) -> Any:
        return values[value.index] if isinstance(value, DepMarker) else value

    return tuple(fill(a) for a in args), {k: fill(v) for k, v in kwargs.items()}


def pack_call(what: str, args: tuple[Any, ...], kwargs: dict[str, Any], device_mode: str) -> tuple[Blob, list[Any]]:
    """The call's arguments serialized (views of the caller's buffers, written out at once; device values in
    `device_mode`), and the payloads of its top-level ref arguments."""
    args, kwargs, deps = split_refs(args, kwargs)
    try:
        blob = dumps((args, kwargs), f"the arguments of {what}", copy=False, device_mode=device_mode)
    except FrayError as exc:
        raise find_unserializable_argument(what, args, kwargs, exc) from exc
    return blob, deps


def contained_ids(blob: Blob) -> tuple[str, ...]:
    """The ids of the refs pickled inside a value (kept alive as long as it is)."""
    if not blob.contained:
        return ()
    return tuple(p.id for p in blob.contained if isinstance(p, RefPayload))
