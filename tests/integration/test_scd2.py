"""SCD2 building blocks (jobs.scd2) on hand-written change records, with a real SparkSession."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from jobs.scd2 import build_versions, hashed_surrogate_key, surrogate_key, valid_at, version_changes
from schemas.model import Column as C
from schemas.model import Table

pytestmark = pytest.mark.integration

CHANGES = "id long, _ts timestamp, _batch int, seq int, a string, _has_a boolean, b string, _has_b boolean"
OPEN = date(9999, 12, 31)


def versions(spark, rows, order=("_ts", "seq")):
    df = spark.createDataFrame(rows, CHANGES)
    out = build_versions(df, ["id"], list(order), ["a", "b"])
    return [r.asDict() for r in out.orderBy("id", "effectivedate").collect()]


def v(id_, a, b, eff, end=OPEN, batch=1):
    return {
        "id": id_,
        "a": a,
        "b": b,
        "effectivedate": eff,
        "enddate": end,
        "iscurrent": end == OPEN,
        "batchid": batch,
    }


def test_one_version_per_day_the_days_last_change_wins_and_absent_fields_carry_forward(spark):
    rows = [
        (1, datetime(2010, 1, 1, 12), 1, 2, None, False, "y", True),  # same day, later: only b changes
        (1, datetime(2010, 1, 1, 10), 1, 1, "a", True, "x", True),
        (1, datetime(2011, 3, 4, 9), 2, 3, "c", True, None, False),  # only a changes
        (1, datetime(2012, 1, 1, 9), 3, 4, None, True, None, False),  # a set to NULL (present, empty)
        (2, datetime(2010, 5, 1, 0), 1, 1, "z", True, "w", True),
    ]

    assert versions(spark, rows) == [
        v(1, "a", "y", date(2010, 1, 1), date(2011, 3, 4)),
        v(1, "c", "y", date(2011, 3, 4), date(2012, 1, 1), batch=2),
        v(1, None, "y", date(2012, 1, 1), batch=3),
        v(2, "z", "w", date(2010, 5, 1)),
    ]


def test_records_of_one_day_are_ordered_by_the_declared_order_not_by_arrival(spark):
    # same timestamp: the file position (seq) decides
    rows = [
        (1, datetime(2017, 7, 8), 2, 9, "late", True, "b9", True),
        (1, datetime(2017, 7, 8), 2, 3, "early", True, "b3", True),
    ]

    assert versions(spark, rows) == [v(1, "late", "b9", date(2017, 7, 8), batch=2)]


def test_surrogate_keys_derive_from_natural_key_and_day(spark):
    df = spark.createDataFrame(
        [(7, date(1900, 1, 1)), (7, date(2017, 7, 8)), (12345, date(1900, 1, 2))], "id long, d date"
    )
    keys = [r[0] for r in df.select(surrogate_key("id", "d")).collect()]
    assert keys == [700000, 700000 + 42922, 1234500001]

    hashed = df.select(hashed_surrogate_key("t", ["id"], "d").alias("k")).collect()
    assert len({r.k for r in hashed}) == 3
    assert all(r.k >= 0 for r in hashed)
    again = df.select(hashed_surrogate_key("t", ["id"], "d").alias("k")).collect()
    assert hashed == again


def test_valid_at_joins_the_version_valid_on_the_day_and_leaves_unknown_keys_null(spark):
    dim = spark.createDataFrame(
        [(1, 100, date(2010, 1, 1), date(2011, 1, 1)), (1, 101, date(2011, 1, 1), OPEN)],
        "id long, sk long, effectivedate date, enddate date",
    )
    facts = spark.createDataFrame(
        [(10, 1, date(2010, 12, 31)), (11, 1, date(2011, 1, 1)), (12, 2, date(2011, 1, 1)), (13, 1, date(2009, 1, 1))],
        "fact long, ref long, day date",
    )

    out = valid_at(facts, "ref", "day", dim, "id", {"sk": "sk_ref"})

    assert sorted((r.fact, r.sk_ref) for r in out.collect()) == [(10, 100), (11, 101), (12, None), (13, None)]


def test_version_changes_upserts_the_new_history_and_deletes_versions_that_no_longer_exist(spark):
    table = Table(
        "t",
        "warehouse",
        (C("sk", "bigint", False), C("id", "bigint", False), C("a", "string")),
        key=("sk",),
        order_by=("sk",),
    )
    current = spark.createDataFrame([(10, 1, "x"), (11, 1, "y"), (20, 2, "z")], "sk long, id long, a string")
    new = spark.createDataFrame([(10, 1, "x2")], "sk long, id long, a string")
    touched = spark.createDataFrame([(1,), (3,)], "id long")

    upserts, deletes = version_changes(current, new, table, ["id"], touched)

    assert [tuple(r) for r in upserts.collect()] == [(10, 1, "x2")]
    assert [tuple(r) for r in deletes.collect()] == [(11,)]  # key 2 was not touched: left alone
