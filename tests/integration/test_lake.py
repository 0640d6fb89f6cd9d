"""The Delta Lake platform module on real Delta tables: exact snapshot round-trips (Spark and Arrow),
idempotent append/upsert under retries and replays, the change data feed, commit history, readability by a
fresh process without Spark, the table protocol, schema drift, and crashes just before / just after a commit
(real subprocesses killed with SIGKILL)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from schemas.model import Column as C
from schemas.model import Table
from streamdi.delta_appends import appended_files, changed_files
from streamdi.delta_log import commit_infos, table_id
from streamdi.lake import RESIDENT_BYTES, CommitInfo, CommitResult, Lake

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


# -- declarations and builders -------------------------------------------------------------------------


def lake_table(name: str, *, key: tuple[str, ...] = ("id",)) -> Table:
    """A test-only warehouse table: an int key, a nullable string, a decimal, a date and a timestamp."""
    return Table(
        name=name,
        layer="warehouse",
        columns=(
            C("id", "int", False),
            C("name", "string"),
            C("amount", "decimal(10,5)"),
            C("trade_day", "date"),
            C("traded_at", "timestamp"),
        ),
        key=key,
        order_by=("id",),
    )


# The Spark schema of `lake_table`, written out so `read` is checked against the declaration, not itself.
SPARK_SCHEMA = T.StructType(
    [
        T.StructField("id", T.IntegerType(), False),
        T.StructField("name", T.StringType(), True),
        T.StructField("amount", T.DecimalType(10, 5), True),
        T.StructField("trade_day", T.DateType(), True),
        T.StructField("traded_at", T.TimestampType(), True),
    ]
)


def row(id_: int, **overrides) -> dict:
    values = {
        "id": id_,
        "name": f"name-{id_}",
        "amount": Decimal("1.50000"),
        "trade_day": date(2024, 1, 31),
        "traded_at": datetime(2024, 1, 31, 12, 30, 0, tzinfo=UTC),
    }
    values.update(overrides)
    return values


def arrow_rows(table: Table, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=table.arrow_schema())


def spark_rows(spark, rows: list[dict]):
    """A Spark DataFrame of `rows`, spread over two partitions in an order different from the key order."""
    return spark.createDataFrame(list(reversed(rows)), schema=SPARK_SCHEMA).repartition(2)


CHANGE_ORDER = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}


def feed(lake: Lake, table: Table, start: int, end: int) -> list[dict]:
    """The change feed as rows in a stable order: commit version, key, then pre-image before post-image."""
    rows = lake.changes(table, start, end).to_pylist()
    return sorted(rows, key=lambda r: (r["_commit_version"], r["id"], CHANGE_ORDER[r["_change_type"]]))


def change(change_type: str, commit_version: int, base: dict) -> dict:
    return {**base, "_change_type": change_type, "_commit_version": commit_version}


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    env.update(extra)
    return env


def run_child(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- snapshots -----------------------------------------------------------------------------------------


def test_read_returns_exactly_the_rows_written_including_nulls_decimals_dates_and_timestamps(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("snapshot")
    first = [
        {
            "id": 1,
            "name": "alpha",
            "amount": Decimal("0.15000"),
            "trade_day": date(2024, 2, 29),
            "traded_at": datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
        },
        {"id": 2, "name": None, "amount": None, "trade_day": None, "traded_at": None},
        {
            "id": 3,
            "name": "",
            "amount": Decimal("-12345.67891"),
            "trade_day": date(1970, 1, 1),
            "traded_at": datetime(1999, 12, 31, 0, 0, 0, tzinfo=UTC),
        },
    ]

    result = lake.append(table, spark_rows(spark, first), app_id="snapshot", version=1)

    assert result == CommitResult("warehouse.snapshot", "snapshot", 1, True, 1, 3)
    actual = lake.read(table)
    assertSchemaEqual(actual.schema, SPARK_SCHEMA)
    assertDataFrameEqual(actual, spark.createDataFrame(first, schema=SPARK_SCHEMA))
    # Decimal("0.15") == Decimal("0.15000") in Python: compare the text to check the scale survived.
    assert [str(r.amount) for r in actual.orderBy("id").collect()] == ["0.15000", "None", "-12345.67891"]
    assert [
        r.t
        for r in actual.orderBy("id")
        .select(F.date_format("traded_at", "yyyy-MM-dd HH:mm:ss.SSSSSS").alias("t"))
        .collect()
    ] == ["2024-02-29 23:59:59.123456", None, "1999-12-31 00:00:00.000000"]
    arrow = lake.read_arrow(table)
    assert arrow.column_names == ["id", "name", "amount", "trade_day", "traded_at"]
    assert [arrow.schema.field(c).type for c in ("amount", "trade_day", "traded_at")] == [
        pa.decimal128(10, 5),
        pa.date32(),
        pa.timestamp("us", tz="UTC"),
    ]
    assert arrow.to_pylist() == first  # sorted by order_by although Spark wrote them in another order

    lake.append(table, spark_rows(spark, [row(0), row(4)]), app_id="snapshot", version=2)

    assert lake.read_arrow(table).to_pylist() == [row(0), *first, row(4)]
    assertDataFrameEqual(lake.read(table, version=1), spark.createDataFrame(first, schema=SPARK_SCHEMA))
    assert lake.read_arrow(table, version=1).to_pylist() == first


def test_read_of_an_empty_table_has_the_declared_schema_and_no_rows(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("empty")
    lake.ensure_table(table)

    actual = lake.read(table)

    assertSchemaEqual(actual.schema, SPARK_SCHEMA)
    assert actual.collect() == []
    assert lake.read_arrow(table).num_rows == 0
    assert lake.version(table) == 0


def test_read_without_spark_session_raises_runtime_error(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("nospark")
    lake.append(table, arrow_rows(table, [row(1)]), app_id="nospark", version=1)

    with pytest.raises(RuntimeError, match="without a SparkSession"):
        lake.read(table)
    assert lake.read_arrow(table).to_pylist() == [row(1)]


# -- idempotent writes -----------------------------------------------------------------------------------


def test_append_is_skipped_for_a_repeated_or_older_app_transaction(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("append_retry")
    batch2 = [row(1), row(2)]

    first = lake.append(table, spark_rows(spark, batch2), app_id="loader", version=2)
    retry = lake.append(table, spark_rows(spark, batch2), app_id="loader", version=2)
    older = lake.append(table, spark_rows(spark, [row(9)]), app_id="loader", version=1)

    assert first == CommitResult("warehouse.append_retry", "loader", 2, True, 1, 2)
    assert retry == CommitResult("warehouse.append_retry", "loader", 2, False, 1, 0)
    assert older == CommitResult("warehouse.append_retry", "loader", 1, False, 1, 0)
    assert lake.version(table) == 1
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2)]
    assert lake.committed_version(table, "loader") == 2

    newer = lake.append(table, spark_rows(spark, [row(3)]), app_id="loader", version=3)
    # Transactions are per app id: another app's version 1 is not shadowed by loader@3.
    other = lake.append(table, arrow_rows(table, [row(4)]), app_id="other", version=1)

    assert newer == CommitResult("warehouse.append_retry", "loader", 3, True, 2, 1)
    assert other == CommitResult("warehouse.append_retry", "other", 1, True, 3, 1)
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2), row(3), row(4)]
    assert lake.committed_version(table, "loader") == 3
    assert lake.committed_version(table, "other") == 1
    assert lake.committed_version(table, "never") is None


def test_upsert_inserts_new_keys_updates_changed_rows_and_a_replay_is_a_no_op(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("upsert_replay")
    lake.append(table, arrow_rows(table, [row(1), row(2), row(3)]), app_id="load", version=1)

    merged = lake.upsert(
        table,
        spark_rows(spark, [row(2, name=None, amount=Decimal("2.25000")), row(3), row(4)]),
        app_id="merge",
        version=1,
    )

    assert merged == CommitResult("warehouse.upsert_replay", "merge", 1, True, 2, 3)
    expected = [row(1), row(2, name=None, amount=Decimal("2.25000")), row(3), row(4)]
    assert lake.read_arrow(table).to_pylist() == expected
    # Row 3 equals the target: it is left alone, so the feed shows no update for it.
    assert feed(lake, table, 2, 2) == [
        change("update_preimage", 2, row(2)),
        change("update_postimage", 2, row(2, name=None, amount=Decimal("2.25000"))),
        change("insert", 2, row(4)),
    ]

    replay = lake.upsert(table, spark_rows(spark, [row(2, name="replayed"), row(5)]), app_id="merge", version=1)

    assert replay == CommitResult("warehouse.upsert_replay", "merge", 1, False, 2, 0)
    assert lake.version(table) == 2
    assert lake.read_arrow(table).to_pylist() == expected


def test_upsert_of_new_keys_only_is_an_append_with_the_same_rows_feed_and_replay(lake_dir):
    """No key of the rows is in the table: the commit is an append (no MERGE), with the rows, the change feed and
    the app transaction a MERGE would give; one key present, or a key of strings only, and it is a MERGE again.
    Only for a table declared `new_keys_mostly`: the others are merged without the look."""
    lake = Lake(lake_dir)
    table = dataclasses.replace(lake_table("upsert_new_keys"), new_keys_mostly=True)
    lake.append(table, arrow_rows(table, [row(1), row(5)]), app_id="load", version=1)

    lake.upsert(table, arrow_rows(table, [row(3), row(7)]), app_id="merge", version=1)  # 3: inside 1..5, new

    history = DeltaTable(str(lake.path(table))).history()
    assert history[0]["operation"] == "WRITE"  # newest first
    assert lake.read_arrow(table).sort_by("id").to_pylist() == [row(1), row(3), row(5), row(7)]
    assert feed(lake, table, 2, 2) == [change("insert", 2, row(3)), change("insert", 2, row(7))]
    assert lake.upsert(table, arrow_rows(table, [row(9)]), app_id="merge", version=1).committed is False

    lake.upsert(table, arrow_rows(table, [row(7, name="changed"), row(8)]), app_id="merge", version=2)
    assert DeltaTable(str(lake.path(table))).history()[0]["operation"] == "MERGE"
    assert feed(lake, table, 3, 3) == [
        change("update_preimage", 3, row(7)),
        change("update_postimage", 3, row(7, name="changed")),
        change("insert", 3, row(8)),
    ]

    named = Table(
        "upsert_string_key",
        "warehouse",
        (C("k", "string", False), C("v", "int")),
        key=("k",),
        order_by=("k",),
        new_keys_mostly=True,
    )
    lake.append(named, pa.table({"k": ["a"], "v": [1]}).cast(named.arrow_schema()), app_id="load", version=1)
    lake.upsert(named, pa.table({"k": ["b"], "v": [2]}).cast(named.arrow_schema()), app_id="merge", version=1)
    assert DeltaTable(str(lake.path(named))).history()[0]["operation"] == "MERGE"  # not looked at: merged

    # a key of a string and a number (FactMarketHistory's symbol and day), in files a MERGE wrote: the day's range
    # is read, the pairs matched
    mixed = Table(
        "upsert_mixed_key",
        "warehouse",
        (C("k", "string", False), C("d", "int", False), C("v", "int")),
        key=("k", "d"),
        order_by=("k", "d"),
        new_keys_mostly=True,
    )

    def rows(*values: tuple) -> pa.Table:
        return pa.table({"k": [v[0] for v in values], "d": [v[1] for v in values], "v": [v[2] for v in values]}).cast(
            mixed.arrow_schema()
        )

    lake.append(mixed, rows(("a", 1, 1), ("b", 1, 1)), app_id="load", version=1)
    lake.upsert(mixed, rows(("a", 2, 2), ("b", 1, 9)), app_id="merge", version=1)  # b@1 is there: a MERGE
    assert DeltaTable(str(lake.path(mixed))).history()[0]["operation"] == "MERGE"
    lake.upsert(mixed, rows(("b", 2, 3), ("c", 1, 4)), app_id="merge", version=2)  # new pairs, known days
    assert DeltaTable(str(lake.path(mixed))).history()[0]["operation"] == "WRITE"
    got = sorted((r["k"], r["d"], r["v"]) for r in lake.read_arrow(mixed).to_pylist())
    assert got == [("a", 1, 1), ("a", 2, 2), ("b", 1, 9), ("b", 2, 3), ("c", 1, 4)]

    plain = lake_table("upsert_undeclared")  # not new_keys_mostly: merged, new keys or not
    lake.append(plain, arrow_rows(plain, [row(1)]), app_id="load", version=1)
    lake.upsert(plain, arrow_rows(plain, [row(2)]), app_id="merge", version=1)
    assert DeltaTable(str(lake.path(plain))).history()[0]["operation"] == "MERGE"


def test_pieces_are_written_as_files_of_about_the_tables_file_size_in_key_order(lake_dir):
    """A first load written a piece at a time gives a table with its own file size consecutive files of about that
    size, so that a MERGE of a few keys rewrites only the file that holds them."""
    lake = Lake(lake_dir)
    table = dataclasses.replace(lake_table("pieces_sized"), file_bytes=64 * 1024)
    rows = [row(i, name=f"name-{i:06d}-{'x' * (i % 23)}") for i in range(40_000)]
    pieces = lake.pieces(table, app_id="T9/sized", version=1)
    pieces.add(arrow_rows(table, list(reversed(rows[:20_000]))))
    pieces.add(arrow_rows(table, rows[20_000:]))
    pieces.commit()

    actions = pa.table(DeltaTable(str(lake.path(table))).get_add_actions(flatten=True))
    ranges = sorted(zip(actions["min.id"].to_pylist(), actions["max.id"].to_pylist(), strict=True))
    assert len(ranges) >= 6
    assert ranges[0][0] == 0 and ranges[-1][1] == 39_999
    assert all(high + 1 == low for (_, high), (low, _) in zip(ranges, ranges[1:], strict=False))  # in a row
    assert max(actions["size_bytes"].to_pylist()) < 2 * 64 * 1024
    assert lake.read_arrow(table).sort_by("id").to_pylist() == rows

    lake.upsert(table, arrow_rows(table, [row(39_990, name="changed")]), app_id="merge", version=1)
    last = DeltaTable(str(lake.path(table))).history()[0]
    assert last["operation"] == "MERGE" and last["operationMetrics"]["num_target_files_removed"] == 1


def test_upsert_of_rows_equal_to_the_target_changes_nothing_and_still_records_the_transaction(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("upsert_equal")
    lake.append(table, arrow_rows(table, [row(1), row(2, name=None)]), app_id="load", version=1)

    same = lake.upsert(table, arrow_rows(table, [row(2, name=None), row(1)]), app_id="merge", version=1)

    assert same.committed is True
    assert lake.committed_version(table, "merge") == 1
    assert lake.version(table) == 2  # a commit that only records merge@1
    assert feed(lake, table, 2, 2) == []  # no insert, no update pre/post images
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2, name=None)]

    # Another writer changes row 1; replaying merge@1 must not put the old value back.
    lake.upsert(table, arrow_rows(table, [row(1, name="corrected")]), app_id="fix", version=1)
    replay = lake.upsert(table, arrow_rows(table, [row(2, name=None), row(1)]), app_id="merge", version=1)

    assert replay.committed is False
    assert lake.read_arrow(table).to_pylist() == [row(1, name="corrected"), row(2, name=None)]


def test_upsert_with_deletes_updates_inserts_and_deletes_in_one_commit_and_a_replay_is_a_no_op(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("upsert_deletes")
    lake.append(table, arrow_rows(table, [row(1), row(2), row(3)]), app_id="load", version=1)
    doomed = spark.createDataFrame([(3,), (9,)], "id int")  # 9 does not exist: nothing to delete

    result = lake.upsert(
        table, spark_rows(spark, [row(1, name="one"), row(2), row(4)]), app_id="scd", version=1, deletes=doomed
    )

    assert result == CommitResult("warehouse.upsert_deletes", "scd", 1, True, 2, 3)
    expected = [row(1, name="one"), row(2), row(4)]
    assert lake.read_arrow(table).to_pylist() == expected
    assert feed(lake, table, 2, 2) == [
        change("update_preimage", 2, row(1)),
        change("update_postimage", 2, row(1, name="one")),
        change("delete", 2, row(3)),
        change("insert", 2, row(4)),
    ]

    replay = lake.upsert(table, spark_rows(spark, [row(5)]), app_id="scd", version=1, deletes=doomed)

    assert replay.committed is False
    assert lake.read_arrow(table).to_pylist() == expected


def test_upsert_on_a_table_without_key_raises_value_error(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("keyless", key=())

    with pytest.raises(ValueError, match="warehouse.keyless declares no key"):
        lake.upsert(table, arrow_rows(table, [row(1)]), app_id="merge", version=1)
    assert not lake.exists(table)


# -- change feed and history -----------------------------------------------------------------------------


def test_change_feed_between_versions_gives_exactly_each_commits_changes(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("feed")
    lake.append(table, spark_rows(spark, [row(1), row(2, amount=None)]), app_id="feed", version=1)
    lake.upsert(
        table,
        spark_rows(spark, [row(1, traded_at=datetime(2024, 2, 1, 8, 0, 0, tzinfo=UTC)), row(3)]),
        app_id="feed",
        version=2,
    )

    assert feed(lake, table, 1, 1) == [
        change("insert", 1, row(1)),
        change("insert", 1, row(2, amount=None)),
    ]
    assert feed(lake, table, 2, 2) == [
        change("update_preimage", 2, row(1)),
        change("update_postimage", 2, row(1, traded_at=datetime(2024, 2, 1, 8, 0, 0, tzinfo=UTC))),
        change("insert", 2, row(3)),
    ]
    assert lake.changes(table, 1, 2).num_rows == 5
    assert lake.changes(table, 1, 2).column_names == [
        "id",
        "name",
        "amount",
        "trade_day",
        "traded_at",
        "_change_type",
        "_commit_version",
    ]
    for start, end in ((1, 1), (1, 2)):  # the first range only added files: read from them, not from delta-rs
        some = lake.changes(table, start, end, columns=["name", "id"])
        assert some.column_names == ["name", "id", "_change_type", "_commit_version"]
        expected = lake.changes(table, start, end).select(some.column_names)
        assert sorted(some.to_pylist(), key=str) == sorted(expected.to_pylist(), key=str)
        assert some.schema == expected.schema


def test_a_feed_of_appends_is_read_from_their_files_with_the_rows_delta_rs_gives(spark, lake_dir):
    """Commits that only add files (written by delta-rs and by Spark's executors) give their feed from those files
    (`streamdi.delta_appends`): the same rows and types as delta-rs's change data feed. A range with a MERGE in it is
    asked of delta-rs."""
    lake = Lake(lake_dir, spark)
    table = lake_table("appends")
    lake.append(table, arrow_rows(table, [row(1), row(2, amount=None, name=None)]), app_id="a", version=1)
    lake.append(table, spark_rows(spark, [row(3), row(4, trade_day=None)]), app_id="a", version=2)
    lake.upsert(table, arrow_rows(table, [row(1, name="changed")]), app_id="a", version=3)

    assert appended_files(lake.path(table), 1, 2) is not None
    assert appended_files(lake.path(table), 1, 3) is None
    from_delta_rs = pa.RecordBatchReader.from_stream(DeltaTable(lake.path(table)).load_cdf(1, 2)).read_all()
    expected = sorted(from_delta_rs.to_pylist(), key=lambda r: r["id"])
    for r in expected:
        del r["_commit_timestamp"]
    assert (
        feed(lake, table, 1, 2)
        == expected
        == [
            change("insert", 1, row(1)),
            change("insert", 1, row(2, amount=None, name=None)),
            change("insert", 2, row(3)),
            change("insert", 2, row(4, trade_day=None)),
        ]
    )
    assert lake.changes(table, 1, 2).schema == lake.changes(table, 1, 3).schema
    assert [r["_change_type"] for r in feed(lake, table, 3, 3)] == ["update_preimage", "update_postimage"]


def test_a_feed_still_held_is_not_read_again_and_threads_asking_together_share_one_read(lake_dir, monkeypatch):
    lake = Lake(lake_dir)
    table = lake_table("shared_feed")
    lake.append(table, arrow_rows(table, [row(1), row(2)]), app_id="a", version=1)
    lake.upsert(table, arrow_rows(table, [row(1, name="changed")]), app_id="a", version=2)
    reads = []
    read = lake._changes

    def counted(*args):
        reads.append(args[1:])  # (start, end, columns)
        time.sleep(0.2)  # long enough for every thread below to ask while the first read runs
        return read(*args)

    monkeypatch.setattr(lake, "_changes", counted)
    with ThreadPoolExecutor(4) as pool:
        feeds = list(pool.map(lambda _: lake.changes(table, 1, 2), range(4)))
    assert reads == [(1, 2, None)]
    assert all(f is feeds[0] for f in feeds) and feeds[0].num_rows == 4
    assert lake.changes(table, 1, 2) is feeds[0] and lake.changes(table, 2, 2).num_rows == 2
    assert reads == [(1, 2, None), (2, 2, None)]
    # a few columns of a feed someone holds: taken from it, not read
    some = lake.changes(table, 1, 2, columns=["id"])
    assert some.to_pylist() == feeds[0].select(["id", "_change_type", "_commit_version"]).to_pylist()
    assert reads == [(1, 2, None), (2, 2, None)]
    del feeds, some
    gc.collect()
    assert lake.changes(table, 1, 2, columns=["id"]).num_rows == 4  # nobody holds the feed: these columns read
    assert reads == [(1, 2, None), (2, 2, None), (1, 2, ["id"])]
    assert lake.changes(table, 1, 2).num_rows == 4  # nobody held it: read again
    assert reads == [(1, 2, None), (2, 2, None), (1, 2, ["id"]), (1, 2, None)]


def test_history_carries_the_app_transaction_of_each_streamdi_commit(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("history")
    lake.append(table, arrow_rows(table, [row(1)]), app_id="stage/x", version=7)
    lake.upsert(table, arrow_rows(table, [row(1, name="new")]), app_id="T0/x", version=8)
    lake.overwrite(table, arrow_rows(table, [row(5)]), app_id="rebuild", version=1)

    assert lake.history(table) == [
        CommitInfo(table_version=0, operation="CREATE TABLE", app_id=None, txn_version=None),
        CommitInfo(table_version=1, operation="WRITE", app_id="stage/x", txn_version=7),
        CommitInfo(table_version=2, operation="MERGE", app_id="T0/x", txn_version=8),
        CommitInfo(table_version=3, operation="WRITE", app_id="rebuild", txn_version=1),
    ]
    assert lake.read_arrow(table).to_pylist() == [row(5)]


def test_history_after_a_version_and_recent_history_read_only_the_newest_commits(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("recent")
    for batch in range(1, 41):  # two commits per micro-batch: table versions 2b-1 and 2b
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/a", version=batch)
        lake.append(table, arrow_rows(table, [row(100 + batch)]), app_id="stage/b", version=batch)

    assert [(c.table_version, c.txn_version) for c in lake.history(table, after=76)] == [
        (77, 39),
        (78, 39),
        (79, 40),
        (80, 40),
    ]
    assert lake.history(table, after=80) == []
    assert lake.history(table, after=-1) == lake.history(table)
    assert len(lake.history(table)) == 81

    # down to the newest commit of an earlier micro-batch, and no further than the next window
    recent = lake.recent_history(table, 40)
    assert recent[-3:] == lake.history(table, after=77)
    assert len(recent) == 8  # the first window (8 commits) already reaches micro-batch 39
    assert [c.table_version for c in lake.recent_history(table, 25) if c.txn_version == 25] == [49, 50]
    # the first micro-batch has no earlier one: the whole history, table creation included
    assert lake.recent_history(table, 1) == lake.history(table)


def test_history_after_a_version_is_read_from_the_commit_files_as_delta_rs_reads_it(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("from_files")
    lake.append(table, arrow_rows(table, [row(1), row(2)]), app_id="stage/x", version=4)
    lake.upsert(table, arrow_rows(table, [row(1, name="new"), row(3)]), app_id="T2/x", version=5)
    lake.overwrite(table, arrow_rows(table, [row(5)]), app_id="rebuild", version=6)

    by_delta_rs = [
        CommitInfo(e["version"], e["operation"], e.get("streamdi.app_id"), int(e["streamdi.txn_version"]))
        for e in reversed(DeltaTable(str(lake.path(table))).history(3))
    ]
    assert lake.history(table, after=0) == by_delta_rs
    assert [(c.table_version, c.operation, c.app_id, c.txn_version) for c in by_delta_rs] == [
        (1, "WRITE", "stage/x", 4),
        (2, "MERGE", "T2/x", 5),
        (3, "WRITE", "rebuild", 6),
    ]
    log_dir = lake.path(table) / "_delta_log"
    assert [i["version"] for i in commit_infos(log_dir, 2, 3)] == [3, 2]  # newest first, as delta-rs gives them
    assert commit_infos(log_dir, 2, 4) is None  # a commit file that is not there: the caller asks delta-rs


def delta_rs_feed(lake: Lake, table: Table, start: int, end: int, schema: pa.Schema) -> pa.Table:
    delta = DeltaTable(str(lake.path(table)))
    reader = delta.load_cdf(starting_version=start, ending_version=end, columns=schema.names)
    batches = pa.RecordBatchReader.from_stream(reader)
    return pa.Table.from_batches([b.select(schema.names).cast(schema) for b in batches], schema)


def test_change_feed_read_from_the_commits_files_equals_delta_rs_feed(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("feed_files")
    lake.append(table, arrow_rows(table, [row(i) for i in range(1, 6)]), app_id="a", version=1)  # v1
    lake.upsert(  # v2: a MERGE that updates 2, inserts 6 and deletes 3
        table, arrow_rows(table, [row(2, name="two"), row(6)]), app_id="m", version=2, deletes=pa.table({"id": [3]})
    )
    lake.overwrite(table, arrow_rows(table, [row(7), row(8)]), app_id="o", version=3)  # v3
    lake.upsert(table, arrow_rows(table, [row(8, name="eight"), row(9)]), app_id="m", version=4)  # v4

    changed = changed_files(lake.path(table), 2, 4)
    assert [(v, [kind for _, kind in files]) for v, files in changed] == [
        (2, [None]),  # the MERGE's change data file: its rows carry their own change type
        (3, ["delete", "insert"]),  # the overwrite: the file the MERGE left, removed; its new file
        (4, [None]),
    ]
    for start, end in [(2, 2), (2, 4), (3, 3), (4, 4)]:
        mine = lake.changes(table, start, end)
        theirs = delta_rs_feed(lake, table, start, end, mine.schema)
        order = [("_commit_version", "ascending"), ("id", "ascending"), ("_change_type", "ascending")]
        assert mine.sort_by(order).equals(theirs.sort_by(order)), (start, end)
    update = lake.changes(table, 2, 2).sort_by([("id", "ascending"), ("_change_type", "ascending")])
    assert [(r["id"], r["name"], r["_change_type"]) for r in update.to_pylist()] == [
        (2, "two", "update_postimage"),
        (2, "name-2", "update_preimage"),
        (3, "name-3", "delete"),
        (6, "name-6", "insert"),
    ]

    removed = [file for file, kind in changed[1][1] if kind == "delete"]
    removed[0].unlink()  # as a vacuum would: the overwrite's deleted rows are gone, delta-rs is asked
    assert changed_files(lake.path(table), 3, 3) is None
    assert changed_files(lake.path(table), 4, 4) is not None


def test_a_lake_sees_other_writers_commits_and_a_table_created_again_under_its_path(lake_dir):
    lake, other = Lake(lake_dir), Lake(lake_dir)
    table = lake_table("handles")
    lake.append(table, arrow_rows(table, [row(1)]), app_id="a", version=1)
    assert [r["id"] for r in lake.read_arrow(table).to_pylist()] == [1]
    other.append(table, arrow_rows(table, [row(2)]), app_id="a", version=2)
    assert [r["id"] for r in lake.read_arrow(table).to_pylist()] == [1, 2]  # its open table caught up

    shutil.rmtree(other.path(table))  # removed, then created again with MORE commits than `lake` saw
    for version, id_ in enumerate((3, 4, 5), start=1):
        other.append(table, arrow_rows(table, [row(id_)]), app_id="a", version=version)
    assert [r["id"] for r in lake.read_arrow(table).to_pylist()] == [3, 4, 5]
    assert lake.committed_version(table, "a") == 3
    assert [c.table_version for c in lake.history(table)] == [0, 1, 2, 3]


def test_app_transaction_versions_are_remembered_and_follow_other_writers_log_cleanup_and_a_new_table(
    lake_dir, monkeypatch
):
    """The exactly-once check and `committed_version` answer from the app transactions a Lake remembers, carried
    forward by the commit files made since (`AppTransactions`), asking delta-rs only what it cannot answer: after
    other writers' commits (one without a transaction), a log cleanup of the commits since, a table created again."""
    asked = []
    answer = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version", lambda d, app: asked.append(app) or answer(d, app))
    lake, other = Lake(lake_dir), Lake(lake_dir)
    table = lake_table("app_versions")
    path = lake.path(table)

    ids = iter(range(1, 100))

    def add(writer: Lake, app_id: str, version: int) -> CommitResult:
        return writer.append(table, arrow_rows(table, [row(next(ids))]), app_id=app_id, version=version)

    add(lake, "a", 1)
    assert lake.committed_version(table, "a") == 1 and lake.committed_version(table, "b") is None
    add(other, "b", 7)
    add(other, "a", 4)
    write_deltalake(str(path), arrow_rows(table, [row(next(ids))]), mode="append")  # a commit without a transaction
    asked.clear()
    assert lake.committed_version(table, "a") == 4 and lake.committed_version(table, "b") == 7
    assert not add(lake, "a", 4).committed and not add(lake, "b", 6).committed  # replays, skipped
    assert add(lake, "a", 5).committed and lake.committed_version(table, "a") == 5
    assert asked == []  # all from the commit files
    assert (DeltaTable(str(path)).transaction_version("a"), DeltaTable(str(path)).transaction_version("b")) == (5, 7)

    # the commits since the lake's last look are cleaned up: it asks delta-rs again
    for version in (6, 7):
        add(other, "a", version)
    other.maintain(checkpoint_every=1, retention_hours=0)
    for version in (8, 9):
        add(other, "a", version)
    other.maintain(checkpoint_every=1, retention_hours=0)
    assert not (path / "_delta_log" / f"{lake.version(table) - 3:020d}.json").exists()
    asked.clear()
    assert lake.committed_version(table, "a") == 9 and asked == ["a"]
    assert lake.committed_version(table, "b") == 7 and asked == ["a", "b"]

    shutil.rmtree(path)  # created again: its own transactions
    add(other, "b", 2)
    assert lake.committed_version(table, "a") is None and lake.committed_version(table, "b") == 2
    assert add(lake, "a", 1).committed and lake.committed_version(table, "a") == 1


def test_filtered_reads_never_serve_a_kept_dataset_of_an_older_or_replaced_table(lake_dir):
    """`read_where` and `read_columns` reuse the dataset of the version they read; a commit by another Lake, a
    compaction, or the table removed and created again at the SAME version number are read afresh."""
    lake, other = Lake(lake_dir), Lake(lake_dir)
    table = lake_table("kept_datasets")

    def ids() -> list[int]:
        return sorted(r["id"] for r in lake.read_where(table, pc.field("id") >= 0, ["id"]).to_pylist())

    lake.append(table, arrow_rows(table, [row(1)]), app_id="a", version=1)
    assert ids() == [1] and ids() == [1]
    other.append(table, arrow_rows(table, [row(2)]), app_id="a", version=2)
    assert ids() == [1, 2]
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == [1, 2]
    shutil.rmtree(other.path(table))  # created again: version 2 again, other rows
    other.append(table, arrow_rows(table, [row(3)]), app_id="a", version=1)
    other.append(table, arrow_rows(table, [row(4)]), app_id="a", version=2)
    assert lake.version(table) == 2
    assert ids() == [3, 4]
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == [3, 4]


def test_a_table_exists_once_its_log_has_a_commit_even_after_the_first_one_is_cleaned_up(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("existence")
    assert not lake.exists(table)
    (lake.path(table) / "_delta_log").mkdir(parents=True)  # a log without a commit is no table
    assert not lake.exists(table)
    for version in (1, 2):
        lake.append(table, arrow_rows(table, [row(version)]), app_id="a", version=version)
    assert lake.exists(table)
    DeltaTable(str(lake.path(table))).create_checkpoint()
    (lake.path(table) / "_delta_log" / "00000000000000000000.json").unlink()  # as a log cleanup leaves it
    assert Lake(lake_dir).exists(table)
    assert [r["id"] for r in Lake(lake_dir).read_arrow(table).to_pylist()] == [1, 2]


def test_a_table_id_survives_log_cleanup_and_a_table_created_again_under_the_path_has_another(lake_dir):
    """`table_id`: the Delta `metaData.id`, from the first commit, then from the newest checkpoint once the first
    commit is cleaned up (the caches and open handles of a long-running lake are keyed by it)."""
    lake = Lake(lake_dir)
    table = lake_table("identity")
    path = lake.path(table)
    assert table_id(path) is None  # no table yet
    lake.append(table, arrow_rows(table, [row(1)]), app_id="a", version=1)
    first = DeltaTable(str(path)).metadata().id
    assert table_id(path) == first and len(first) == 36  # a UUID
    DeltaTable(str(path)).create_checkpoint()
    (path / "_delta_log" / "00000000000000000000.json").unlink()  # as a log cleanup leaves it
    assert table_id(path) == first
    lake.append(table, arrow_rows(table, [row(2)]), app_id="a", version=2)
    DeltaTable(str(path)).create_checkpoint()  # a newer checkpoint names the same table
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 2
    assert table_id(path) == first

    shutil.rmtree(path)
    assert table_id(path) is None
    lake.append(table, arrow_rows(table, [row(3)]), app_id="a", version=1)
    again = DeltaTable(str(path)).metadata().id
    assert again != first and table_id(path) == again
    assert [r["id"] for r in lake.read_arrow(table).to_pylist()] == [3]


def test_read_reuses_the_dataframe_of_unchanged_files_and_never_serves_a_stale_snapshot(spark, lake_dir):
    lake, other = Lake(lake_dir, spark), Lake(lake_dir, spark)
    table = lake_table("frames")
    lake.append(table, arrow_rows(table, [row(1)]), app_id="a", version=1)
    first = lake.read(table)
    assert lake.read(table) is first  # same files: the kept DataFrame
    other.append(table, arrow_rows(table, [row(2)]), app_id="a", version=2)  # another writer
    assert sorted(r.id for r in lake.read(table).collect()) == [1, 2]
    assert sorted(r.id for r in lake.read(table, version=1).collect()) == [1]
    assert lake.read(table, version=1) is first  # the old version's files: the same DataFrame again

    shutil.rmtree(lake.path(table))  # created again under the same path: other files, other DataFrame
    other.append(table, arrow_rows(table, [row(7)]), app_id="a", version=1)
    assert [r.id for r in lake.read(table).collect()] == [7]


# -- other readers, protocol, drift ----------------------------------------------------------------------


# The child leaves with os._exit once its output is out, as the CLI does (`streamdi.run.cli.main`): delta-rs's threads
# can abort an interpreter's shutdown ("terminate called without an active exception", SIGABRT) after all work is done.
READ_IN_FRESH_PROCESS = (
    "import json, os, sys; from pathlib import Path; "
    f"sys.path.insert(0, {str(HERE)!r}); import test_lake as t; "
    "from streamdi.lake import Lake; "
    "rows = Lake(Path(sys.argv[1])).read_arrow(t.lake_table(sys.argv[2])).to_pylist(); "
    "print(json.dumps(rows, default=str)); sys.stdout.flush(); os._exit(0)"
)


def test_a_table_is_read_back_by_a_fresh_process_without_spark_and_keeps_a_portable_protocol(spark, lake_dir):
    lake = Lake(lake_dir, spark)
    table = lake_table("portable")
    lake.append(
        table,
        spark_rows(
            spark,
            [
                row(
                    2,
                    name=None,
                    amount=Decimal("0.15000"),
                    traded_at=datetime(2024, 3, 1, 9, 30, 15, 5, tzinfo=UTC),
                ),
                row(1, trade_day=None),
            ],
        ),
        app_id="portable",
        version=1,
    )

    child = run_child(READ_IN_FRESH_PROCESS, str(lake_dir), "portable")

    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == [
        {
            "id": 1,
            "name": "name-1",
            "amount": "1.50000",
            "trade_day": None,
            "traded_at": "2024-01-31 12:30:00+00:00",
        },
        {
            "id": 2,
            "name": None,
            "amount": "0.15000",
            "trade_day": "2024-01-31",
            "traded_at": "2024-03-01 09:30:15.000005+00:00",
        },
    ]
    delta = DeltaTable(str(lake_dir / "warehouse" / "portable"))
    protocol = delta.protocol()
    # Reader 1 / writer 4 (change feed) and no table features: no deletion vectors, no column mapping.
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 4)
    assert protocol.reader_features is None
    assert protocol.writer_features is None
    assert delta.metadata().configuration == {
        "delta.enableChangeDataFeed": "true",
        "delta.enableDeletionVectors": "false",
    }


def test_ensure_table_rejects_a_delta_table_whose_columns_drifted(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("drifted")
    path = lake_dir / "warehouse" / "drifted"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_deltalake(str(path), pa.table({"id": pa.array([1], pa.int32()), "legacy_code": pa.array(["x"])}))

    with pytest.raises(RuntimeError) as raised:
        lake.ensure_table(table)

    message = str(raised.value)
    assert "warehouse.drifted" in message
    assert "['id', 'legacy_code']" in message
    assert "['id', 'name', 'amount', 'trade_day', 'traded_at']" in message
    with pytest.raises(RuntimeError, match="legacy_code"):
        lake.append(table, arrow_rows(table, [row(1)]), app_id="drift", version=1)
    assert DeltaTable(str(path)).version() == 0


# -- crashes around a commit -------------------------------------------------------------------------------

CRASH_ROWS = [row(1, name="crash"), row(2, name=None, amount=Decimal("0.15000"))]


def child_append_crash_rows(root: str, name: str) -> None:
    """Entry point of the crash subprocess (no Spark): append CRASH_ROWS as crash@1, print the result."""
    table = lake_table(name)
    result = Lake(Path(root)).append(table, arrow_rows(table, CRASH_ROWS), app_id="crash", version=1)
    print(json.dumps({"committed": result.committed, "table_version": result.table_version, "rows": result.rows}))


APPEND_IN_CHILD = (  # leaves with os._exit, as READ_IN_FRESH_PROCESS does
    f"import os, sys; sys.path.insert(0, {str(HERE)!r}); import test_lake as t; "
    "t.child_append_crash_rows(sys.argv[1], sys.argv[2]); sys.stdout.flush(); os._exit(0)"
)


@pytest.mark.faults
def test_crash_after_commit_then_rerun_keeps_exactly_one_copy(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("crash_after")

    crashed = run_child(APPEND_IN_CHILD, str(lake_dir), "crash_after", STREAMDI_FAULT_AT="lake.after_commit")

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert crashed.stdout == ""
    assert lake.read_arrow(table).to_pylist() == CRASH_ROWS
    assert lake.committed_version(table, "crash") == 1

    rerun = run_child(APPEND_IN_CHILD, str(lake_dir), "crash_after")

    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {"committed": False, "table_version": 1, "rows": 0}
    assert lake.read_arrow(table).to_pylist() == CRASH_ROWS
    assert [(c.table_version, c.operation, c.app_id) for c in lake.history(table)] == [
        (0, "CREATE TABLE", None),
        (1, "WRITE", "crash"),
    ]


@pytest.mark.faults
def test_crash_before_commit_leaves_no_rows_and_the_rerun_commits_them_once(lake_dir):
    lake = Lake(lake_dir)
    table = lake_table("crash_before")

    crashed = run_child(APPEND_IN_CHILD, str(lake_dir), "crash_before", STREAMDI_FAULT_AT="lake.before_commit")

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert lake.version(table) == 0  # created before the lock, nothing committed
    assert lake.read_arrow(table).num_rows == 0
    assert lake.committed_version(table, "crash") is None

    rerun = run_child(APPEND_IN_CHILD, str(lake_dir), "crash_before")
    again = run_child(APPEND_IN_CHILD, str(lake_dir), "crash_before")

    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {"committed": True, "table_version": 1, "rows": 2}
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"committed": False, "table_version": 1, "rows": 0}
    assert lake.read_arrow(table).to_pylist() == CRASH_ROWS


# -- compaction ----------------------------------------------------------------------------------------------


def data_files(lake: Lake, table: Table) -> int:
    return DeltaTable(str(lake.path(table))).get_add_actions().num_rows


def test_compact_merges_small_files_and_keeps_rows_transactions_history_and_change_feed(tmp_path):
    lake = Lake(tmp_path)  # a lake of its own: compaction visits every table of the lake
    table, few = lake_table("compacted"), lake_table("few")
    for batch in range(1, 6):  # one small file per micro-batch
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)
    lake.upsert(table, arrow_rows(table, [row(1, name="new"), row(6)]), app_id="T0/x", version=6)
    for batch in (1, 2):
        lake.append(few, arrow_rows(few, [row(batch)]), app_id="stage/x", version=batch)
    files = data_files(lake, table)
    rows = lake.read_arrow(table).to_pylist()
    changes = feed(lake, table, 1, lake.version(table))
    history = lake.history(table)
    assert files == 5 and data_files(lake, few) == 2  # the MERGE replaced the file of id 1 with one more row

    assert lake.compact(3) == {"warehouse.compacted": files}  # `few` has 2 small files: left alone

    assert data_files(lake, table) == 1
    assert lake.read_arrow(table).to_pylist() == rows == [row(1, name="new"), *[row(i) for i in range(2, 7)]]
    assert lake.committed_version(table, "stage/x") == 5 and lake.committed_version(table, "T0/x") == 6
    compaction = CommitInfo(
        table_version=history[-1].table_version + 1, operation="OPTIMIZE", app_id=None, txn_version=None
    )
    assert lake.history(table) == [*history, compaction]
    assert feed(lake, table, 1, lake.version(table)) == changes  # the compaction commit has no change rows
    assert lake.changes(table, compaction.table_version, compaction.table_version).num_rows == 0
    assert lake.version(few) == 2 and data_files(lake, few) == 2

    assert lake.compact(3) == {}  # nothing left to do: no new commit
    assert lake.compact(0) == {}  # 0 turns compaction off
    assert lake.version(table) == compaction.table_version


def test_compacting_what_was_written_looks_only_at_the_tables_this_lake_committed_to_since(tmp_path):
    """`compact(written_only=True)`: the tables this Lake committed to since its last such call, not those another
    process wrote; a full pass still finds those."""
    mine, theirs = lake_table("mine"), lake_table("theirs")
    other = Lake(tmp_path)  # another process's writes
    for batch in range(1, 4):
        other.append(theirs, arrow_rows(theirs, [row(batch)]), app_id="stage/x", version=batch)
    lake = Lake(tmp_path)
    for batch in range(1, 4):
        lake.append(mine, arrow_rows(mine, [row(batch)]), app_id="stage/x", version=batch)

    assert lake.compact(3, written_only=True) == {"warehouse.mine": 3}
    lake.append(mine, arrow_rows(mine, [row(9)]), app_id="stage/x", version=9)
    assert lake.compact(3, written_only=True) == {}  # two small files now; `theirs` is not looked at
    assert data_files(lake, theirs) == 3
    assert lake.compact(3) == {"warehouse.theirs": 3}
    assert lake.read_arrow(theirs).to_pylist() == [row(i) for i in range(1, 4)]


COMPACT_IN_CHILD = (  # leaves with os._exit, as READ_IN_FRESH_PROCESS does
    "import os, sys; from pathlib import Path; from streamdi.lake import Lake; "
    "print(Lake(Path(sys.argv[1])).compact(2)); sys.stdout.flush(); os._exit(0)"
)


def parquet_on_disk(lake: Lake, table: Table) -> int:
    return sum(1 for _ in lake.path(table).glob("*.parquet"))


def feed_in_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["_commit_version"], r["_change_type"], r["id"]))


