"""Generated files go through the real parser (`jobs.stage.parse_delimited`) without a single reject."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import read_lines

from jobs.stage import parse_delimited, source_for_file
from jobs.stage import read_lines as spark_read_lines

pytestmark = pytest.mark.integration

FILES = [
    *(f"Batch1/{n}" for n in ("Trade.txt", "TradeHistory.txt", "CashTransaction.txt", "HoldingHistory.txt",
                              "DailyMarket.txt", "WatchHistory.txt", "HR.csv", "Prospect.csv", "Date.txt", "Time.txt",
                              "BatchDate.txt")),
    *(f"Batch2/{n}" for n in ("Customer.txt", "Account.txt", "Trade.txt", "CashTransaction.txt", "HoldingHistory.txt",
                              "DailyMarket.txt", "WatchHistory.txt", "Prospect.csv")),
]  # fmt: skip


@pytest.mark.parametrize("relative", FILES)
def test_generated_file_parses_without_rejects(spark, dataset: Path, relative: str):
    batch = int(relative.split("/")[0].removeprefix("Batch"))
    source = source_for_file(relative, batch)
    assert source is not None
    staged, rejected = parse_delimited(spark_read_lines(spark, str(dataset / relative)), source)
    assert rejected.select("line_no", "reason", "line").limit(3).collect() == []
    assert staged.count() == len(read_lines(dataset / relative))
