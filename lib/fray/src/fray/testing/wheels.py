"""Wheels the conformance suite installs as a job's package_requirements, built by hand: no network, no build
backend."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

__all__ = ["probe_wheel"]


def probe_wheel(directory: Path, value: str) -> Path:
    """A minimal pure-Python wheel, built by hand so the test needs no network and no build backend."""
    files = {
        "frayprobe.py": f"VALUE = {value!r}\n",
        "frayprobe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: frayprobe\nVersion: 0.1\n",
        "frayprobe-0.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: fray\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("frayprobe-0.1.dist-info/RECORD,,")
    files["frayprobe-0.1.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = directory / "frayprobe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path
