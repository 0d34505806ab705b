"""The live pages' protections, asked of real in_memory servers with http.client (docs/security.md), a job's page
(`ctx.dashboard()`) and a cluster's (`cluster.dashboard()`) alike: a token exchanged for an HttpOnly SameSite=Strict
cookie, 401 without it and 403 with a wrong one (and no data either way), a Host header that is not this server's
refused (DNS rebinding), no CORS, a strict CSP."""

from __future__ import annotations

import http.client
import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

import fray
from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.dashboard.server import page_id
from fray.in_memory.cluster import InMemoryClusterContext
from fray.telemetry import timeline
from fray.testing import workloads as h

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
PATHS = ["/", "/api/state?since=0", "/api/timeline", "/static/common.js", "/static/app.css"]
SCRIPTS = {"job": "/static/app.js", "cluster": "/static/cluster.js"}


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


@dataclass
class Page:
    kind: str  # "job" | "cluster"
    ctx: JobContext | ClusterContext
    url: str
    port: int
    token: str
    cookie: str  # "name=value", as the browser sends it back
    prefix: str = "/"  # the page's own path, where the token's redirect leads: every path below is under it

    def get(self, path: str, cookie: str | None = None, host: str | None = None, method: str = "GET") -> Answer:
        """`path` as the page sees it ("/api/state"), under the page's prefix; "/?token=..." and a path that
        begins with "//" ("//api/state": the server's root) as they are."""
        if path.startswith("//"):
            path = path[1:]
        elif not path.startswith("/?token="):
            path = self.prefix + path[1:]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True)
            conn.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
            if cookie:
                conn.putheader("Cookie", cookie)
            conn.putheader("Origin", "http://evil.example")
            conn.endheaders()
            response = conn.getresponse()
            return Answer(response.status, response.headers, response.read())
        finally:
            conn.close()


def _signed_in(kind: str, ctx: JobContext | ClusterContext) -> Page:
    url = ctx.dashboard()
    where = urlsplit(url)
    assert where.port is not None
    token = parse_qs(where.query)["token"][0]
    first = Page(kind, ctx, url, where.port, token, "").get(f"/?token={token}")
    set_cookie = first.headers["Set-Cookie"]
    return Page(kind, ctx, url, where.port, token, set_cookie.split(";")[0], first.headers["Location"])


@pytest.fixture(scope="module")
def job_page() -> Iterator[Page]:
    ctx = fray.init("in_memory?cpus=2&events=on")
    try:
        assert ctx.get([ctx.create_task(h.add, args=(i, i)) for i in range(5)], timeout=30) == [0, 2, 4, 6, 8]
        yield _signed_in("job", ctx)
    finally:
        ctx.shutdown()


@pytest.fixture(scope="module")
def cluster_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    cluster = InMemoryClusterContext(state_dir=str(tmp_path_factory.mktemp("state")))
    try:
        job = cluster.create_job([sys.executable, "-c", "print('hello')"], working_dir=Path.cwd())
        assert cluster.wait_job(job, timeout=60).status == "SUCCEEDED"
        yield _signed_in("cluster", cluster)
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module", params=["job", "cluster"])
def page(request: pytest.FixtureRequest) -> Page:
    """Each test that takes it runs against both pages: one implementation of the protections serves both."""
    found: Page = request.getfixturevalue(f"{request.param}_page")
    return found


def _no_data(answer: Answer) -> None:
    assert len(answer.body) < 40, answer.body  # a status line's words, nothing of the job
    assert b"{" not in answer.body and b"<" not in answer.body


def test_the_url_is_loopback_with_a_long_random_token_and_the_same_each_call(page: Page) -> None:
    where = urlsplit(page.url)
    assert (where.scheme, where.hostname, where.path) == ("http", "127.0.0.1", "/")
    assert len(page.token) >= 43  # secrets.token_urlsafe(32)
    assert page.ctx.dashboard() == page.url
    # bound to loopback only: the machine's other addresses do not answer
    with socket.create_connection(("127.0.0.1", page.port), timeout=5):
        pass
    server = page.ctx._dashboard
    assert server is not None and server._server.server_address[0] == "127.0.0.1"
    assert page.get(SCRIPTS[page.kind], cookie=page.cookie).status == 200


