"""`literal_frame` and `arrow_frame`: small frames handed to the JVM as Arrow, typed as declared, empty or not."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from streamdi.spark import arrow_frame, literal_frame

pytestmark = pytest.mark.integration


def test_rows_come_back_typed_and_in_order(spark):
    rows = [(2, dt.date(2017, 7, 8), "b"), (1, None, "a")]
    frame = literal_frame(spark, rows, "batch int, day date, label string")
    assert frame.dtypes == [("batch", "int"), ("day", "date"), ("label", "string")]
    assert [tuple(r) for r in frame.collect()] == rows


def test_every_declared_type_round_trips(spark):
    rows = [
        (7_000_000_000, Decimal("12.30"), dt.datetime(2017, 7, 8, 23, 59, 58), True, 1.5),
        (None, None, None, None, None),
    ]
    frame = literal_frame(spark, rows, "n bigint, price decimal(10,2), at timestamp, ok boolean, x double")
    assert frame.dtypes == [
        ("n", "bigint"),
        ("price", "decimal(10,2)"),
        ("at", "timestamp"),
        ("ok", "boolean"),
        ("x", "double"),
    ]
    assert [tuple(r) for r in frame.collect()] == rows


def test_the_plan_is_a_local_relation(spark):
    """Spark folds and broadcasts a local relation in the driver (no job, no Python worker)."""
    frame = literal_frame(spark, [(1, "a"), (2, "b")], "batch int, label string")
    assert frame._jdf.queryExecution().optimizedPlan().getClass().getSimpleName() == "LocalRelation"


def test_no_rows_give_an_empty_frame_with_the_columns(spark):
    frame = literal_frame(spark, [], "batch int, day date")
    assert frame.dtypes == [("batch", "int"), ("day", "date")]
    assert frame.count() == 0


def test_a_row_of_the_wrong_width_is_refused(spark):
    with pytest.raises(ValueError):
        literal_frame(spark, [(1, 2)], "batch int")


def test_an_arrow_table_with_an_empty_chunk_keeps_every_row(spark):
    """A delta-rs read has one chunk per data file, empty ones included; PySpark 4.3's createDataFrame drops the
    rows after an empty chunk, so arrow_frame combines the chunks first."""
    table = pa.table({"x": pa.chunked_array([[1, 2], [], [3]], pa.int64())})
    assert sorted(r["x"] for r in arrow_frame(spark, table).collect()) == [1, 2, 3]
