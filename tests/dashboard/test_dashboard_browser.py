"""The live page in a real browser: Debian's Chromium (apt, `make system-packages`) driven by Playwright, against a
real workload on each backend. Playwright never downloads a browser here: it launches /usr/bin/chromium
(tests/_browser.py).

The workload (issue 31): 20 tasks, an actor with a few calls, one task that raises ValueError, a 1 MiB numpy
put/get, an actor killed with ctx.kill; on ray and monarch also an actor restart (max_restarts=1, a call that
exits its process). The page must show the counts, the failure with its type, the transfer bytes and the death
reason; its "Download timeline" must give a file that fray.telemetry.timeline.validate accepts; the browser must log no
error and ask nothing of any server but this one. A screenshot of each page lands in .tmp/dashboard-BACKEND.png.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import CHROMIUM, SCREENSHOTS, launched_chromium, page_address, watch

import fray
from fray import ActorOptions
from fray.context import JobContext
from fray.telemetry import timeline
from fray.testing import workloads as h

TASKS = 20
MIB = 1 << 20
SHOWN_WITHIN_MS = 20_000

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
    pytest.mark.timeout(180),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (fray-core[test])")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launched_chromium(sync_api)


def _context(backend: str) -> JobContext:
    if backend == "ray":
        pytest.importorskip("fray_ray", reason="fray-ray is not installed")
        from fray_ray import RayBackend

        return fray.init(RayBackend.test_spec)
    if backend == "monarch":
        pytest.importorskip("fray_monarch", reason="fray-monarch is not installed")
        return fray.init("monarch?procs=2&cpus=4")
    return fray.init("in_memory?cpus=4")


def _workload(ctx: JobContext, backend: str) -> dict[str, Any]:
    """Runs the issue's workload; returns what the page must then show."""
    assert ctx.get([ctx.create_task(h.sleep_then, args=(0.05, i)) for i in range(TASKS)], timeout=120) == list(
        range(TASKS)
    )
    counter = ctx.create_actor(h.Counter)
    assert ctx.get([counter.incr() for _ in range(3)], timeout=60) == [1, 2, 3]
    with pytest.raises(ValueError, match="on purpose"):
        ctx.get(ctx.create_task(h.raise_value_error, args=("on purpose",)), timeout=60)
    np = pytest.importorskip("numpy")
    value = np.arange(MIB, dtype=np.uint8)
    assert ctx.get(ctx.put(value), timeout=60).nbytes == MIB
    ctx.kill(counter)
    # A process that dies takes its transfer counters with it (transfer_stats reads the live ones), while the
    # events it pushed before stay: where one dies, the page shows at least what was counted before.
    before_crash = {path: s.bytes for path, s in ctx.transfer_stats().items()}
    phoenix = None
    if backend != "in_memory":  # a process that dies in a call, and comes back
        phoenix = ctx.create_actor(h.Counter, options=ActorOptions(max_restarts=1))
        assert ctx.get(phoenix.incr(), timeout=60) == 1
        with pytest.raises(Exception):  # noqa: B017 (each backend names the death in its own way)
            ctx.get(phoenix.crash(), timeout=120)
        assert ctx.get(phoenix.incr(), timeout=120) == 1  # a fresh instance
    # (the restarted actor's handle is kept while the page is checked: dropped, Ray ends the actor, and the page,
    # reading its death, would rightly show it dead)
    if backend == "monarch":  # (the actor that crashes shares a worker process with tasks)
        return {"transfers": before_crash, "exact": False, "keep": phoenix}
    return {"transfers": {path: s.bytes for path, s in ctx.transfer_stats().items()}, "exact": True, "keep": phoenix}


@pytest.mark.parametrize("backend", ["in_memory", "ray", "monarch"])
def test_the_page_shows_a_real_workload(browser: Any, backend: str) -> None:
    ctx = _context(backend)
    try:
        url = ctx.dashboard()
        expected = _workload(ctx, backend)
        _check_page(browser, url, backend, expected)
    finally:
        ctx.shutdown()


def _check_page(browser: Any, url: str, backend: str, expected: dict[str, Any]) -> None:
    expect = sync_api.expect
    page_context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = page_context.new_page()
    seen = watch(page, url)
    try:
        page.goto(url)
        assert page.url == page_address(url), "the token leaves the address bar, for the page's own path"
        expect(page.locator("#backend")).to_have_text(backend, timeout=SHOWN_WITHIN_MS)
        if backend == "monarch":  # (why no link to Monarch's own dashboard)
            expect(page.locator("#engine-note")).to_contain_text("Monarch's own dashboard is not started")
        elif backend == "in_memory":  # (it records nothing unless asked: the page turned recording on, and says so)
            expect(page.locator("#engine-note")).to_contain_text("Events are recorded from when this page opened")
        else:
            expect(page.locator("#engine-note")).to_be_hidden()
        rows = page.locator("#functions tbody tr")
        expect(rows.filter(has_text="sleep_then").locator("td.done")).to_have_text(str(TASKS), timeout=SHOWN_WITHIN_MS)
        failing = rows.filter(has_text="raise_value_error")
        expect(failing.locator("td.failed")).to_have_text("1")
        expect(page.locator("#errors tbody tr").filter(has_text="raise_value_error")).to_contain_text("ValueError")
        # the bytes by path, as ctx.transfer_stats() counts them; the 1 MiB put/get among them
        for path, nbytes in expected["transfers"].items():
            cell = page.locator(f'#transfers tbody tr[data-path="{path}"] td.bytes')
            if expected["exact"]:
                expect(cell).to_have_attribute("data-bytes", str(nbytes), timeout=SHOWN_WITHIN_MS)
            else:
                expect(cell).to_have_count(1, timeout=SHOWN_WITHIN_MS)
                assert int(cell.get_attribute("data-bytes") or 0) >= nbytes, path
        assert sum(expected["transfers"].values()) >= MIB
        dead = page.locator("#actors tbody tr").filter(has=page.locator(".state.dead"))
        expect(dead.first.locator("td.reason")).not_to_have_text("", timeout=SHOWN_WITHIN_MS)
        if backend != "in_memory":
            alive = page.locator("#actors tbody tr").filter(has=page.locator(".state.alive"))
            restarted = alive.locator("td.restarts")
            expect(restarted.filter(has_text="1")).to_have_count(1, timeout=SHOWN_WITHIN_MS)
        failed_spans = page.locator("#stream svg rect.span.failed")
        if backend == "in_memory":
            expect(failed_spans).to_have_count(1)
        else:  # (and the call that crashed its process, where the backend saw it end: monarch does)
            expect(failed_spans.first).to_be_attached()
        expect(page.locator("#status")).to_have_class("status live")
        page.wait_for_timeout(300)  # one more render after the last poll's answer
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"dashboard-{backend}.png"), full_page=True)
        with page.expect_download() as download:
            page.click("#download")
        trace = json.loads(Path(download.value.path()).read_text())
        assert download.value.suggested_filename.startswith("fray-timeline-")
        exact = expected["transfers"] if expected["exact"] else None
        assert timeline.validate(trace, tasks=TASKS + 1, transfers=exact) == []
        drawn: dict[str, int] = {}
        for event in trace["traceEvents"]:
            if event.get("cat") == "transfer":
                drawn[event["name"]] = drawn.get(event["name"], 0) + event["args"]["bytes"]
        assert all(drawn.get(path, 0) >= nbytes for path, nbytes in expected["transfers"].items()), drawn
    finally:
        page_context.close()
    assert seen.problems == []
    assert seen.elsewhere == []
