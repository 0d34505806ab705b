"""Spec options (`"monarch?procs=4&log_to_driver=false"`): the converters every backend shares, so the same
option means and accepts the same values everywhere, and `parse_options`, which applies a backend's schema."""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fray.types import normalize_resources

__all__ = [
    "byte_count",
    "choice",
    "count",
    "did_you_mean",
    "directory",
    "flag",
    "ip_address",
    "non_empty_text",
    "non_negative",
    "parse_options",
    "parse_resources",
    "port",
    "positive_int",
    "seconds",
    "to_bool",
]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ " (did you mean 'ray'?)" for the choice closest to a misspelt or miscased `word`; "" if none is close."""
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def parse_options(
    backend: str, options: Mapping[str, Any], schema: Mapping[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    """Convert options by `schema` (name -> converter); unknown names and bad values are ValueErrors."""
    out: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise ValueError(
                f"unknown option {key!r} for the {backend!r} backend{did_you_mean(key, schema)}; known options: {known}"
            )
        try:
            out[key] = schema[key](raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"option {key}={raw!r} for the {backend!r} backend is not valid: {exc}") from exc
    return out


def flag(raw: str) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case)."""
    lowered = str(raw).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


to_bool = flag  # its earlier name


def non_negative(raw: str) -> float:
    """A number >= 0 (cpus, gpus, memory)."""
    value = float(raw)
    if not value >= 0:  # also refuses nan
        raise ValueError(f"must be a number >= 0, got {raw!r}")
    return value


def count(raw: str) -> float:
    """A finite number >= 0 (CPUs, GPUs); a whole number stays an int (what engines' start-up options expect)."""
    value = non_negative(raw)
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number >= 0, got {raw!r}")
    return int(value) if value.is_integer() else value


def positive_int(raw: str) -> int:
    """A whole number >= 1 (process counts)."""
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be a whole number >= 1, got {raw!r}")
    return value


def byte_count(raw: str) -> int:
    """A positive number of bytes, also written like 3e8."""
    value = float(raw)
    if not (value > 0 and math.isfinite(value) and value.is_integer()):
        raise ValueError(f"must be a positive whole number of bytes, got {raw!r}")
    return int(value)


def seconds(raw: str) -> float:
    value = float(raw)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a number of seconds > 0, got {raw!r}")
    return value


def port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError(f"must be a TCP port (1-65535), got {raw!r}")
    return value


def ip_address(raw: str) -> str:
    try:
        return str(ipaddress.ip_address(str(raw).strip().strip("[]")))
    except ValueError:
        raise ValueError(f"must be an IP address of this machine, got {raw!r}") from None


def non_empty_text(raw: str) -> str:
    if not str(raw).strip():
        raise ValueError("must not be empty")
    return str(raw)


def directory(raw: str) -> str:
    """An existing directory."""
    if not os.path.isdir(raw):
        raise ValueError(f"{raw!r} is not a directory")
    return str(raw)


def choice(*allowed: str) -> Callable[[str], str]:
    """One of `allowed`."""

    def convert(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {raw!r}")
        return raw

    return convert


def parse_resources(raw: str) -> dict[str, float]:
    """Custom resources: JSON (`{"disk": 4, "tag": 1}`) or `disk:4,tag` (a bare name means 1)."""
    raw = raw.strip()
    if raw.startswith("{"):
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object like {"disk": 4}')
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        pairs = []
        for part in filter(None, (p.strip() for p in raw.split(","))):
            name, _, qty = part.partition(":")
            pairs.append((name.strip(), qty.strip() or 1.0))
    return normalize_resources({name: float(qty) for name, qty in pairs}, "resources")
