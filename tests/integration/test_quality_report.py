"""The data-quality report (`streamdi.report`): the summary page rendered from hand-made `quality.results`
rows (exact cells, the halted batch with its commands, the failing checks and counts), and the whole report
written from a real Delta lake and batch log, with Great Expectations Data Docs built for every (micro-batch,
attempt, table) and every link of the summary resolving to a file."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest

from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi import report as qr
from streamdi.batchlog import BatchLog, LandedFile
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

NOW = dt.datetime(2024, 7, 1, 9, 0, tzinfo=dt.UTC)
GENERATED = dt.datetime(2024, 7, 2, 12, 0, tzinfo=dt.UTC)
TAXRATE_REASON = "staging.taxrate: check rate_is_a_fraction (expect_column_values_to_be_between) failed on 1 of 8 rows"


def result(batch_id: int, table: str, check_id: str, action: str = "passed", **fields) -> dict:
    """A `quality.results` row; a failed check gets 3 of 100 failing rows unless told otherwise."""
    policy = fields.pop("policy", {"warned": "warn", "quarantined": "quarantine"}.get(action, "halt"))
    failed = action != "passed"
    kwargs = fields.pop("kwargs", {"column": "t_tt_id", "value_set": ["TMB", "TMS"]})
    row = {
        "batch_id": batch_id,
        "attempt": fields.pop("attempt", 0),
        "table_name": table,
        "check_id": check_id,
        "expectation": fields.pop("expectation", "expect_column_values_to_be_in_set"),
        "column_name": kwargs.get("column"),
        "policy": policy if failed or "policy" in fields else "warn",
        "action": action,
        "success": not failed,
        "element_count": fields.pop("element_count", 100),
        "unexpected_count": fields.pop("unexpected_count", 3 if failed else 0),
        "detail": json.dumps({"kwargs": kwargs, **({"failing_values": ["XXX", "YYY", "XXX"]} if failed else {})}),
    }
    row.update(fields)
    return row


RATE = {"column": "tx_rate", "min_value": 0, "max_value": 1}
ROWS = [
    # micro-batch 1: everything passes, a warehouse table warns
    result(1, "staging.trade", "type_is_a_trade_type"),
    result(1, "staging.taxrate", "rate_is_a_fraction", expectation="expect_column_values_to_be_between", kwargs=RATE),
    result(1, "warehouse.dimtrade", "one_row_per_trade", "warned", expectation="expect_column_values_to_be_unique",
           kwargs={"column": "tradeid"}, element_count=50, unexpected_count=2),
    # micro-batch 2: trade rows quarantined, and the tax rates halt the batch
    result(2, "staging.trade", "quantity_is_positive", expectation="expect_column_values_to_be_between",
           kwargs={"column": "t_qty", "min_value": 1}),
    result(2, "staging.trade", "type_is_a_trade_type", "quarantined"),
    result(2, "staging.taxrate", "rate_is_a_fraction", "halted", expectation="expect_column_values_to_be_between",
           kwargs=RATE, element_count=8, unexpected_count=1),
    # micro-batch 3: halted on attempt 0, resumed: attempt 1 overrides the halt check
    result(3, "staging.taxrate", "rate_is_a_fraction", "halted", expectation="expect_column_values_to_be_between",
           kwargs=RATE, element_count=8, unexpected_count=1),
    result(3, "staging.taxrate", "rate_is_a_fraction", "overridden", attempt=1, policy="halt",
           expectation="expect_column_values_to_be_between", kwargs=RATE, element_count=8, unexpected_count=1),
]  # fmt: skip
WHY = {("staging.trade", "type_is_a_trade_type"): "T_TT_ID references TradeType"}


def hand_made() -> qr.QualityData:
    return qr.QualityData(
        results=tuple(qr.CheckResult.from_row(r) for r in ROWS),
        batches=(
            qr.BatchState(1, (1,), NOW, (("stage", "done"), ("transform", "done"), ("migrate", "done"))),
            qr.BatchState(
                2, (2,), NOW, (("stage", "halted"), ("transform", "pending"), ("migrate", "pending")),
                halted_stage="stage", halt_reason=TAXRATE_REASON, halted_at=NOW,
            ),
            qr.BatchState(3, (2,), NOW, (("stage", "done"), ("transform", "done"), ("migrate", "done")), resumed=True),
            qr.BatchState(4, (3,), NOW, (("stage", "skipped"), ("transform", "skipped"), ("migrate", "skipped")),
                          skip_reason="resent tomorrow"),
        ),
        quarantined=(("staging.trade", 2, 3),),
        why=WHY,
        lake_root="/lake",
    )  # fmt: skip


BLOCKS = {"div", "li", "br", "ul", "p", "td", "th", "tr", "h1", "h2", "pre", "table", "svg", "text", "title"}


class Page(HTMLParser):
    """What a reader of the summary sees: grid cells by (micro-batch, table), links, and elements by id (block
    elements separate words, as a browser shows them)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.cells: dict[tuple[int, str], dict] = {}
        self.links: list[str] = []
        self.ids: dict[str, list[str]] = {}  # id -> text inside it
        self._batch: int | None = None
        self._cell: dict | None = None
        self._open: list[tuple[str, str | None]] = []  # (tag, id)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag in BLOCKS:
            self.handle_data(" ")
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
            if self._cell is not None:
                self._cell["links"].append(a["href"])
        if tag == "tr" and "data-batch" in a:
            self._batch = int(a["data-batch"])
        if tag == "td" and "data-table" in a and self._batch is not None:
            self._cell = {"class": a.get("class"), "text": "", "links": []}
            self.cells[(self._batch, a["data-table"])] = self._cell
        if tag not in ("br", "meta", "input"):
            self._open.append((tag, a.get("id")))
            if a.get("id"):
                self.ids[a["id"]] = []

    def handle_endtag(self, tag):
        if tag in BLOCKS:
            self.handle_data(" ")
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break
        if tag == "td":
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data
        for _, i in self._open:
            if i:
                self.ids[i].append(data)

    def text_of(self, element_id: str) -> str:
        return " ".join("".join(self.ids[element_id]).split())


