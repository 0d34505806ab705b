"""Device values between processes of one host without a trip through host memory: a producer serves shares
of a value's device snapshot on a private socket, each reader copies from its own share and lets go
(producer.py, reader.py, wire.py); the memory behind it is CUDA's (cuda_memory.py) or a CPU stand-in of memfd
segments that runs every case of the protocol on a machine without a GPU (memory.py)."""

from fray.runtime.device_shares.memory import (
    DeviceMemory,
    DeviceOpenError,
    MemfdBuffer,
    MemfdMemory,
    Share,
    memfd_memory,
)
from fray.runtime.device_shares.producer import ShareServer, ShareToken, host_key, publish, share_server, stop_serving
from fray.runtime.device_shares.reader import rebuild_shared
from fray.runtime.device_shares.values import SHARED, reduce_memfd_buffer
from fray.runtime.device_shares.wire import ShareRef

__all__ = [
    "SHARED",
    "DeviceMemory",
    "DeviceOpenError",
    "MemfdBuffer",
    "MemfdMemory",
    "Share",
    "ShareRef",
    "ShareServer",
    "ShareToken",
    "host_key",
    "memfd_memory",
    "publish",
    "rebuild_shared",
    "reduce_memfd_buffer",
    "share_server",
    "stop_serving",
]
