"""A cluster's live page in a real browser (tests/_browser.py: Debian's Chromium driven by Playwright) on a real
in_memory cluster: a job that succeeded, one that failed with exit code 3, one that runs with its own live page
(FRAY_DASHBOARD=1) and is then stopped. The page must show them with their states, the failure's exit code and
message, the running job's link to its page; its "Download timeline" must give a file that
fray.telemetry.timeline.validate accepts; the browser must log no error and ask nothing of any server but this one. A
screenshot lands in .tmp/dashboard-cluster.png."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import CHROMIUM, SCREENSHOTS, launched_chromium, page_address, watch
from _cluster_jobs import submit_jobs

from fray.in_memory.cluster import InMemoryClusterContext
from fray.telemetry import timeline

SHOWN_WITHIN_MS = 20_000
NONE = "\N{EN DASH}"  # what a cell without a value shows

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
    pytest.mark.timeout(180),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (fray-core[test])")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launched_chromium(sync_api)


class EngineCluster(InMemoryClusterContext):
    """The in_memory cluster as a backend whose engine has a page of its own (Ray's dashboard) would be."""

    def engine_links(self) -> dict[str, str]:
        return {"engine": "http://127.0.0.1:9/engine"}  # (a link: the browser does not follow it)


def test_the_cluster_page_shows_its_jobs(browser: Any, tmp_path: Path) -> None:
    expect = sync_api.expect
    cluster = EngineCluster(state_dir=str(tmp_path / "state"))
    try:
        jobs = submit_jobs(cluster, tmp_path)
        url = cluster.dashboard()
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        page = context.new_page()
        seen = watch(page, url)
        try:
            page.goto(url)
            assert page.url == page_address(url), "the token leaves the address bar, for the page's own path"
            expect(page.locator("#backend")).to_have_text("in_memory", timeout=SHOWN_WITHIN_MS)
            expect(page.locator("#links a")).to_have_attribute("href", "http://127.0.0.1:9/engine")
            expect(page.locator("#where")).to_contain_text(str(tmp_path / "state"))
            rows = page.locator("#jobs tbody tr")
            expect(rows).to_have_count(3, timeout=SHOWN_WITHIN_MS)
            expect(rows.nth(0)).to_have_attribute("data-job", jobs.running)  # newest first
            ok = page.locator(f'#jobs tbody tr[data-job="{jobs.succeeded}"]')
            expect(ok.locator(".state")).to_have_text("succeeded")
            expect(ok.locator("td.exit-code")).to_have_text("0")
            bad = page.locator(f'#jobs tbody tr[data-job="{jobs.failed}"]')
            expect(bad.locator(".state")).to_have_text("failed")
            expect(bad.locator("td.exit-code")).to_have_text("3")
            expect(bad.locator("td.message")).to_have_text("exited with code 3")
            running = page.locator(f'#jobs tbody tr[data-job="{jobs.running}"]')
            expect(running.locator(".state")).to_have_text("running")
            expect(running.locator("a.live-link")).to_have_attribute("href", jobs.running_url)
            expect(ok.locator("td.live")).to_have_text(NONE)
            expect(page.locator("#c-FAILED")).to_have_text("1")
            expect(page.locator("#c-RUNNING")).to_have_text("1")
            expect(page.locator("#chart svg rect.attempt")).to_have_count(3)
            expect(page.locator("#chart svg rect.attempt.st-FAILED")).to_have_count(1)
            expect(page.locator("#chart svg rect.attempt.open")).to_have_count(1)  # running: drawn to now
            expect(page.locator("#nodes tbody tr")).to_have_count(len(cluster.node_status()))
            expect(page.locator("#status")).to_have_class("status live")
            page.wait_for_timeout(300)  # one more render after the last poll's answer
            SCREENSHOTS.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "dashboard-cluster.png"), full_page=True)
            with page.expect_download() as download:
                page.click("#download")
            assert download.value.suggested_filename.startswith("fray-timeline-")
            trace = json.loads(Path(download.value.path()).read_text())
            assert timeline.validate(trace) == []
            assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("job,")) == 3
            cluster.stop_job(jobs.running)  # the page follows: stopped, and no link to a page that has gone
            expect(running.locator(".state")).to_have_text("stopped", timeout=SHOWN_WITHIN_MS)
            expect(running.locator("td.live")).to_have_text(NONE)
            expect(page.locator("#c-STOPPED")).to_have_text("1")
        finally:
            context.close()
        assert seen.problems == []
        assert seen.elsewhere == []
    finally:
        cluster.shutdown()
