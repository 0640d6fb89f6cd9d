"""Browser test of the data-quality report: a real `streamdi run` (subprocess, own STREAMDI_HOME) stages the bundled
sample plus DailyMarket rows that fail quarantine checks, and a Batch2 whose BatchDate fails its halt check; then
`streamdi quality report`, and headless Chromium opens the page (file://), finds the halted batch and the failing
expectation in the rendered DOM, and follows a cell's link into the Great Expectations Data Docs.

Chromium is driven through the DevTools protocol, as in tests/dags/test_airflow_ui.py. The screenshot is kept as
`test-artifacts/quality_report.png` (`quality_report_failure.png` when the test fails).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from test_cli_run import cli, home  # noqa: F401 - `home` is a fixture (own STREAMDI_HOME, server stopped after)

from streamdi.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# DailyMarket.txt of Batch1: DM_DATE|DM_S_SYMB|DM_CLOSE|DM_HIGH|DM_LOW|DM_VOL. The second line's high is below its
# low and the third line's low is negative: both fail quarantine checks of expectations/staging/dailymarket.yml.
DAILY_MARKET = [
    "2017-07-03|AAAA|10.00|12.00|9.00|1000",
    "2017-07-03|BBBB|10.00|9.00|11.00|500",
    "2017-07-03|CCCC|10.00|12.00|-1.00|700",
]
BAD_BATCH_DATE = "1900-01-01"  # outside 1950..2100: the halt check date_is_plausible fails


def wait_for(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last = exc
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last!r})")


class Chromium:
    """A headless Chromium page driven through the DevTools protocol (Debian package `chromium`)."""

    def __init__(self, profile: Path) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "Debian's chromium package is needed (bootstrap.py test installs it)"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--allow-file-access-from-files",
                f"--user-data-dir={profile}",
                f"--remote-debugging-port={port}",
                "--window-size=1400,1000",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        pages = wait_for(
            "chromium's DevTools endpoint",
            lambda: [t for t in httpx.get(f"http://127.0.0.1:{port}/json").json() if t["type"] == "page"],
            60,
        )
        from websockets.sync.client import connect

        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.ids = itertools.count(1)
        self.call("Page.enable")

    def call(self, method: str, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_loaded(url)

    def wait_loaded(self, url_part: str) -> None:
        wait_for(
            f"{url_part} to load",
            lambda: url_part in self.eval("location.href") and self.eval("document.readyState") == "complete",
            60,
        )

    def text(self, selector: str = "body") -> str:
        return self.eval(f"(document.querySelector({json.dumps(selector)}) || {{innerText: ''}}).innerText") or ""

    def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        params: dict = {"format": "png"}
        if full_page:
            height = self.eval("document.documentElement.scrollHeight")
            params |= {
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1},
            }
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)


def test_the_report_shows_a_halted_batch_and_a_failing_expectation_in_a_browser(home: Path, tmp_path: Path):  # noqa: F811
    landing = Settings(home=home).landing_dir
    (landing / "Batch1").mkdir(parents=True)
    (landing / "Batch1" / "DailyMarket.txt").write_bytes("".join(f"{line}\r\n" for line in DAILY_MARKET).encode())
    (landing / "Batch2").mkdir()
    (landing / "Batch2" / "BatchDate.txt").write_bytes(f"{BAD_BATCH_DATE}\r\n".encode())

    ran = cli(home, "run", "--sample")  # micro-batch 1 = Batch1 (sample + DailyMarket), micro-batch 2 = Batch2

    assert ran.returncode == 3, ran.stdout + ran.stderr  # halted
    assert "batch 1 migrate   done in" in ran.stdout
    assert "micro-batch 2 is HALTED" in " ".join(ran.stderr.split())

    report = cli(home, "quality", "report")

    assert report.returncode == 0, report.stdout + report.stderr
    index = home / "reports" / "quality" / "index.html"
    assert f"quality report: {index}" in report.stdout
    assert "HALTED: micro-batch 2" in report.stdout and "2 row(s) in quarantine" in report.stdout

    browser = Chromium(tmp_path / "chromium")
    try:
        browser.goto(index.as_uri())
        halted = " ".join(browser.text("#halted-2").split())
        assert halted.startswith("Micro-batch 2 is HALTED (its stage step")
        assert "staging.batchdate · date_is_plausible" in halted
        assert "streamdi batch resume 2" in halted and "streamdi batch skip 2 --reason TEXT" in halted
        cell = "#grid tr[data-batch='{}'] td[data-table='{}']"
        assert (
            browser.eval(f"document.querySelector({json.dumps(cell.format(2, 'staging.batchdate'))}).className")
            == "halted"
        )
        market = cell.format(1, "staging.dailymarket")
        assert browser.eval(f"document.querySelector({json.dumps(market)}).className") == "quarantined"
        failing = " ".join(browser.text(f"{market} li[data-check='high_not_below_low']").split())
        assert failing == (
            "high_not_below_low quarantined: 1 of 3 rows "
            "expect_column_pair_values_a_to_be_greater_than_b(dm_high, dm_low) quarantine"
        )
        assert "prices_not_negative quarantined: 1 of 3 rows" in browser.text(market)
        assert "staging.dailymarket 2 1" in " ".join(browser.text("#quarantine").split())
        assert browser.eval("document.querySelectorAll('#trend svg rect').length") == 4  # 2 batches x 2 panels
        browser.screenshot(ARTIFACTS / "quality_report.png", full_page=True)
        assert (ARTIFACTS / "quality_report.png").stat().st_size > 20_000

        # follow the cell's link into the Great Expectations Data Docs page of that table and micro-batch
        href = browser.eval(f"document.querySelector({json.dumps(market + ' a.status')}).href")
        assert "/data_docs/validations/staging/dailymarket/batch-1/" in href
        browser.eval(f"document.querySelector({json.dumps(market + ' a.status')}).click()")
        browser.wait_loaded("/data_docs/validations/staging/dailymarket/batch-1/")
        page = browser.text()
        assert "Validations / staging.dailymarket / batch-1" in page
        assert "Status: Failed" in " ".join(page.split())
        assert "dm_low" in page and "dm_high" in page
        browser.screenshot(ARTIFACTS / "quality_report_data_docs.png")
    except BaseException:
        browser.screenshot(ARTIFACTS / "quality_report_failure.png")
        raise
    finally:
        browser.close()
