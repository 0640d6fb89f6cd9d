"""The official generator's sample: every delimited file parses with the declared schemas without a reject, and the
sample loads through stage and transform, every table built.

The sample (../shared/tpcdi-sample, read-only) is the format reference: Batch1 files are matched to the
historical declarations, Batch2/Batch3 files to the incremental (CDC) ones; audit files match no source.
"""

from __future__ import annotations

import pytest
from builders import SHARED_SAMPLE

from jobs.delimited import parse_delimited
from jobs.landing import numbered_lines, source_for_file
from jobs.stage_parse import parse_file
from schemas import sources as src
from streamdi.batchlog import BatchFile

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not SHARED_SAMPLE.exists(), reason="../shared/tpcdi-sample is not beside the checkout"),
]

# (file, declared source, lines in the file) — line counts from `wc -l` on the sample
OFFICIAL_FILES = [
    ("Batch1/BatchDate.txt", src.BATCH_DATE, 1),
    ("Batch1/CashTransaction.txt", src.CASH_TRANSACTION, 300),
    ("Batch1/DailyMarket.txt", src.DAILY_MARKET, 300),
    ("Batch1/Date.txt", src.DATE_FILE, 300),
    ("Batch1/HR.csv", src.HR, 300),
    ("Batch1/HoldingHistory.txt", src.HOLDING_HISTORY, 300),
    ("Batch1/Industry.txt", src.INDUSTRY, 102),
    ("Batch1/Prospect.csv", src.PROSPECT, 300),
    ("Batch1/StatusType.txt", src.STATUS_TYPE, 6),
    ("Batch1/TaxRate.txt", src.TAX_RATE, 320),
    ("Batch1/Time.txt", src.TIME_FILE, 300),
    ("Batch1/Trade.txt", src.TRADE, 300),
    ("Batch1/TradeHistory.txt", src.TRADE_HISTORY, 900),
    ("Batch1/TradeType.txt", src.TRADE_TYPE, 5),
    ("Batch1/WatchHistory.txt", src.WATCH_HISTORY, 300),
    ("Batch2/Account.txt", src.ACCOUNT, 30),
    ("Batch2/BatchDate.txt", src.BATCH_DATE, 1),
    ("Batch2/CashTransaction.txt", src.CASH_TRANSACTION_CDC, 199),
    ("Batch2/Customer.txt", src.CUSTOMER, 15),
    ("Batch2/DailyMarket.txt", src.DAILY_MARKET_CDC, 1788),
    ("Batch2/HoldingHistory.txt", src.HOLDING_HISTORY_CDC, 218),
    ("Batch2/Prospect.csv", src.PROSPECT, 300),
    ("Batch2/Trade.txt", src.TRADE_CDC, 570),
    ("Batch2/WatchHistory.txt", src.WATCH_HISTORY_CDC, 2098),
    ("Batch3/Account.txt", src.ACCOUNT, 30),
    ("Batch3/BatchDate.txt", src.BATCH_DATE, 1),
    ("Batch3/CashTransaction.txt", src.CASH_TRANSACTION_CDC, 188),
    ("Batch3/Customer.txt", src.CUSTOMER, 15),
    ("Batch3/DailyMarket.txt", src.DAILY_MARKET_CDC, 1788),
    ("Batch3/HoldingHistory.txt", src.HOLDING_HISTORY_CDC, 208),
    ("Batch3/Prospect.csv", src.PROSPECT, 300),
    ("Batch3/Trade.txt", src.TRADE_CDC, 546),
    ("Batch3/WatchHistory.txt", src.WATCH_HISTORY_CDC, 2098),
]


@pytest.mark.parametrize(("relative", "source", "lines"), OFFICIAL_FILES, ids=[f[0] for f in OFFICIAL_FILES])
def test_official_file_parses_without_a_single_reject(relative, source, lines):
    batch = int(relative.split("/")[0].removeprefix("Batch"))
    assert source_for_file(relative, batch) is source
    numbered, undecodable = numbered_lines(str(SHARED_SAMPLE / relative))
    assert undecodable.num_rows == 0
    staged, rejected = parse_delimited(numbered, source)
    assert rejected.select(["line_no", "reason"]).slice(0, 5).to_pylist() == []
    assert staged.num_rows == lines
    # the whole file split at once (Arrow's CSV reader) gives the same rows, line numbers included
    data = (SHARED_SAMPLE / relative).read_bytes()
    whole, whole_rejected, read = parse_file(data, BatchFile(1, 1, relative, len(data), "x", None, batch), source, 1)
    assert (read, whole_rejected.num_rows) == (lines, 0)
    assert whole.select(staged.column_names).equals(staged)


def test_every_delimited_sample_file_is_covered():
    on_disk = sorted(
        p.relative_to(SHARED_SAMPLE).as_posix()
        for p in SHARED_SAMPLE.glob("Batch*/*")
        if not p.name.endswith("_audit.csv") and not p.name.startswith("FINWIRE") and p.suffix != ".xml"
    )
    assert on_disk == sorted(f[0] for f in OFFICIAL_FILES)


def test_audit_finwire_and_xml_files_match_no_delimited_source():
    for name in ("Batch1/Trade_audit.csv", "Batch1/HR_audit.csv", "Batch2/Prospect_audit.csv"):
        assert source_for_file(name, int(name[5])) is None
    assert source_for_file("Batch1/FINWIRE2000Q1", 1) is None
    assert source_for_file("Batch1/CustomerMgmt.xml", 1) is None


def test_batch_picks_the_historical_or_the_cdc_variant():
    assert source_for_file("Batch1/Trade.txt", 1) is src.TRADE
    assert source_for_file("Trade_batch2_0003.txt", 2) is src.TRADE_CDC
    assert source_for_file("Batch1/TradeHistory.txt", 1) is src.TRADE_HISTORY
    assert source_for_file("Batch2/Customer.txt", 2) is src.CUSTOMER
    assert source_for_file("Batch1/Customer.txt", 1) is None
    assert [c.name for c in src.TRADE_CDC.columns[:3]] == ["cdc_flag", "cdc_dsn", "t_id"]


# --------------------------------------------------------------------------------- the sample through the transform
@pytest.fixture(scope="module")
def sample_loaded(spark, tmp_path_factory):
    """Batch1, Batch2 and Batch3 of the official sample delivered and run through stage and transform (T0..T4,
    DM), one micro-batch each."""
    from streamdi.context import JobContext
    from streamdi.delivery import deliver_batch
    from streamdi.lake import Lake
    from streamdi.run.pipeline import run_pending
    from streamdi.settings import Settings

    home = tmp_path_factory.mktemp("official-sample")
    settings = Settings(home=home, spark_master="local[2]", spark_shuffle_partitions=2)
    ctx = JobContext(settings, spark=spark, lake=Lake(settings.lake_root, spark))
    staged = {}
    for batch in (1, 2, 3):
        deliver_batch(SHARED_SAMPLE, batch, settings.landing_dir)
        report = run_pending(ctx, upto="transform")
        assert not report.halted, report.halted
        staged[batch] = next(s.detail for s in report.steps if s.stage == "stage")
    return ctx, staged


def _lines(relative: str) -> int:
    return (SHARED_SAMPLE / relative).read_bytes().count(b"\n")


def test_the_official_sample_stages_without_a_reject_and_builds_every_table(sample_loaded):
    """The sample is cut (see its README): references between its files do not all resolve, so trades, holdings,
    watches and cash balances whose accounts or securities were cut away wait or raise alerts. What must hold is
    that every file and every action loads as it comes, and every warehouse table is built from it."""
    from schemas import warehouse as wh
    from schemas.staging import REJECTS

    ctx, staged = sample_loaded
    for batch, detail in staged.items():
        assert detail["rejected"] == 0, f"batch {batch}"
        assert detail["read"] == detail["staged"], f"batch {batch}"
    assert not ctx.lake.exists(REJECTS) or ctx.lake.read_arrow(REJECTS).num_rows == 0
    assert {t.name for t in wh.WAREHOUSE_TABLES if ctx.lake.exists(t)} == {t.name for t in wh.WAREHOUSE_TABLES}
    counts = {t.name: ctx.lake.row_count(t) for t in wh.WAREHOUSE_TABLES}
    # the reference files as they are; brokers are the HR lines with job code 314; every AgencyID once
    assert counts["dimdate"] == _lines("Batch1/Date.txt") == 300
    assert counts["dimtime"] == _lines("Batch1/Time.txt") == 300
    assert counts["industry"] == _lines("Batch1/Industry.txt") == 102
    assert counts["taxrate"] == _lines("Batch1/TaxRate.txt") == 320
    assert (counts["statustype"], counts["tradetype"]) == (6, 5)
    assert counts["dimbroker"] == 83
    assert counts["prospect"] == 300
    for name in ("dimcompany", "dimsecurity", "financial", "dimcustomer", "dimaccount", "factmarkethistory"):
        assert counts[name] > 0, name


def test_the_official_sample_gets_the_24_validation_rows_of_every_batch(sample_loaded):
    from schemas import warehouse as wh

    ctx, _ = sample_loaded
    rows = ctx.lake.read_arrow(wh.DI_MESSAGES).to_pylist()
    per_batch = {b: sum(r["batchid"] == b and r["messagetype"] == "Validation" for r in rows) for b in (0, 1, 2, 3)}
    assert per_batch == {0: 24, 1: 24, 2: 24, 3: 24}
    assert sorted(r["batchid"] for r in rows if r["messagetype"] == "PCR") == [0, 1, 2, 3]