def change_files(lake: Lake, table: Table) -> set[str]:
    return {p.name for p in (lake.path(table) / "_change_data").glob("*.parquet")}


def change_files_named(lake: Lake, table: Table) -> set[str]:
    """The change files the commits still in the log name (their `cdc` actions), read here from the JSON files."""
    named = set()
    for commit in (lake.path(table) / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "cdc" in action:
                named.add(action["cdc"]["path"].removeprefix("_change_data/"))
    return named


def test_maintain_checkpoints_and_vacuums_tables_far_enough_past_their_last_checkpoint(tmp_path):
    """`maintain`: a table 5+ commits past its last checkpoint gets a checkpoint and loses the data files compaction
    replaced (retention 0); rows, app transactions and the newest change feed stay; a table with fewer commits is
    left alone; the table still opens (and `exists`) without its first commit file."""
    lake = Lake(tmp_path)
    table, young = lake_table("maintained"), lake_table("young")
    for batch in range(1, 7):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)
    lake.append(young, arrow_rows(young, [row(1)]), app_id="stage/x", version=1)
    assert lake.compact(3) == {"warehouse.maintained": 6}
    lake.upsert(table, arrow_rows(table, [row(2, name="new")]), app_id="T0/x", version=7)
    rows = lake.read_arrow(table).to_pylist()
    assert parquet_on_disk(lake, table) == 6 + 1 + 1  # the compacted six, their replacement, the MERGE's rewrite
    newest = lake.version(table)
    change = lake.changes(table, newest, newest).to_pylist()

    assert lake.maintain(checkpoint_every=5, retention_hours=0) == {"warehouse.maintained": 7}

    log_dir = lake.path(table) / "_delta_log"
    checkpoint = max(log_dir.glob("*.checkpoint.parquet"))
    tombstones = [r for r in pq.read_table(checkpoint).column("remove").to_pylist() if r]
    assert tombstones == []  # kept as long as the retention (0 here), not Delta's 7 days
    assert (
        DeltaTable(str(lake.path(table))).metadata().configuration["delta.deletedFileRetentionDuration"]
        == "interval 0 hours"
    )
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] >= newest
    assert parquet_on_disk(lake, table) == 1  # only the file of the current snapshot
    assert lake.read_arrow(table).to_pylist() == rows
    assert lake.committed_version(table, "stage/x") == 6 and lake.committed_version(table, "T0/x") == 7
    assert lake.changes(table, newest, newest).to_pylist() == change
    assert parquet_on_disk(lake, young) == 1 and not (lake.path(young) / "_delta_log" / "_last_checkpoint").exists()
    assert lake.maintain(checkpoint_every=5, retention_hours=0) == {}  # nothing new since the checkpoint
    assert lake.maintain(checkpoint_every=0, retention_hours=0) == {}  # 0 turns maintenance off

    (log_dir / "00000000000000000000.json").unlink()  # as the log cleanup does past the log retention
    assert Lake(tmp_path).exists(table)
    assert Lake(tmp_path).read_arrow(table).to_pylist() == rows


