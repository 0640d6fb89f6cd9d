"""The migration's check that a change holds one row per key (`streamdi.row_order.rows_distinct`): codes packed
into int64s and sorted, against Arrow's grouping of the same keys."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from streamdi import row_order


def grouped_rows(data: pa.Table, columns: list[str]) -> int:
    return data.group_by(columns, use_threads=False).aggregate([]).num_rows


@pytest.mark.parametrize("seed", range(6))
def test_packed_keys_find_exactly_the_duplicates_grouping_finds(seed):
    draw = random.Random(seed)
    n = draw.randint(1, 300)
    keys = pa.table(
        {
            "symbol": pa.array([draw.choice(["AAA", "BB", None, "C" * 30]) for _ in range(n)], pa.large_string()),
            "day": pa.array([draw.choice([20170101, 20170102, None]) for _ in range(n)], pa.int32()),
            "id": pa.array([draw.randint(0, 40) for _ in range(n)], pa.int64()),
        }
    )
    for columns in (["symbol"], ["symbol", "day"], ["symbol", "day", "id"], ["id"]):
        expected = grouped_rows(keys, columns) == n
        assert row_order.rows_distinct(keys, columns) is expected


def test_distinct_and_duplicate_keys_by_hand():
    keys = pa.table({"symbol": ["A", "A", "B", None], "day": [1, 2, 1, 1]})
    assert row_order.rows_distinct(keys, ["symbol", "day"]) is True
    assert row_order.rows_distinct(keys, ["symbol"]) is False
    nulls = pa.table({"symbol": pa.array([None, None], pa.string()), "day": [1, 1]})
    assert row_order.rows_distinct(nulls, ["symbol", "day"]) is False  # NULL keys compare equal, as in the grouping
    big = pa.table({f"c{i}": list(range(100_000)) for i in range(4)})  # 10^20 combinations: two packed columns
    assert row_order.rows_distinct(big, list(big.column_names)) is True


def test_a_key_without_codes_is_grouped():
    prices = pa.table({"symbol": ["A", "A", "B"], "close": [1.5, 2.5, 1.5]})
    assert row_order.rows_distinct(prices, ["symbol", "close"]) is True
    assert row_order.rows_distinct(prices, ["close"]) is False
