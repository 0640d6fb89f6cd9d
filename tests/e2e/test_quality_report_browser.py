"""Browser test of the data-quality report: a real `streamdi run` (subprocess, own STREAMDI_HOME) stages the bundled
sample plus DailyMarket rows that fail quarantine checks, and a Batch2 whose BatchDate fails its halt check; then
`streamdi quality report`, and headless Chromium opens the page (file://), finds the halted batch and the failing
expectation in the rendered DOM, and follows a cell's link into the Great Expectations Data Docs.

Chromium is driven through the DevTools protocol (tests/chromium.py, shared with tests/dags/test_airflow_ui.py).
The screenshot is kept as `test-artifacts/quality_report.png` (`quality_report_failure.png` when the test fails).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chromium import Chromium, wait_for
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
        browser.goto(index.as_uri(), until_url=index.as_uri())
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

        # The Data Docs work offline: with every http(s) request blocked, their scripts and styles are the local
        # copies (jQuery and bootstrap-table run, the index page lists the validations).
        browser.call("Network.enable")
        browser.call("Network.setBlockedURLs", urls=["http://*", "https://*"])
        docs_index = home / "reports" / "quality" / "data_docs" / "index.html"
        browser.goto(docs_index.as_uri(), until_url="data_docs/index.html")
        assert browser.eval("typeof jQuery") == "function"
        assert browser.eval("typeof jQuery.fn.bootstrapTable") == "function"
        rows = "document.querySelectorAll('table tbody tr').length"
        wait_for("the Data Docs index to list the validations", lambda: browser.eval(rows) > 0, 30, 1)
        assert "staging.dailymarket" in browser.text()
        sheets = "[...document.querySelectorAll('link[rel=stylesheet]')].map(l => l.href)"
        assert all(href.startswith("file://") for href in browser.eval(sheets))
        browser.screenshot(ARTIFACTS / "quality_report_data_docs_offline.png")
    except BaseException:
        browser.screenshot(ARTIFACTS / "quality_report_failure.png")
        raise
    finally:
        browser.close()
