"""`collect_parts`: several DataFrames brought to the driver by one Spark action, each with its own columns;
`collect_changes`: per table, the rows to upsert and the keys to delete, split after that one action."""

from __future__ import annotations

import decimal

import pytest
from pyspark.sql import functions as F

from jobs.collect import collect_changes, collect_parts, flagged_changes
from schemas.model import Column, Table
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


def test_changes_of_each_table_split_into_upserts_and_deleted_keys(spark):
    names = Table("t_names", "warehouse", (Column("id", "bigint", False), Column("name", "string")), key=("id",))
    dates = Table("t_dates", "warehouse", (Column("day", "date", False), Column("n", "int")), key=("day",))
    upserts = literal_frame(spark, [(1, "one"), (2, None)], "id bigint, name string")
    gone = literal_frame(spark, [(3,)], "id bigint")
    no_dates = literal_frame(spark, [], "day date, n int")
    no_keys = literal_frame(spark, [], "day date")

    got = collect_changes({names: flagged_changes(upserts, gone), dates: flagged_changes(no_dates, no_keys)})

    new, deleted = got[names]
    assert sorted(new.select(["id", "name"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "one"},
        {"id": 2, "name": None},
    ]
    assert deleted.to_pylist() == [{"id": 3}]
    new, deleted = got[dates]
    assert new.num_rows == 0 and deleted.num_rows == 0 and deleted.column_names == ["day"]