def test_the_token_is_exchanged_for_a_strict_httponly_cookie_and_a_redirect_without_it(page: Page) -> None:
    answer = page.get(f"/?token={page.token}")
    assert answer.status == 303
    assert answer.headers["Location"] == page.prefix == f"/{page_id(page.token)}/"
    flags = [part.strip() for part in answer.headers["Set-Cookie"].split(";")]
    name, _, value = flags[0].partition("=")
    assert name == f"fray_{page_id(page.token)}"
    assert value and value != page.token  # the cookie is a session secret of its own
    assert set(flags[1:]) == {"HttpOnly", "SameSite=Strict", f"Path={page.prefix}"}
    _no_data(answer)


def test_the_cookie_is_named_and_scoped_by_the_page_and_serves_nothing_outside_it(job_page: Page) -> None:
    """Browsers send a host's cookies to every port of it: a cookie named for the port and scoped to `/` reached
    every other service on localhost (and one of them could read it). Named and scoped by an id derived from the
    token, it is sent to this page's paths only, and nothing is served outside them."""
    page = job_page
    assert len(page_id(page.token)) >= 24 and page.token not in page.prefix
    assert page.cookie.partition("=")[0] not in (f"fray_dashboard_{page.port}", "fray_dashboard")
    for path in ("//api/state?since=0", "//", "//static/app.js"):
        answer = page.get(path, cookie=page.cookie)
        assert answer.status == 401, path
        _no_data(answer)
    assert page.get("/api/state?since=0", cookie=page.cookie).status == 200
    ctx = fray.init("in_memory")
    try:
        other = _signed_in("job", ctx)
        assert other.prefix != page.prefix and other.cookie.partition("=")[0] != page.cookie.partition("=")[0]
    finally:
        ctx.shutdown()


@pytest.mark.parametrize("path", [*PATHS, "script"])
def test_without_the_cookie_every_path_is_401_with_no_data(page: Page, path: str) -> None:
    answer = page.get(SCRIPTS[page.kind] if path == "script" else path)
    assert answer.status == 401
    assert "Set-Cookie" not in answer.headers
    _no_data(answer)


@pytest.mark.parametrize("path", [*PATHS, "script"])
def test_a_wrong_cookie_is_403_with_no_data(page: Page, path: str) -> None:
    name = page.cookie.partition("=")[0]
    answer = page.get(SCRIPTS[page.kind] if path == "script" else path, cookie=f"{name}=not-the-session")
    assert answer.status == 403
    _no_data(answer)


def test_a_wrong_token_is_403_and_sets_no_cookie(page: Page) -> None:
    answer = page.get("/?token=" + "x" * len(page.token))
    assert answer.status == 403
    assert "Set-Cookie" not in answer.headers
    _no_data(answer)
    assert page.get(f"/api/state?token={page.token}").status == 401  # a token is taken on / only


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1", "127.0.0.1:1", "localhost.evil.example:{port}", ""]
)
def test_a_host_header_that_is_not_this_server_is_403_even_with_the_cookie(page: Page, host: str) -> None:
    answer = page.get("/api/state?since=0", cookie=page.cookie, host=host.format(port=page.port))
    assert answer.status == 403
    _no_data(answer)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
def test_loopback_names_of_this_server_are_served(page: Page, host: str) -> None:
    assert page.get("/api/state?since=0", cookie=page.cookie, host=host.format(port=page.port)).status == 200


def test_with_the_cookie_the_page_and_the_api_answer_with_strict_headers_and_no_cors(page: Page) -> None:
    for path in [*PATHS, SCRIPTS[page.kind]]:
        answer = page.get(path, cookie=page.cookie)
        assert answer.status == 200, path
        headers = answer.headers
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["Cache-Control"] == "no-store"
        assert not [k for k in headers if k.lower().startswith("access-control-")], path
    html = page.get("/", cookie=page.cookie).body.decode()
    assert "<script>" not in html and "<style" not in html and " style=" not in html  # nothing inline
    state = json.loads(page.get("/api/state?since=0", cookie=page.cookie).body)
    assert state["backend"] == "in_memory"
    assert state["links"] == {} and state["note"] == ""  # (in_memory is its own engine: no page of its own)
    if page.kind == "job":
        assert [f[1] for f in state["functions"]] == ["add"] and state["functions"][0][5] == 5  # done
    else:
        assert [(j["state"], j["exit_code"]) for j in state["jobs"]] == [("SUCCEEDED", 0)]
    other = SCRIPTS["cluster" if page.kind == "job" else "job"]
    assert page.get(other, cookie=page.cookie).status == 404  # each page serves its own script only