def test_maintain_deletes_the_log_before_the_previous_checkpoint_and_readers_still_catch_up(tmp_path):
    """The log keeps the commits since the previous checkpoint, not 30 days of them (a catch-up lists the log
    directory): after two maintenances the commit files and checkpoints before the first are gone; a reader's
    handle still on a deleted version opens the table afresh, one on a kept version catches up, and the app
    transactions and the history of the kept commits are what they were."""
    lake = Lake(tmp_path)
    table = lake_table("cleaned")
    for batch in range(1, 4):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)
    stale = Lake(tmp_path)
    assert stale.read_arrow(table).num_rows == 3  # a handle at version 3
    for batch in range(4, 7):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)
    assert lake.maintain(checkpoint_every=5, retention_hours=0) == {"warehouse.cleaned": 0}
    kept = Lake(tmp_path)
    assert kept.read_arrow(table).num_rows == 6  # a handle at version 7, the first checkpoint
    log_dir = lake.path(table) / "_delta_log"
    assert sorted(p.name for p in log_dir.glob("*.json"))[0] == "00000000000000000000.json"  # none before: all kept
    for batch in range(7, 13):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)

    assert lake.maintain(checkpoint_every=5, retention_hours=0) == {"warehouse.cleaned": 0}

    # versions 1-6 the appends, 7 the first maintenance's tombstone retention (a commit without data), 8-13 the appends
    assert sorted(int(p.name[:20]) for p in log_dir.glob("*.json")) == list(range(7, 14))
    assert sorted(int(p.name[:20]) for p in log_dir.glob("*.checkpoint.parquet")) == [7, 13]
    everything = [row(b) for b in range(1, 13)]
    assert sorted(stale.read_arrow(table).to_pylist(), key=lambda r: r["id"]) == everything
    assert sorted(kept.read_arrow(table).to_pylist(), key=lambda r: r["id"]) == everything
    assert Lake(tmp_path).committed_version(table, "stage/x") == 12
    assert [c.table_version for c in lake.history(table, after=2)] == list(range(7, 14))
    assert [c.txn_version for c in lake.history(table, after=2)] == [None, *range(7, 13)]
    lake.append(table, arrow_rows(table, [row(13)]), app_id="stage/x", version=13)
    assert [c.txn_version for c in Lake(tmp_path).recent_history(table, 13)][-2:] == [12, 13]