def test_the_summary_shows_each_cell_the_halted_batch_and_the_failing_checks():
    data = hand_made()
    pages = {
        (b, a, t): f"data_docs/{t}/{b}/{a}.html"
        for b, a, t in {(r.batch_id, r.attempt, r.table_name) for r in data.results}
    }
    page = Page(qr.render_summary(data, pages, GENERATED))

    assert {key: cell["class"] for key, cell in page.cells.items()} == {
        (1, "staging.taxrate"): "passed",
        (1, "staging.trade"): "passed",
        (1, "warehouse.dimtrade"): "warned",
        (2, "staging.taxrate"): "halted",
        (2, "staging.trade"): "quarantined",
        (2, "warehouse.dimtrade"): "none",
        (3, "staging.taxrate"): "overridden",
        (3, "staging.trade"): "none",
        (3, "warehouse.dimtrade"): "none",
        (4, "staging.taxrate"): "none",
        (4, "staging.trade"): "none",
        (4, "warehouse.dimtrade"): "none",
    }
    # each validated cell links to its table's Data Docs page (latest attempt; the earlier one as well)
    assert page.cells[(2, "staging.trade")]["links"] == ["data_docs/staging.trade/2/0.html"]
    assert page.cells[(3, "staging.taxrate")]["links"] == [
        "data_docs/staging.taxrate/3/1.html",
        "data_docs/staging.taxrate/3/0.html",
    ]
    quarantined = " ".join(page.cells[(2, "staging.trade")]["text"].split())
    assert quarantined == (
        "quarantined 2 check(s) type_is_a_trade_type quarantined: 3 of 100 rows "
        "expect_column_values_to_be_in_set(t_tt_id) quarantine: T_TT_ID references TradeType"
    )
    overridden = " ".join(page.cells[(3, "staging.taxrate")]["text"].split())
    assert overridden.startswith("overridden 1 check(s), attempt 1 rate_is_a_fraction overridden: 1 of 8 rows")
    assert overridden.endswith("earlier: attempt 0: HALTED")
    assert " ".join(page.cells[(1, "warehouse.dimtrade")]["text"].split()) == (
        "warn 1 check(s) one_row_per_trade warn: 2 of 50 rows expect_column_values_to_be_unique(tradeid) warn"
    )

    halted = page.text_of("halted-2")
    assert halted.startswith("Micro-batch 2 is HALTED (its stage step at 2024-07-01 09:00:00 UTC)")
    assert f"Reason: {TAXRATE_REASON}" in halted
    assert (
        "staging.taxrate · rate_is_a_fraction: expect_column_values_to_be_between(tx_rate) failed on 1 of 8 rows"
        in halted
    )
    assert halted.endswith(
        "After checking the data: streamdi batch resume 2: let it go on: its halting checks then only warn for this "
        "batch (action overridden) streamdi batch skip 2 --reason TEXT: drop it: its staged rows stay for "
        "inspection but never reach the warehouse; later batches go on"
    )
    assert set(page.ids) >= {"halted-2", "grid", "trend", "quarantine", "summary"}
    assert "halted-3" not in page.ids  # resumed: no longer halted
    assert page.text_of("batch-4") == "micro-batch 4 TPC-DI batch 3 skipped reason: resent tomorrow"
    assert page.text_of("batch-3") == "micro-batch 3 TPC-DI batch 2 resumed, done"

    assert page.text_of("summary").startswith(
        "4 micro-batch(es), 3 with results, 3 table(s) validated; cells: 2 pass, 1 warn, 1 overridden, "
        "1 quarantined, 1 HALTED; 3 row(s) in quarantine; HALTED: micro-batch 2; skipped: 4. Generated 2024-07-02 "
        "12:00:00 UTC"
    )
    assert page.text_of("quarantine") == "table rows in quarantine micro-batches staging.trade 3 2"
    assert page.text_of("trend").count("micro-batch") == 6  # a bar per batch with results, in both panels


