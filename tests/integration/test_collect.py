"""`collect_parts`: several DataFrames brought to the driver by one Spark action, each with its own columns."""

from __future__ import annotations

import decimal

import pytest
from pyspark.sql import functions as F

from jobs.collect import collect_parts
from streamdi.spark import literal_frame

pytestmark = pytest.mark.integration


def test_each_part_comes_back_with_its_own_rows_and_types_from_one_action(spark):
    trades = literal_frame(
        spark, [(1, decimal.Decimal("2.50"), None), (2, None, "late")], "id bigint, price decimal(8,2), why string"
    )
    # the same column name with another type, and a non-nullable literal column
    alerts = literal_frame(spark, [("7",)], "id string").withColumn("kind", F.lit("Alert"))
    nothing = literal_frame(spark, [], "id int")
    before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    got = collect_parts({"trades": trades, "alerts": alerts, "nothing": nothing})
    jobs = [j for j in spark.sparkContext.statusTracker().getJobIdsForGroup() if j not in before]

    assert sorted(got["trades"].to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "price": decimal.Decimal("2.50"), "why": None},
        {"id": 2, "price": None, "why": "late"},
    ]
    assert str(got["trades"].schema.field("price").type) == "decimal128(8, 2)"
    assert got["alerts"].to_pylist() == [{"id": "7", "kind": "Alert"}]
    assert got["nothing"].num_rows == 0 and got["nothing"].column_names == ["id"]
    assert len(jobs) == 1


def test_no_parts_need_no_spark_action(spark):
    assert collect_parts({}) == {}