def test_maintain_deletes_the_change_files_of_the_commits_the_log_no_longer_holds(tmp_path):
    """delta-rs's vacuum leaves `_change_data/` alone: `maintain` deletes the change files of the commits its log
    cleanup took (no change feed can read them), once older than the retention; the kept commits' files stay and
    their change feed reads as before."""
    lake = Lake(tmp_path)
    table = lake_table("changing")
    lake.append(table, arrow_rows(table, [row(1), row(2)]), app_id="stage/x", version=1)
    for batch in range(2, 14):  # each MERGE changes one row: one change file a commit
        lake.upsert(table, arrow_rows(table, [row(1 + batch % 2, name=f"v{batch}")]), app_id="T0/x", version=batch)
    assert len(change_files(lake, table)) == 12
    assert lake.maintain(checkpoint_every=5, retention_hours=1) == {"warehouse.changing": 0}  # all younger than 1 h
    assert len(change_files(lake, table)) == 12
    lake.upsert(table, arrow_rows(table, [row(1, name="v14")]), app_id="T0/x", version=14)
    newest = lake.version(table)
    feed = feed_in_order(lake.changes(table, newest - 1, newest).to_pylist())
    data_before = parquet_on_disk(lake, table)

    deleted = lake.maintain(checkpoint_every=1, retention_hours=0)

    kept = change_files(lake, table)
    assert kept == change_files_named(lake, table)
    assert parquet_on_disk(lake, table) == 1  # the replaced data files vacuumed too, and counted with the change files
    assert deleted == {"warehouse.changing": (data_before - 1) + (13 - len(kept))}
    first_kept = min(int(p.name[:20]) for p in (lake.path(table) / "_delta_log").glob("*.json"))
    assert first_kept > 2 and 0 < len(kept) < 13  # the cleanup took commits with change files, and kept some
    assert feed_in_order(lake.changes(table, newest - 1, newest).to_pylist()) == feed
    assert sorted(lake.read_arrow(table).to_pylist(), key=lambda r: r["id"]) == [
        row(1, name="v14"),
        row(2, name="v13"),
    ]


