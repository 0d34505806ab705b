"""Functions and actors the device-value cases run, on the CPU stand-in of device memory (fray.runtime.device_shares:
a MemfdBuffer travels between processes as a CUDA tensor does)."""

from __future__ import annotations

from fray.runtime.device_shares import MemfdBuffer, share_server
from fray.telemetry.transfers import device_stats


def make_buffer(byte: int, nbytes: int) -> MemfdBuffer:
    return MemfdBuffer(bytes([byte]) * nbytes)


def buffer_summary(buf: MemfdBuffer) -> tuple[int, int, int]:
    """(size, first byte, last byte) of the buffer this reader got."""
    data = buf.tobytes()
    return len(data), data[0], data[-1]


def in_a_dict(buf: MemfdBuffer) -> dict[str, MemfdBuffer]:
    return {"weights": buf}


def overwrite_and_summarize(buf: MemfdBuffer) -> tuple[int, int, int]:
    """Write this reader's copy, then summarize it: no other reader may see the write."""
    buf.write_at(0, b"\xff")
    return buffer_summary(buf)


class BufferHolder:
    """An actor that makes a buffer and hands it to others."""

    def __init__(self, byte: int, nbytes: int) -> None:
        self.buf = make_buffer(byte, nbytes)

    def get(self) -> MemfdBuffer:
        return self.buf

    def summarize(self, buf: MemfdBuffer) -> tuple[int, int, int]:
        return buffer_summary(buf)

    def device_paths(self) -> list[str]:
        """The paths by which device values reached this process (fray.telemetry.transfers)."""
        return sorted(device_stats.snapshot())

    def snapshots_held(self) -> int:
        """How many device snapshots this process serves (fray.runtime.device_shares)."""
        return share_server().held()
