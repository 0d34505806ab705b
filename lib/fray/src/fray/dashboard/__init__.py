"""The live page of a job (`ctx.dashboard()`): progress per function, a task stream, actors, transfers, errors.

A stdlib HTTP server on loopback (fray.dashboard.server) that reads the job's events (`ctx.events()`) only while
a page polls it, and keeps its aggregates up to date from a cursor (fray.dashboard.model): see docs/dashboard.md.
"""

from __future__ import annotations

from fray.dashboard.server import Dashboard

__all__ = ["Dashboard"]