@pytest.mark.faults
def test_crash_after_compaction_keeps_the_rows_and_the_rerun_finds_nothing_to_do(tmp_path):
    lake = Lake(tmp_path)
    table = lake_table("crash_compact")
    for batch in (1, 2, 3):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)

    crashed = run_child(COMPACT_IN_CHILD, str(tmp_path), STREAMDI_FAULT_AT="lake.after_compact")

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2), row(3)]
    assert data_files(lake, table) == 1
    rerun = run_child(COMPACT_IN_CHILD, str(tmp_path))
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "{}"
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2), row(3)]


def test_a_table_that_cannot_be_compacted_is_logged_and_the_others_are_compacted(tmp_path, caplog):
    lake = Lake(tmp_path)
    table = lake_table("zz_fine")  # after the broken one in the lake's order
    for batch in (1, 2):
        lake.append(table, arrow_rows(table, [row(batch)]), app_id="stage/x", version=batch)
    broken = tmp_path / "warehouse" / "broken" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("this is not a Delta log\n")

    assert lake.compact(2) == {"warehouse.zz_fine": 2}

    assert "could not compact warehouse.broken" in caplog.text
    assert lake.read_arrow(table).to_pylist() == [row(1), row(2)]


def test_a_table_with_its_own_file_size_is_written_in_files_of_that_size_and_merged_file_by_file(tmp_path):
    """`Table.file_bytes` (DimTrade): the rows are spread over files of about that size, in key order, so a MERGE
    of the latest keys rewrites one file, not the table; compaction leaves such files alone."""
    lake = Lake(tmp_path)
    base = lake_table("sized")
    table = Table(base.name, base.layer, base.columns, key=base.key, order_by=base.order_by, file_bytes=64 * 1024)
    rows = [row(i, name=f"trade {i * 7919 % 100003:06d}") for i in range(30_000)]
    lake.append(table, arrow_rows(table, rows), app_id="T3/x", version=1)
    before = set(DeltaTable(str(lake.path(table))).file_uris())
    assert len(before) >= 5

    lake.upsert(table, arrow_rows(table, [row(29_999, name="closed"), row(30_000)]), app_id="T3/x", version=2)
    after = set(DeltaTable(str(lake.path(table))).file_uris())
    assert len(before - after) == 1 and len(after - before) == 1  # one file rewritten, with the new key
    assert lake.row_count(table) == 30_001
    assert lake.read_where(table, pc.field("id") >= 29_999).sort_by("id").to_pylist() == [
        row(29_999, name="closed"),
        row(30_000),
    ]
    assert lake.compact(2) == {}


