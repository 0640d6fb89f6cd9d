"""The migration's check that a change holds one row per key (`streamdi.warehouse_apply._keys_distinct`): codes
packed into one int64 per row and sorted, against Arrow's grouping of the same keys."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from streamdi import warehouse_apply as apply


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
        expected = apply._grouped_rows(keys, columns) == n
        assert apply._keys_distinct(keys.select(columns), columns) is expected


def test_distinct_and_duplicate_keys_by_hand():
    keys = pa.table({"symbol": ["A", "A", "B", None], "day": [1, 2, 1, 1]})
    assert apply._keys_distinct(keys, ["symbol", "day"]) is True
    assert apply._keys_distinct(keys, ["symbol"]) is False
    nulls = pa.table({"symbol": pa.array([None, None], pa.string()), "day": [1, 1]})
    assert apply._keys_distinct(nulls, ["symbol", "day"]) is False  # NULL keys compare equal, as in the grouping
    big = pa.table({f"c{i}": list(range(100_000)) for i in range(4)})  # 10^20 combinations: grouped instead
    assert apply._keys_distinct(big, list(big.column_names)) is True
