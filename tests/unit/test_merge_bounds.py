"""The bounds a MERGE adds to its join (`streamdi.merge_bounds`): exact ranges and SQL, worked out by hand."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Column as C
from schemas.model import Table
from streamdi.merge_bounds import clusters, key_bounds, target_bounds

TRADES = Table(
    "trades", "warehouse", (C("tradeid", "bigint", False), C("v", "int")), key=("tradeid",), order_by=("tradeid",)
)
SLICES = Table(
    "slices",
    "staging",
    (C("symbol", "string", False), C("level", "int", False), C("block", "int", False)),
    key=("symbol", "level", "block"),
    order_by=("level", "block", "symbol"),
)
BY_NAME = Table(
    "named",
    "warehouse",
    (C("name", "string", False), C("id", "int", False)),
    key=("name", "id"),
    order_by=("name", "id"),
)


def test_clusters_cut_the_sorted_distinct_values_at_their_widest_gaps():
    values = pa.array([500, 3, 1, 2, 1000, 501, 2, None, 40], pa.int64())
    assert clusters(values, 1) == [(1, 1000)]
    assert clusters(values, 2) == [(1, 501), (1000, 1000)]  # widest gap: 501 -> 1000
    assert clusters(values, 3) == [(1, 40), (500, 501), (1000, 1000)]  # next: 40 -> 500
    assert clusters(values, 4) == [(1, 3), (40, 40), (500, 501), (1000, 1000)]
    assert clusters(values, 50) == [(1, 3), (40, 40), (500, 501), (1000, 1000)]  # adjacent values stay together
    assert clusters(pa.array([7, 7], pa.int64()), 8) == [(7, 7)]
    assert clusters(pa.array([], pa.int64()), 8) == []


def test_a_single_integer_key_is_bounded_by_its_clusters():
    source = pa.table({"tradeid": pa.array([10, 11, 12, 900_000, 900_001, 5_000], pa.int64()), "v": [1] * 6})
    assert target_bounds(TRADES, source) == (
        "(t.tradeid BETWEEN 10 AND 12) OR (t.tradeid BETWEEN 5000 AND 5000) OR (t.tradeid BETWEEN 900000 AND 900001)"
    )
    assert target_bounds(TRADES, source.slice(0, 0)) is None


def test_a_leading_column_of_few_values_bounds_the_next_one_per_value():
    source = pa.table(
        {
            "symbol": ["A", "B", "A", "A"],
            "level": pa.array([2, 1, 1, 2], pa.int32()),
            "block": pa.array([4_365, 8_731, 8_731, 4_366], pa.int32()),
        }
    )
    assert target_bounds(SLICES, source, "x") == (
        "(x.level = 1 AND x.block BETWEEN 8731 AND 8731) OR (x.level = 2 AND x.block BETWEEN 4365 AND 4366)"
    )
    rows = pa.table(
        {
            "symbol": ["Z"] * 5,
            "level": pa.array([1, 1, 2, 2, 3], pa.int32()),
            "block": pa.array([8_731, 8_730, 4_366, 4_000, 4_366], pa.int32()),
        }
    )
    assert rows.filter(key_bounds(SLICES, source))["block"].to_pylist() == [8_731, 4_366]


def test_a_table_led_by_a_string_column_gets_no_bound():
    source = pa.table({"name": ["a", "b"], "id": pa.array([1, 2], pa.int32())})
    assert target_bounds(BY_NAME, source) is None
    assert key_bounds(BY_NAME, source) is None


def test_the_filter_keeps_every_row_of_a_source_key_and_drops_the_gaps():
    keys = pa.table({"tradeid": pa.array([1, 2, 3, 1_000, 1_001], pa.int64())})
    candidates = pa.table({"tradeid": pa.array(range(0, 1_100), pa.int64())})
    kept = candidates.filter(key_bounds(TRADES, keys))["tradeid"].to_pylist()
    assert kept == [1, 2, 3, 1_000, 1_001]
    assert pc.all(pc.is_in(keys["tradeid"], value_set=pa.array(kept, pa.int64()))).as_py()