def test_a_merge_opens_only_the_files_that_can_hold_its_keys(tmp_path):
    """An upsert (with or without deletes) reads only the data files whose key range meets the source's keys:
    with the file of the first keys gone from disk, upserts and deletes of the latest keys still succeed. (Streamed,
    delta-rs's MERGE scans every file of the table; a micro-batch then pays for the whole DimTrade.)"""
    lake = Lake(tmp_path)
    base = lake_table("pruned")
    table = Table(base.name, base.layer, base.columns, key=base.key, order_by=base.order_by, file_bytes=64 * 1024)
    lake.append(table, arrow_rows(table, [row(i) for i in range(30_000)]), app_id="T3/x", version=1)
    files = pa.table(DeltaTable(str(lake.path(table))).get_add_actions(flatten=True)).to_pylist()
    assert len(files) >= 5
    first = next(f for f in files if f["min.id"] == 0)
    (lake.path(table) / first["path"]).unlink()

    lake.upsert(table, arrow_rows(table, [row(29_999, name="closed"), row(30_000)]), app_id="T3/x", version=2)
    lake.upsert(
        table,
        arrow_rows(table, [row(30_001)]),
        app_id="T3/x",
        version=3,
        deletes=pa.table({"id": pa.array([29_998, 40_000], pa.int64())}),
    )
    assert lake.read_where(table, pc.field("id") >= 29_997, ["id", "name"]).sort_by("id").to_pylist() == [
        {"id": 29_997, "name": row(29_997)["name"]},
        {"id": 29_999, "name": "closed"},
        {"id": 30_000, "name": row(30_000)["name"]},
        {"id": 30_001, "name": row(30_001)["name"]},
    ]


def test_string_conditions_and_deletes_work_on_files_a_merge_wrote(tmp_path):
    """delta-rs's MERGE writes string columns as string_view, which a pyarrow scan cannot compare with a string:
    filtered reads and an upsert's deletes on a string key still find the right rows (found when T2 deleted a
    resolved alert from a DImessages that earlier MERGEs had written)."""
    import pyarrow.parquet as pq

    lake = Lake(tmp_path)
    table = lake_table("by_name", key=("name",))
    lake.append(table, arrow_rows(table, [row(i, name=f"n{i}") for i in range(4)]), app_id="T2/x", version=1)
    lake.upsert(table, arrow_rows(table, [row(10, name="n1"), row(4, name="n4")]), app_id="T2/x", version=2)
    merged = [pq.read_schema(u.removeprefix("file://")) for u in DeltaTable(str(lake.path(table))).file_uris()]
    assert pa.string_view() in {s.field("name").type for s in merged}  # what makes the plain scan fail

    assert lake.read_where(table, pc.field("name").isin(["n1", "n4"]), ["name", "id"]).sort_by("name").to_pylist() == [
        {"name": "n1", "id": 10},
        {"name": "n4", "id": 4},
    ]
    assert lake.read_where(table, pc.field("name") >= "n3").num_rows == 2
    lake.upsert(
        table,
        arrow_rows(table, [row(5, name="n5")]),
        app_id="T2/x",
        version=3,
        deletes=pa.table({"name": ["n0", "n4", "absent"]}),
    )
    assert sorted(lake.read_arrow(table)["name"].to_pylist()) == ["n1", "n2", "n3", "n5"]


def test_files_are_written_in_compressed_row_groups_of_bounded_size(tmp_path):
    """Appends, MERGEs and compaction write row groups of at most `ROW_GROUP_ROWS` rows (a filtered read skips the
    others by their statistics), Snappy-compressed (delta-rs writes uncompressed files when given writer
    properties without a compression)."""
    import pyarrow.parquet as pq

    from streamdi.lake import ROW_GROUP_ROWS

    lake = Lake(tmp_path)
    table = lake_table("row_groups")
    count = 2 * ROW_GROUP_ROWS + 10
    lake.append(table, arrow_rows(table, [row(i) for i in range(count)]), app_id="stage/x", version=1)
    lake.upsert(table, arrow_rows(table, [row(0, name="changed"), row(count)]), app_id="T0/x", version=2)
    for batch in range(3, 6):
        lake.append(table, arrow_rows(table, [row(count + batch)]), app_id="stage/x", version=batch)
    lake.compact(3)
    for uri in DeltaTable(str(lake.path(table))).file_uris():
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        assert all(g.num_rows <= ROW_GROUP_ROWS for g in groups), uri
        assert {g.column(c).compression for g in groups for c in range(g.num_columns)} == {"SNAPPY"}, uri
    assert lake.row_count(table) == count + 4


def test_a_merge_reads_only_the_files_near_its_keys_even_when_they_span_the_table(tmp_path):
    """The join bounds the target by the source's keys in ranges split at their widest gaps
    (`streamdi.merge_bounds`): with a file from the middle of the key range gone from disk, upserts and deletes of
    keys at both ends (DimTrade: old trades updated, new ones inserted) still succeed and change exactly their rows."""
    lake = Lake(tmp_path)
    base = lake_table("spanned")
    table = Table(base.name, base.layer, base.columns, key=base.key, order_by=base.order_by, file_bytes=64 * 1024)
    lake.append(table, arrow_rows(table, [row(i) for i in range(30_000)]), app_id="T3/x", version=1)
    files = pa.table(DeltaTable(str(lake.path(table))).get_add_actions(flatten=True)).to_pylist()
    middle = next(f for f in files if f["min.id"] <= 15_000 <= f["max.id"])
    assert middle["min.id"] > 10 and middle["max.id"] < 29_990
    (lake.path(table) / middle["path"]).unlink()

    lake.upsert(
        table,
        arrow_rows(table, [row(3, name="old"), row(29_999, name="closed"), row(30_000)]),
        app_id="T3/x",
        version=2,
    )
    lake.upsert(
        table,
        arrow_rows(table, [row(30_001)]),
        app_id="T3/x",
        version=3,
        deletes=pa.table({"id": pa.array([2, 29_998], pa.int64())}),
    )
    outer = (pc.field("id") <= 4) | (pc.field("id") >= 29_997)
    assert lake.read_where(table, outer, ["id", "name"]).sort_by("id").to_pylist() == [
        {"id": 0, "name": "name-0"},
        {"id": 1, "name": "name-1"},
        {"id": 3, "name": "old"},
        {"id": 4, "name": "name-4"},
        {"id": 29_997, "name": "name-29997"},
        {"id": 29_999, "name": "closed"},
        {"id": 30_000, "name": "name-30000"},
        {"id": 30_001, "name": "name-30001"},
    ]


def test_a_merge_bounds_the_second_key_column_per_value_of_the_first(tmp_path):
    """A key led by a column of few values (market slices: level, then block) is bounded per level: the newest
    block of each level is rewritten although the blocks of all levels together span every file."""
    lake = Lake(tmp_path)
    table = Table(
        "levels",
        "warehouse",
        (C("level", "int", False), C("block", "int", False), C("value", "bigint", False)),
        key=("level", "block"),
        order_by=("level", "block"),
        file_bytes=16 * 1024,
    )

    def rows(pairs: list[tuple[int, int, int]]) -> pa.Table:
        return pa.Table.from_pylist(
            [{"level": lv, "block": b, "value": v} for lv, b, v in pairs], schema=table.arrow_schema()
        )

    lake.append(table, rows([(lv, b, 0) for lv in (1, 2) for b in range(20_000)]), app_id="T4/x", version=1)
    files = pa.table(DeltaTable(str(lake.path(table))).get_add_actions(flatten=True)).to_pylist()
    inner = [
        f
        for f in files
        if (f["min.level"], f["min.block"]) > (1, 100) and (f["max.level"], f["max.block"]) < (2, 19_000)
    ]
    assert len(inner) >= 2
    for f in inner:  # everything between level 1's first blocks and level 2's last ones
        (lake.path(table) / f["path"]).unlink()

    lake.upsert(table, rows([(1, 5, 1), (2, 19_999, 2), (2, 20_000, 3)]), app_id="T4/x", version=2)
    edges = ((pc.field("level") == 1) & (pc.field("block") <= 6)) | (
        (pc.field("level") == 2) & (pc.field("block") >= 19_998)
    )
    got = lake.read_where(table, edges).sort_by([("level", "ascending"), ("block", "ascending")]).to_pylist()
    assert [(r["level"], r["block"], r["value"]) for r in got] == [
        *[(1, b, 1 if b == 5 else 0) for b in range(7)],
        (2, 19_998, 0),
        (2, 19_999, 2),
        (2, 20_000, 3),
    ]


def resident_table(name: str) -> Table:
    base = lake_table(name)
    return dataclasses.replace(base, resident=True)


