"""Shared by the live pages' browser tests (tests/dashboard): Debian's Chromium (apt, `make system-packages`) driven
by Playwright, which never downloads a browser here; a page watched for console errors and for requests to any
server but its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fray.dashboard.server import page_id

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / ".tmp"  # kept as the tests' artifacts


def launched_chromium(sync_api: Any) -> Iterator[Any]:
    """Debian's Chromium, headless, driven through Playwright's `sync_api` (a module's `browser` fixture yields
    from this), closed after."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@dataclass
class Watched:
    """What a page did that it must not: console errors, page errors, requests to another server."""

    problems: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)


def watch(page: Any, url: str) -> Watched:
    origin = urlsplit(url)
    seen = Watched()
    page.on("console", lambda m: seen.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.problems.append(f"page error: {e}"))

    def on_request(request: Any) -> None:
        where = urlsplit(request.url)
        if (where.scheme, where.hostname, where.port) != ("http", origin.hostname, origin.port):
            seen.elsewhere.append(request.url)

    page.on("request", on_request)
    return seen


def page_address(url: str) -> str:
    """Where a page's tokened URL leads: its own path (named by a hash of the token), the token gone."""
    origin = urlsplit(url)
    return f"http://{origin.hostname}:{origin.port}/{page_id(parse_qs(origin.query)['token'][0])}/"