def test_refusals_carry_the_same_headers_and_no_cors(page: Page) -> None:
    for answer in (page.get("/api/state"), page.get("/", host="evil.example"), page.get("/nope", cookie=page.cookie)):
        assert answer.headers["Content-Security-Policy"] == CSP
        assert not [k for k in answer.headers if k.lower().startswith("access-control-")]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "HEAD", "BREW"])
def test_other_methods_are_refused_without_cors(page: Page, method: str) -> None:
    answer = page.get("/api/state", cookie=page.cookie, method=method)
    assert answer.status in (405, 501)
    assert not [k for k in answer.headers if k.lower().startswith("access-control-")]
    assert answer.headers["Content-Security-Policy"] == CSP


def test_a_poll_sends_only_what_changed(job_page: Page) -> None:
    page, ctx = job_page, job_page.ctx
    assert isinstance(ctx, JobContext)
    first = json.loads(page.get("/api/state?since=0", cookie=page.cookie).body)
    again = json.loads(page.get(f"/api/state?since={first['cursor']}", cookie=page.cookie).body)
    assert again["cursor"] == first["cursor"] and not again["full"]
    assert again["functions"] == again["spans"] == again["errors"] == [] and again["processes"] is None
    assert again["totals"] == first["totals"]  # totals come with every answer
    ctx.get(ctx.create_task(h.add, args=(1, 2)), timeout=30)
    ctx._dashboard.source._read_at = 0.0  # (reads at most every 0.25 s)
    later = json.loads(page.get(f"/api/state?since={first['cursor']}", cookie=page.cookie).body)
    assert [f[1] for f in later["functions"]] == ["add"] and len(later["spans"]) == 1
    assert later["totals"]["done"] == first["totals"]["done"] + 1
    assert page.get("/api/state?since=x", cookie=page.cookie).status == 400


def test_the_timeline_download_is_an_attachment_that_validates(page: Page) -> None:
    answer = page.get("/api/timeline", cookie=page.cookie)
    assert answer.status == 200
    assert answer.headers["Content-Disposition"].startswith('attachment; filename="fray-timeline-')
    trace = json.loads(answer.body)
    assert timeline.validate(trace) == []
    if page.kind == "cluster":  # the jobs' timeline: the job's one attempt
        assert [(e["cat"], e["args"]["exit_code"]) for e in trace["traceEvents"] if e["ph"] == "X"] == [
            ("job,SUCCEEDED", 0)
        ]


def test_the_server_stops_with_the_context() -> None:
    ctx = fray.init("in_memory")
    url = ctx.dashboard()
    port = urlsplit(url).port
    assert port is not None
    ctx.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(fray.FrayError):
        ctx.dashboard()


def test_the_cluster_pages_server_stops_with_the_cluster_context(tmp_path: Path) -> None:
    cluster = InMemoryClusterContext(state_dir=str(tmp_path / "state"))
    url = cluster.dashboard()
    assert cluster.dashboard() == url  # one server per context
    port = urlsplit(url).port
    assert port is not None
    cluster.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(fray.FrayError):
        cluster.dashboard()


def test_bound_to_every_interface_it_takes_ip_literals_and_its_name_but_still_no_other_name() -> None:
    ctx = fray.init("in_memory")
    try:
        url = ctx.dashboard(host="0.0.0.0")
        where = urlsplit(url)
        assert where.hostname == socket.gethostname().lower() and where.port is not None
        token = parse_qs(where.query)["token"][0]
        page = Page("job", ctx, url, where.port, token, "")
        for host in ("10.1.2.3:{port}", "[fe80::1]:{port}", f"{socket.gethostname()}:{{port}}"):
            assert page.get(f"/?token={token}", host=host.format(port=where.port)).status == 303, host
        for host in ("evil.example:{port}", "10.1.2.3:1", "10.1.2.3"):
            assert page.get(f"/?token={token}", host=host.format(port=where.port)).status == 403, host
    finally:
        ctx.shutdown()