def hide_files(lake: Lake, table: Table, away: Path) -> None:
    away.mkdir(exist_ok=True)
    for f in lake.path(table).glob("*.parquet"):
        f.rename(away / f.name)


def restore_files(lake: Lake, table: Table, away: Path) -> None:
    for f in away.glob("*.parquet"):
        f.rename(lake.path(table) / f.name)


def test_a_resident_table_is_filtered_in_memory_once_its_reads_cost_a_whole_read(tmp_path):
    """`Table.resident`: a version is read from its files until those reads have cost what a whole read would (a
    small table: after its first read); then the whole snapshot is held in memory and filtered there (the same
    rows, the declared types; proven with the data files moved away). A new version, from any writer, has its new
    rows; the table created again at the same version number is read from its own files."""
    lake, other = Lake(tmp_path / "lake"), Lake(tmp_path / "lake")
    table = resident_table("resident")
    away = tmp_path / "away"
    lake.append(table, arrow_rows(table, [row(i) for i in range(100)]), app_id="a", version=1)
    wanted = pc.field("id").isin(pa.array([3, 5, 97], pa.int64()))  # an int64 value set on the int column

    first = lake.read_where(table, wanted)
    assert first.sort_by("id").to_pylist() == [row(3), row(5), row(97)]
    assert lake.read_where(table, wanted).sort_by("id").to_pylist() == [row(3), row(5), row(97)]
    hide_files(lake, table, away)
    held = lake.read_where(table, (pc.field("id") >= 98) | (pc.field("name") == "name-1"), ["name", "id"])
    assert held.schema == pa.schema([table.arrow_schema().field("name"), table.arrow_schema().field("id")])
    assert held.sort_by("id").to_pylist() == [
        {"name": "name-1", "id": 1},
        {"name": "name-98", "id": 98},
        {"name": "name-99", "id": 99},
    ]
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == list(range(100))

    restore_files(lake, table, away)
    other.append(table, arrow_rows(table, [row(100)]), app_id="a", version=2)
    assert lake.read_where(table, pc.field("id") >= 99, ["id"]).sort_by("id")["id"].to_pylist() == [99, 100]

    shutil.rmtree(other.path(table))  # created again: version 2 again, other rows
    other.append(table, arrow_rows(table, [row(7)]), app_id="a", version=1)
    other.append(table, arrow_rows(table, [row(8)]), app_id="a", version=2)
    assert lake.read_where(table, pc.field("id") >= 0, ["id"]).sort_by("id")["id"].to_pylist() == [7, 8]


def test_a_held_table_reads_only_the_files_a_new_version_adds_and_lets_the_removed_ones_go(tmp_path):
    """A held resident table is held per data file: a new version (an append by another writer) reads only the file
    it added (proven with the older files moved away), and a MERGE's version puts the rows of the files it wrote
    beside those of the files it left alone, without the rows of the files it removed."""
    lake, other = Lake(tmp_path / "lake"), Lake(tmp_path / "lake")
    table = resident_table("held_per_file")
    away = tmp_path / "away"
    other.append(table, arrow_rows(table, [row(i) for i in range(50)]), app_id="a", version=1)
    other.append(table, arrow_rows(table, [row(i) for i in range(50, 100)]), app_id="a", version=2)
    for _ in range(2):  # from its files, then held
        assert lake.read_where(table, pc.field("id") == 3, ["id"])["id"].to_pylist() == [3]

    hide_files(lake, table, away)
    other.append(table, arrow_rows(table, [row(100), row(101)]), app_id="a", version=3)
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == list(range(102))
    assert lake.read_where(table, pc.field("id") >= 99, ["id", "name"]).sort_by("id").to_pylist() == [
        {"id": 99, "name": "name-99"},
        {"id": 100, "name": "name-100"},
        {"id": 101, "name": "name-101"},
    ]

    restore_files(lake, table, away)
    other.upsert(table, arrow_rows(table, [row(7, name="changed"), row(102)]), app_id="b", version=4)
    got = lake.read_where(table, pc.field("id").isin([6, 7, 8, 102]), ["id", "name"]).sort_by("id").to_pylist()
    assert got == [
        {"id": 6, "name": "name-6"},
        {"id": 7, "name": "changed"},
        {"id": 8, "name": "name-8"},
        {"id": 102, "name": "name-102"},
    ]
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == list(range(103))


def test_a_held_table_is_given_the_rows_its_own_append_wrote(tmp_path):
    """A held resident table gets the rows of the file its own append wrote (a micro-batch's staged records, read by
    the steps right after): with every data file moved away, the new version is read whole from memory, with the
    rows and types a read from the files gives."""
    lake = Lake(tmp_path / "lake")
    table = resident_table("held_append")
    away = tmp_path / "away"
    lake.append(table, arrow_rows(table, [row(i) for i in range(50)]), app_id="a", version=1)
    for _ in range(2):  # from its files, then held
        assert lake.read_where(table, pc.field("id") == 3, ["id"])["id"].to_pylist() == [3]
    lake.append(table, arrow_rows(table, [row(i) for i in range(50, 60)]), app_id="a", version=2)
    from_files = Lake(tmp_path / "lake").read_columns(table, table.column_names)  # another process, from the files

    hide_files(lake, table, away)
    held = lake.read_columns(table, table.column_names).sort_by("id")
    assert held.schema == table.arrow_schema() and held.num_rows == 60  # the declared types, as a held read gives
    assert held.equals(from_files.sort_by("id").cast(held.schema))
    assert lake.read_where(table, pc.field("id") >= 58, ["id", "name"]).sort_by("id").to_pylist() == [
        {"id": 58, "name": "name-58"},
        {"id": 59, "name": "name-59"},
    ]


def test_a_fold_over_files_computes_each_data_file_once_and_forgets_the_files_a_commit_removed(tmp_path):
    """`Lake.fold_files`: one value per data file of the latest snapshot, each file's computed once per fold name; an
    append computes its new file only; a MERGE's rewritten file is computed and the file it replaced is gone."""
    lake = Lake(tmp_path / "lake")
    table = lake_table("folded")
    folded: list[int] = []

    def total(rows: pa.Table) -> int:
        folded.append(rows.num_rows)
        return int(pc.sum(rows["id"]).as_py() or 0)

    lake.append(table, arrow_rows(table, [row(i) for i in range(1, 4)]), app_id="a", version=1)
    lake.append(table, arrow_rows(table, [row(10)]), app_id="a", version=2)
    assert sorted(lake.fold_files(table, ["id"], "sum", total).values()) == [6, 10]
    assert sorted(lake.fold_files(table, ["id"], "sum", total).values()) == [6, 10] and sorted(folded) == [1, 3]
    lake.append(table, arrow_rows(table, [row(20)]), app_id="a", version=3)
    assert sorted(lake.fold_files(table, ["id"], "sum", total).values()) == [6, 10, 20] and len(folded) == 3
    lake.upsert(table, arrow_rows(table, [row(10, name="changed"), row(11)]), app_id="b", version=4)
    assert sum(lake.fold_files(table, ["id"], "sum", total).values()) == 6 + 10 + 11 + 20

    # another process (a new Lake) takes the values it is given for the files it has not folded, and folds the rest
    files, before = list(lake.fold_files(table, ["id"], "sum", total)), len(folded)
    again = Lake(tmp_path / "lake")
    got = again.fold_files(table, ["id"], "sum", total, known=lambda: {files[0]: -1})
    assert list(got) == files and got[files[0]] == -1
    assert len(folded) == before + len(files) - 1


def test_a_resident_table_whose_reads_cost_less_than_a_whole_read_stays_on_disk(tmp_path):
    """A one-shot process whose few reads skip most of a table never pays its whole read: priced at one byte a
    second, the whole read of this table costs more than any number of its filtered reads, so none is held (proven
    with the data files moved away: the next read fails)."""
    lake = Lake(tmp_path / "lake", whole_read_rate=1.0)
    table = resident_table("cheap_reads")
    lake.append(table, arrow_rows(table, [row(i) for i in range(100)]), app_id="a", version=1)
    for _ in range(5):
        assert lake.read_where(table, pc.field("id") == 3).to_pylist() == [row(3)]
    hide_files(lake, table, tmp_path / "away")
    with pytest.raises(Exception, match="(?i)no such file|not found"):
        lake.read_where(table, pc.field("id") == 3)


@pytest.mark.parametrize(
    ("resident", "budget"),
    [(True, 0), (True, 1024), (False, 1024 * 1024 * 1024)],
    ids=["no-memory", "smaller-than-the-table", "not-declared-resident"],
)
def test_a_table_is_read_from_its_files_when_not_resident_or_over_its_budget(tmp_path, resident, budget):
    lake = Lake(tmp_path / "lake", resident_bytes=budget)
    table = resident_table("too_big") if resident else lake_table("not_resident")
    lake.append(table, arrow_rows(table, [row(i) for i in range(2_000)]), app_id="a", version=1)
    for _ in range(3):
        assert lake.read_where(table, pc.field("id") == 5, ["id"])["id"].to_pylist() == [5]
    hide_files(lake, table, tmp_path / "away")
    with pytest.raises(OSError):
        lake.read_where(table, pc.field("id") == 5, ["id"])


def test_an_upsert_leaves_out_rows_equal_to_the_table_and_changes_exactly_the_others(tmp_path):
    """`Table.skip_equal_rows` (DimTrade): the source's rows equal to the table's, NULLs included, are left out
    before the MERGE; the rows, the change feed and the replay are those of a MERGE of everything. A source whose
    changed rows are all new keys is appended; one with nothing changed records only the app transaction."""
    lake = Lake(tmp_path)
    table = dataclasses.replace(lake_table("equal_rows"), skip_equal_rows=True)
    nulls = {"name": None, "amount": None, "trade_day": None, "traded_at": None}
    lake.append(table, arrow_rows(table, [row(1), row(2, **nulls), row(3), row(4)]), app_id="T3/x", version=1)

    source = [row(1), row(2, **nulls), row(3, name="changed"), row(4, amount=None), row(5)]
    result = lake.upsert(table, arrow_rows(table, source), app_id="T3/x", version=2)
    assert (result.committed, result.table_version) == (True, 2)
    assert lake.read_arrow(table).to_pylist() == [
        row(1),
        row(2, **nulls),
        row(3, name="changed"),
        row(4, amount=None),
        row(5),
    ]
    assert feed(lake, table, 2, 2) == [
        change("update_preimage", 2, row(3)),
        change("update_postimage", 2, row(3, name="changed")),
        change("update_preimage", 2, row(4)),
        change("update_postimage", 2, row(4, amount=None)),
        change("insert", 2, row(5)),
    ]
    again = lake.upsert(table, arrow_rows(table, source), app_id="T3/x", version=2)
    assert again.committed is False and lake.version(table) == 2

    appended = lake.upsert(table, arrow_rows(table, [row(1), row(6)]), app_id="T3/x", version=3)
    assert appended.table_version == 3 and DeltaTable(str(lake.path(table))).history(1)[0]["operation"] == "WRITE"
    assert feed(lake, table, 3, 3) == [change("insert", 3, row(6))]
    same = lake.upsert(table, arrow_rows(table, [row(2, **nulls), row(6)]), app_id="T3/x", version=4)
    assert same.table_version == 4 and lake.changes(table, 4, 4).num_rows == 0
    assert lake.committed_version(table, "T3/x") == 4
    deleted = lake.upsert(
        table,
        arrow_rows(table, [row(1)]),
        app_id="T3/x",
        version=5,
        deletes=pa.table({"id": pa.array([6], pa.int64())}),
    )
    assert deleted.committed and [r["id"] for r in lake.read_arrow(table).to_pylist()] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("budget", [RESIDENT_BYTES, 0], ids=["held", "no-memory"])