def test_the_trend_counts_failed_checks_and_unexpected_values_of_the_latest_attempts():
    points = qr.trend(qr.build_grid(hand_made()))
    assert [(p.batch_id, p.checks, p.failed_checks, p.values_checked, p.unexpected, p.worst) for p in points] == [
        (1, 3, 1, 250, 2, "warned"),
        (2, 3, 2, 208, 4, "halted"),
        (3, 1, 1, 8, 1, "overridden"),  # attempt 1 only
    ]


def test_the_latency_section_gives_seconds_after_arrival_of_every_migrated_batch():
    def at(seconds: float) -> dt.datetime:
        return NOW + dt.timedelta(seconds=seconds)

    stages = (("stage", "done"), ("transform", "done"), ("migrate", "done"))
    batches = tuple(
        qr.BatchState(b, (2,), NOW, stages, done_at=(("stage", at(s)), ("transform", at(c)), ("migrate", at(v))))
        for b, s, c, v in [(1, 0.5, 2.0, 3.0), (2, 0.25, 1.0, 1.5), (3, 1.0, 5.0, 9.0)]
    ) + (qr.BatchState(4, (2,), NOW, (("stage", "done"), ("transform", "pending"), ("migrate", "pending")),
                       done_at=(("stage", at(0.75)), ("transform", None), ("migrate", None))),)  # fmt: skip
    data = qr.QualityData(results=(), batches=batches)
    page = Page(qr.render_summary(data, {}, GENERATED))
    assert page.text_of("latency").startswith(
        "Arrival -> visible in PostgreSQL over 3 migrated micro-batch(es): p50 3.00 s, p99 9.00 s."
    )
    assert page.text_of("latency-table") == (
        "micro-batch staged (s) committed in Delta (s) visible (s) 1 0.50 2.00 3.00 2 0.25 1.00 1.50 3 1.00 5.00 9.00"
    )
    empty = Page(qr.render_summary(qr.QualityData(results=(), batches=batches[3:]), {}, GENERATED))
    assert empty.text_of("latency") == "No micro-batch migrated yet."


def test_a_lake_without_results_gives_a_page_that_says_so(tmp_path: Path):
    outcome = qr.write_report(Lake(tmp_path / "lake"), tmp_path / "quality", now=GENERATED)
    text = outcome.index.read_text()
    assert "No micro-batch yet." in text and "No micro-batch is halted." in text
    assert outcome.pages == 0 and not (tmp_path / "quality" / qr.DATA_DOCS).exists()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """A lake holding ROWS, three quarantined rows and a batch log (batch 2 halted), and the report of it."""
    root = tmp_path_factory.mktemp("quality-report")
    lake = Lake(root / "lake")
    lake.append(
        QUALITY_RESULTS, pa.Table.from_pylist(ROWS, schema=QUALITY_RESULTS.arrow_schema()), app_id="t", version=1
    )
    quarantined = [
        {"batch_id": 2, "table_name": "staging.trade", "row_key": json.dumps({"line_no": n}),
         "check_ids": "type_is_a_trade_type", "row": "{}"}
        for n in (1, 2, 3)
    ]  # fmt: skip
    lake.append(QUARANTINE, pa.Table.from_pylist(quarantined, schema=QUARANTINE.arrow_schema()), app_id="t", version=1)
    log = BatchLog(lake)
    for b in (1, 2, 3):
        log.register(
            [LandedFile(f"Batch{min(b, 2)}/f{b}.txt", 1, str(b), NOW + dt.timedelta(hours=b), min(b, 2))], now=NOW
        )
    for stage in ("stage", "transform", "migrate"):
        log.mark(1, stage, "done", now=NOW)
    log.halt(2, "stage", TAXRATE_REASON, now=NOW)
    out = root / "reports" / "quality"
    first = qr.write_report(lake, out, now=GENERATED)
    first_index = first.index.read_text()
    first_files = sorted(p.relative_to(out).as_posix() for p in (out / qr.DATA_DOCS).rglob("*.html"))
    second = qr.write_report(lake, out, now=GENERATED)  # regenerated over the first one
    return out, first_index, first_files, second


