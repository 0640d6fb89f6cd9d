"""Generated files go through the real parser (`jobs.delimited.parse_delimited`) without a single reject."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import read_lines

from jobs.delimited import parse_delimited
from jobs.landing import numbered_lines, source_for_file

pytestmark = pytest.mark.integration

FILES = [
    *(f"Batch1/{n}" for n in ("Trade.txt", "TradeHistory.txt", "CashTransaction.txt", "HoldingHistory.txt",
                              "DailyMarket.txt", "WatchHistory.txt", "HR.csv", "Prospect.csv", "Date.txt", "Time.txt",
                              "BatchDate.txt")),
    *(f"Batch2/{n}" for n in ("Customer.txt", "Account.txt", "Trade.txt", "CashTransaction.txt", "HoldingHistory.txt",
                              "DailyMarket.txt", "WatchHistory.txt", "Prospect.csv")),
]  # fmt: skip


@pytest.mark.parametrize("relative", FILES)
def test_generated_file_parses_without_rejects(dataset: Path, relative: str):
    batch = int(relative.split("/")[0].removeprefix("Batch"))
    source = source_for_file(relative, batch)
    assert source is not None
    staged, rejected = parse_delimited(numbered_lines(str(dataset / relative))[0], source)
    assert rejected.select(["line_no", "reason", "line"]).slice(0, 3).to_pylist() == []
    assert staged.num_rows == len(read_lines(dataset / relative))