def test_an_upsert_into_a_held_table_finds_its_equal_rows_in_memory(tmp_path, budget):
    """A resident table with `skip_equal_rows` (DimTrade) that is held looks up the rows equal to an upsert's in
    memory, not in its files: with the data files moved away, an upsert of equal rows still records its app
    transaction and changes nothing; without memory for resident tables the same upsert needs the files. Back with
    its files, a changed row and a new one are merged as usual."""
    lake = Lake(tmp_path / "lake", resident_bytes=budget)
    table = dataclasses.replace(resident_table("held_equal_rows"), skip_equal_rows=True)
    lake.append(table, arrow_rows(table, [row(i) for i in range(100)]), app_id="T3/x", version=1)
    for _ in range(2):  # from its files, then held
        assert lake.read_where(table, pc.field("id") == 3, ["id"])["id"].to_pylist() == [3]
    away = tmp_path / "away"
    hide_files(lake, table, away)
    equal = arrow_rows(table, [row(5), row(50), row(99)])
    if budget == 0:
        with pytest.raises(OSError):
            lake.upsert(table, equal, app_id="T3/x", version=2)
        return
    result = lake.upsert(table, equal, app_id="T3/x", version=2)
    assert (result.committed, result.table_version) == (True, 2) and lake.committed_version(table, "T3/x") == 2

    restore_files(lake, table, away)
    lake.upsert(table, arrow_rows(table, [row(5), row(50, name="changed"), row(100)]), app_id="T3/x", version=3)
    assert lake.read_arrow(table).sort_by("id").to_pylist() == [
        *(row(i) for i in range(50)),
        row(50, name="changed"),
        *(row(i) for i in range(51, 101)),
    ]
    assert [(c["_change_type"], c["id"]) for c in feed(lake, table, 3, 3)] == [
        ("update_preimage", 50),
        ("update_postimage", 50),
        ("insert", 100),
    ]


def test_a_resident_table_that_does_not_fit_beside_the_held_ones_is_read_from_its_files(tmp_path):
    """Resident tables never push each other out: one that does not fit in the memory left beside the tables held
    (estimated from its Parquet size) is read from its files, and the held one stays held."""
    root = tmp_path / "lake"
    held, other = resident_table("held_first"), resident_table("no_room")
    writer = Lake(root)
    writer.append(held, arrow_rows(held, [row(i, name="x" * 1_000) for i in range(2_000)]), app_id="a", version=1)
    writer.append(
        other, arrow_rows(other, [row(i, name=os.urandom(150).hex()) for i in range(2_000)]), app_id="a", version=1
    )
    parquet_other = sum(
        pa.table(DeltaTable(str(writer.path(other))).get_add_actions(flatten=True))["size_bytes"].to_pylist()
    )
    arrow_held = writer.read_arrow(held).nbytes
    assert arrow_held <= 10 * parquet_other  # the budget below holds `held`, and `other` alone, not both
    lake = Lake(root, resident_bytes=5 * parquet_other + arrow_held // 2)

    for table in (held, other, held, other):
        assert lake.read_where(table, pc.field("id") == 7, ["id"])["id"].to_pylist() == [7]
    hide_files(lake, held, tmp_path / "away_held")
    assert lake.read_where(held, pc.field("id") == 9, ["id"])["id"].to_pylist() == [9]  # held in memory
    hide_files(lake, other, tmp_path / "away_other")
    with pytest.raises(OSError):
        lake.read_where(other, pc.field("id") == 9, ["id"])


def test_threads_in_turn_open_a_table_once_and_a_read_beside_a_commit_sees_one_whole_version(lake_dir):
    """Open Delta tables are lent (`streamdi.lending`): threads that read one after another share one handle, caught
    up with every commit; a thread reading while another commits gets a handle of its own, and sees one version."""
    lake = Lake(lake_dir)
    table = lake_table("lent")
    lake.append(table, arrow_rows(table, [row(1), row(2)]), app_id="a", version=1)
    opened = []
    opener = lake._handles._open

    def counted(path):
        opened.append(path)
        return opener(path)

    lake._handles._open = counted
    with ThreadPoolExecutor(1) as one, ThreadPoolExecutor(1) as other:
        for i in range(4):
            pool = one if i % 2 else other
            pool.submit(lake.append, table, arrow_rows(table, [row(10 + i)]), app_id="a", version=2 + i).result()
            assert pool.submit(lake.read_columns, table, ["id"]).result()["id"].to_pylist().count(10 + i) == 1
    assert opened == []  # every thread was lent the handle the first append opened, before the counting

    committing, go = threading.Event(), threading.Event()

    def slow_rows():  # a commit that holds its handle until the reader below has read
        committing.set()
        assert go.wait(10)
        return 1

    with ThreadPoolExecutor(2) as pool:
        commit = pool.submit(lake._checked_commit, table, "b", 1, "append", lambda delta: slow_rows(), lambda *_: None)
        assert committing.wait(10)
        ids = pool.submit(lake.read_columns, table, ["id"]).result()["id"].to_pylist()
        go.set()
        assert commit.result().committed
    assert sorted(ids) == [1, 2, 10, 11, 12, 13] and opened == [lake.path(table)]  # the reader's own handle

    # a commit made elsewhere (another process, another Lake) is seen by a kept handle: it catches up
    other = Lake(lake_dir)
    other.append(table, arrow_rows(table, [row(20)]), app_id="other", version=1)
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == [1, 2, 10, 11, 12, 13, 20]
    assert len(opened) == 1  # caught up, not opened again

    # the commits after a kept handle's version cleaned up (a checkpoint past them): it is replaced, not left behind
    with lake._delta(table) as kept:
        behind = kept.version()
    other.append(table, arrow_rows(table, [row(21)]), app_id="other", version=2)
    other.append(table, arrow_rows(table, [row(22)]), app_id="other", version=3)
    DeltaTable(lake.path(table)).create_checkpoint()
    (lake.path(table) / "_delta_log" / f"{behind + 1:020d}.json").unlink()
    assert sorted(lake.read_columns(table, ["id"])["id"].to_pylist()) == [1, 2, 10, 11, 12, 13, 20, 21, 22]
    assert len(opened) == 2

    # the first commit cleaned up too: the table keeps its id (now read from its checkpoint), so its handle is still
    # lent and caught up, not opened at every read
    (lake.path(table) / "_delta_log" / "00000000000000000000.json").unlink()
    other.append(table, arrow_rows(table, [row(23)]), app_id="other", version=4)
    for _ in range(3):
        assert lake.read_columns(table, ["id"])["id"].to_pylist().count(23) == 1
    assert len(opened) == 2


def test_a_write_of_rows_in_order_in_many_chunks_keeps_them_in_order_in_its_file(tmp_path):
    """delta-rs spreads the record batches of a table across its threads and writes them interleaved, in an order that
    changes from run to run; the lake hands it one chunk, so the file holds the rows in the declared order."""
    import pyarrow.parquet as pq

    lake, table = Lake(tmp_path / "lake"), lake_table("in_many_chunks")
    pieces = [arrow_rows(table, [row(i) for i in range(start, start + 3)]) for start in range(1, 31, 3)]
    data = pa.concat_tables(pieces)
    assert data["id"].num_chunks == 10 and data["id"].to_pylist() == list(range(1, 31))  # in order: not sorted again

    lake.append(table, data, app_id="chunks", version=1)

    ((_, files),) = appended_files(lake.path(table), 1, 1)
    assert [r for f in files for r in pq.read_table(f)["id"].to_pylist()] == list(range(1, 31))


@pytest.mark.parametrize("held", [False, True], ids=["files", "held"])
def test_a_read_in_pieces_is_the_filtered_read_cut_into_pieces(tmp_path, held):
    """`read_in_pieces` gives the rows `read_where` gives, in pieces of at least the size asked for (the last may
    be smaller), from the files or from a held snapshot; a string condition on files a MERGE wrote (string_view,
    which a scan cannot compare) is filtered after the read; a missing table gives no piece."""
    lake = Lake(tmp_path / "lake", resident_bytes=RESIDENT_BYTES if held else 0)
    table = resident_table("in_pieces")
    for v, first in enumerate(range(0, 3_000, 1_000), start=1):
        rows = [row(i, name=f"n{i % 7}") for i in range(first, first + 1_000)]
        lake.append(table, arrow_rows(table, rows), app_id="T1/x", version=v)
    if held:
        for _ in range(3):
            lake.read_where(table, pc.field("id") == 3, ["id"])
        assert lake._whole(table, DeltaTable(str(lake.path(table)))) is not None
    condition = (pc.field("id") >= 250) & (pc.field("id") < 2_950)
    pieces = list(lake.read_in_pieces(table, ["name", "id"], condition, 1_000))
    assert len(pieces) > 1 and [p.schema.names for p in pieces] == [["name", "id"]] * len(pieces)
    assert all(p.num_rows >= 1_000 for p in pieces[:-1]) and pieces[-1].num_rows > 0
    assert sorted(pa.concat_tables(pieces)["id"].to_pylist()) == list(range(250, 2_950))

    lake.upsert(table, arrow_rows(table, [row(5, name="changed")]), app_id="T1/x", version=4)
    by_name = list(lake.read_in_pieces(table, ["id"], pc.field("name") == "changed", 10))
    assert [p["id"].to_pylist() for p in by_name] == [[5]]
    assert list(lake.read_in_pieces(lake_table("never_made"), ["id"], condition, 10)) == []