def test_data_docs_hold_a_validation_page_per_batch_attempt_and_table(written):
    out, _, _, outcome = written
    groups = {(r["batch_id"], r["attempt"], r["table_name"]) for r in ROWS}
    assert outcome.pages == len(groups) == 7
    validations = sorted(
        p.relative_to(out / qr.DATA_DOCS).as_posix() for p in (out / qr.DATA_DOCS / "validations").rglob("*.html")
    )
    assert validations == [
        "validations/staging/taxrate/batch-1/20240701T100000.000000Z/micro-batch-1.html",
        "validations/staging/taxrate/batch-2/20240701T110000.000000Z/micro-batch-2.html",
        "validations/staging/taxrate/batch-3-attempt-1/20240701T120000.000000Z/micro-batch-3.html",
        "validations/staging/taxrate/batch-3/20240701T120000.000000Z/micro-batch-3.html",
        "validations/staging/trade/batch-1/20240701T100000.000000Z/micro-batch-1.html",
        "validations/staging/trade/batch-2/20240701T110000.000000Z/micro-batch-2.html",
        "validations/warehouse/dimtrade/batch-1/20240701T100000.000000Z/micro-batch-1.html",
    ]  # fmt: skip
    page = (out / qr.DATA_DOCS / validations[5]).read_text()
    assert "Validations / staging.trade / batch-2" in page  # GX's page title
    assert "t_tt_id" in page and "XXX" in page  # the column section and the partial failing values
    assert "3% unexpected" in page
    assert (out / qr.DATA_DOCS / "index.html").read_text().count("micro-batch-") >= 7  # GX's index lists them
    assert sorted(p.name for p in (out / qr.DATA_DOCS / "expectations").rglob("*.html")) == [
        "dimtrade.html",
        "taxrate.html",
        "trade.html",
    ]


def test_every_link_of_the_summary_resolves_and_the_report_is_deterministic(written):
    out, first_index, first_files, outcome = written
    page = Page(outcome.index.read_text())
    local = [link for link in page.links if "://" not in link]
    # a link per validated cell, the earlier attempt, the halting check, the Data Docs index, and the batch-log page
    # beside the report's folder (`orchestration.write_report_pages` writes it with the report; not written here),
    # and the live-windows page
    assert len(local) == 6 + 1 + 1 + 1 + 1 + 1
    assert "windows.html" in local
    assert local.count("../index.html") == 1
    local.remove("../index.html")
    for link in local:
        assert (out / unquote(link)).is_file(), link
    assert page.cells[(2, "staging.taxrate")]["class"] == "halted"
    assert "halted-2" in page.ids and "halted-1" not in page.ids
    assert page.text_of("quarantine").startswith("table rows in quarantine micro-batches staging.trade 3 2")
    # the same data gives the same page and the same file names; no stale or temporary files are left behind
    assert outcome.index.read_text() == first_index
    assert sorted(p.relative_to(out).as_posix() for p in (out / qr.DATA_DOCS).rglob("*.html")) == first_files
    assert sorted(p.name for p in out.iterdir()) == [".report.lock", qr.DATA_DOCS, "index.html", "windows.html"]
    assert page.text_of("windows").endswith("live windows; no late record.")


def test_data_docs_load_nothing_from_the_network(written):
    """Every script, stylesheet and image of every Data Docs page is a local copy that exists (streamdi.web_assets)."""
    import re

    from streamdi.web_assets import external_resources

    out, _, _, _ = written
    pages = sorted((out / qr.DATA_DOCS).rglob("*.html"))
    assert len(pages) >= 7
    vendored = 0
    for page in pages:
        text = page.read_text()
        assert external_resources(text) == [], page
        for tag in re.findall(r"<(?:script|link|img)\b[^>]*>", text):
            # (GX's own favicon link is one folder short on pages of dotted suite names: not checked)
            for ref in re.findall(r"""(?:src|href)="([^"]*static/vendor/[^"]+)\"""", tag):
                assert (page.parent / unquote(ref)).is_file(), (page, ref)
                vendored += 1
    assert vendored >= 16 * len(pages)  # each page: GX's 16 CDN files and its logo
