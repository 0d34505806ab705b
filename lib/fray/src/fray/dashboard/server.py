"""The live pages' HTTP server: the standard library's ThreadingHTTPServer, one page and a JSON API, for any
`PageSource` (a job's page, fray.dashboard.job_page; a cluster's, fray.dashboard.cluster): one implementation of
the protections serves both.

Nothing of it runs while no page is open: its one thread sleeps in `select` on the listening socket and a
wake-up pipe (no polling; a timeout only while a connection has yet to prove itself or accepts are paused); a
request is served on a thread of its own, for a bounded number of connections (fray.dashboard.admission says
which give way). A failed accept (no file descriptor left) pauses accepting, 10 ms doubling up to 1 s, rather
than spinning on a listening socket that stays ready. What a poll reads, and how
often, is the source's business (each reads at most every so often, whichever tabs ask).

Security (docs/security.md): loopback only unless a host is given; a random token in the first URL is exchanged
for an HttpOnly SameSite=Strict cookie (and removed from the address bar by a redirect to the page's own path,
`/<page id>/`, an id derived from the token that names and scopes the cookie); every other request needs that
cookie; a Host header that is not this server's (DNS rebinding) gets 403; no CORS; a strict CSP.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from fray.dashboard.admission import Admission

__all__ = ["Dashboard", "PageSource", "static_files"]

LOOPBACK = "127.0.0.1"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
IO_TIMEOUT = 10.0  # seconds one read or write of a connection may wait
ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX = 0.01, 1.0  # seconds the server waits after a failed accept, doubling
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


class PageSource(Protocol):
    """What a page shows, for the server: its files, what changed after a cursor, and its Chrome trace."""

    @property
    def files(self) -> Mapping[str, tuple[bytes, str]]:
        """URL path -> (body, content type): the page ("/") and its static files."""

    def state(self, since: int) -> dict[str, Any]:
        """The JSON answer to `/api/state?since=CURSOR` (raising: the server answers 503, with no data)."""

    def write_timeline(self, directory: str) -> Path:
        """Writes the timeline into `directory` (private, deleted after it is sent) and returns its path."""


def static_files(page: str, script: str) -> dict[str, tuple[bytes, str]]:
    """A page's files from fray/dashboard/static: its HTML at "/", its script, and the shared script and style
    sheet."""
    files = {}
    shared = (("/static/common.js", "common.js"), ("/static/app.css", "app.css"))
    for path, name in (("/", page), (f"/static/{script}", script), *shared):
        body = resources.files("fray.dashboard").joinpath("static", name).read_bytes()
        files[path] = (body, _TYPES[Path(name).suffix])
    return files


class Dashboard:
    """One live page's server, showing `source`. `url` carries the token; `stop()` ends the server (the context
    that started it calls it at its shutdown)."""

    def __init__(self, source: PageSource, host: str = LOOPBACK, port: int = 0) -> None:
        self.source = source
        self.token = secrets.token_urlsafe(32)
        self._session = secrets.token_urlsafe(32)  # the cookie's value: not the token itself
        self._files = dict(source.files)
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler)
        self._server.dashboard = self
        self.admission = Admission()
        self.port = int(self._server.server_address[1])
        # Browsers send a cookie to every port of a host: the session cookie is named and scoped (Path) by an id
        # derived from the token, so it reaches this page's paths only, never another service on the same host.
        self.page_id = page_id(self.token)
        self.cookie = f"fray_{self.page_id}"
        self.prefix = f"/{self.page_id}/"
        url_host = host
        # Bound to every interface: any of the machine's addresses may be used; an IP literal in the Host header
        # cannot be DNS rebinding (that needs a name), so one with this port is accepted, and this host's name.
        self.any_address = host in ("", "0.0.0.0", "::")
        if self.any_address:
            url_host = socket.gethostname()
        elif ":" in host:
            url_host = f"[{host}]"
        names = {f"127.0.0.1:{self.port}", f"localhost:{self.port}", f"[::1]:{self.port}", f"{url_host}:{self.port}"}
        self.allowed_hosts = frozenset(n.lower() for n in names)
        self.url = f"http://{url_host}:{self.port}/?token={self.token}"  # the token sets the cookie and leads there
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="fray-dashboard", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        listener = self._server.socket
        listener.setblocking(False)  # select said ready, but the connection may be gone by the accept
        backoff, paused_until = 0.0, 0.0
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ, "stop")
            selector.register(listener, selectors.EVENT_READ, "accept")
            while True:
                due = self.admission.close_overdue()
                if paused_until:
                    left = paused_until - time.monotonic()
                    if left <= 0:
                        paused_until = 0.0
                        selector.register(listener, selectors.EVENT_READ, "accept")
                    else:
                        due = left if due is None else min(due, left)
                for key, _ in selector.select(due):
                    if key.data == "stop":
                        return
                    try:
                        request, address = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:  # out of file descriptors or memory: wait, rather than spin on a ready socket
                        backoff = min(max(backoff * 2, ACCEPT_BACKOFF_MIN), ACCEPT_BACKOFF_MAX)
                        paused_until = time.monotonic() + backoff
                        selector.unregister(listener)
                        break
                    backoff = 0.0
                    if self.admission.admit(request, str(address[0])):
                        self._server.process_request(request, address)  # a thread of its own
                    else:
                        request.close()

    def stop(self) -> None:
        """Stops serving and closes the socket. Idempotent."""
        if self._wake_w.fileno() < 0:
            return
        self._wake_w.send(b"x")
        self._thread.join(timeout=10)
        self._server.server_close()
        self.admission.close_all()
        self._wake_w.close()
        self._wake_r.close()

    def file(self, path: str) -> tuple[bytes, str] | None:
        return self._files.get(path)


def page_id(token: str) -> str:
    """The id of a page with this token: its paths' prefix and its cookie's name (says nothing of the token)."""
    return hashlib.sha256(b"fray-dashboard-page\0" + token.encode()).hexdigest()[:24]


def _ip_literal(host: str, port: int) -> bool:
    """`host` is `IP:port` (or `[IPv6]:port`) with this server's port."""
    address, _, their_port = host.rpartition(":")
    if their_port != str(port):
        return False
    try:
        ipaddress.ip_address(address[1:-1] if address.startswith("[") and address.endswith("]") else address)
    except ValueError:
        return False
    return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: connections the kernel holds until they are accepted
    dashboard: Dashboard

    def process_request(self, request: Any, client_address: Any) -> None:
        """ThreadingMixIn's, with the thread named as fray's (a daemon, untracked: Dashboard.stop ends it by
        shutting its connection down)."""
        name = "fray-dashboard-request"
        args = (request, client_address)
        threading.Thread(target=self.process_request_thread, args=args, name=name, daemon=True).start()

    def shutdown_request(self, request: Any) -> None:
        self.dashboard.admission.release(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a peer that went away or was closed for idling: nothing on the job's (or the command's) stderr


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IO_TIMEOUT  # each read and write; the whole request is bounded by admission.PROVE_WITHIN
    server_version = "fray-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a page polls every second: nothing on the job's (or the command's) stderr

    # ----------------------------------------------------------------- responses
    def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8", **headers: str) -> None:
        self.send_response(status)
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, status: HTTPStatus) -> None:
        self._send(status, f"{status.value} {status.phrase}\n".encode())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.close_connection = True
        self._refuse(HTTPStatus(code))  # no HTML page, and the same headers as every answer

    # ----------------------------------------------------------------- requests
    def do_GET(self) -> None:
        dashboard = self.server.dashboard
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in dashboard.allowed_hosts and not (dashboard.any_address and _ip_literal(host, dashboard.port)):
            return self._refuse(HTTPStatus.FORBIDDEN)  # DNS rebinding: a name that is not this server's
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path in ("/", dashboard.prefix) and "token" in query:
            if not hmac.compare_digest(query["token"][0].encode(), dashboard.token.encode()):
                return self._refuse(HTTPStatus.FORBIDDEN)
            if not dashboard.admission.prove(self.request):
                return None  # closed meanwhile (it took too long)
            cookie = f"{dashboard.cookie}={dashboard._session}; HttpOnly; SameSite=Strict; Path={dashboard.prefix}"
            return self._send(HTTPStatus.SEE_OTHER, b"", Location=dashboard.prefix, Set_Cookie=cookie)
        if not url.path.startswith(dashboard.prefix):
            return self._refuse(HTTPStatus.UNAUTHORIZED)  # the cookie is not sent there: nothing is served
        path = url.path[len(dashboard.prefix) - 1 :]  # "/", "/api/state", "/static/app.js"
        session = self._session(dashboard.cookie)
        if session is None:
            return self._refuse(HTTPStatus.UNAUTHORIZED)
        if not hmac.compare_digest(session.encode(), dashboard._session.encode()):
            return self._refuse(HTTPStatus.FORBIDDEN)
        if not dashboard.admission.prove(self.request):
            return None
        if path != "/" and self.headers.get("Sec-Fetch-Site") in ("cross-site", "same-site"):
            return self._refuse(HTTPStatus.FORBIDDEN)  # the page asks its own origin only
        if path == "/api/state":
            return self._state(query)
        if path == "/api/timeline":
            return self._timeline()
        found = dashboard.file(path)
        if found is None:
            return self._refuse(HTTPStatus.NOT_FOUND)
        return self._send(HTTPStatus.OK, *found)

    def _session(self, name: str) -> str | None:
        header = self.headers.get("Cookie")
        if not header:
            return None
        try:
            morsel = SimpleCookie(header).get(name)
        except CookieError:
            return ""
        return None if morsel is None else morsel.value

    def _state(self, query: dict[str, list[str]]) -> None:
        try:
            since = max(0, int(query.get("since", ["0"])[0]))
        except ValueError:
            return self._refuse(HTTPStatus.BAD_REQUEST)
        try:
            answer = self.server.dashboard.source.state(since)
        except Exception:  # the context is shutting down, or its backend or cluster could not be read
            return self._refuse(HTTPStatus.SERVICE_UNAVAILABLE)
        body = json.dumps(answer, separators=(",", ":")).encode()
        self._send(HTTPStatus.OK, body, "application/json")

    def _timeline(self) -> None:
        directory = tempfile.mkdtemp(prefix="fray-dashboard-")  # mode 0700: private to this user
        try:
            try:
                path = self.server.dashboard.source.write_timeline(directory)
            except Exception:
                return self._refuse(HTTPStatus.SERVICE_UNAVAILABLE)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.send_response(HTTPStatus.OK)
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(os.path.getsize(path)))
            self.send_header("Content-Disposition", f'attachment; filename="fray-timeline-{stamp}.json"')
            self.end_headers()
            with open(path, "rb") as f:
                shutil.copyfileobj(f, self.wfile)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _not_allowed(self) -> None:
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed
