"""Every delimited file of the official generator's sample parses with the declared schemas, without a reject.

The sample (../shared/tpcdi-sample, read-only) is the format reference: Batch1 files are matched to the
historical declarations, Batch2/Batch3 files to the incremental (CDC) ones; audit files match no source.
"""

from __future__ import annotations

import pytest
from builders import SHARED_SAMPLE

from jobs.delimited import parse_delimited
from jobs.stage import numbered_lines, source_for_file
from schemas import sources as src

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
    staged, rejected = parse_delimited(numbered_lines(str(SHARED_SAMPLE / relative)), source)
    assert rejected.select(["line_no", "reason"]).slice(0, 5).to_pylist() == []
    assert staged.num_rows == lines


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
