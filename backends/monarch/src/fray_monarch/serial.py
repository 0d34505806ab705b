"""fray.serialization.dumps, made safe for other processes.

fray's dumps tries the C pickler first, which pickles functions and classes of `__main__` BY REFERENCE; a worker
process (whose `__main__` is Monarch's bootstrap) cannot resolve those. Here such pickles are redone with
cloudpickle, which sends them by value.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from fray import serialization
from fray.errors import SerializationError
from fray.serialization import Blob

_MAIN = b"__main__"


def dumps(obj: Any, what: str = "value") -> Blob:
    blob = serialization.dumps(obj, what)
    if _MAIN not in blob.data:
        return blob
    buffers: list[pickle.PickleBuffer] = []
    local = serialization._local
    outer = getattr(local, "contained", None)
    contained: list[Any] = []
    local.contained = contained
    try:
        data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except Exception as exc:
        raise SerializationError(f"cannot serialize {what} of type {type(obj).__name__}: {exc}") from exc
    finally:
        local.contained = outer
    return Blob(data, [bytes(b.raw()) for b in buffers], contained)
