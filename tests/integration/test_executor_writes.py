"""Spark's executors write, the driver commits (`Lake._commit_files`): a Spark DataFrame appended to a Delta table
(or upserted into an empty one) is written as Parquet by the executors, moved into the table and committed by the
driver with delta-rs add actions that carry the files' statistics and the app transaction.

Checked on real Delta tables and a real SparkSession: the exact rows and types read back (as the driver's write of
the same rows gives them), the statistics in the log, the change feed, a replay skipped, files independent of the
DataFrame's partitioning, the MERGE that follows, and crashes (SIGKILL in a subprocess) after the executors wrote,
before and after the commit, each followed by a rerun that commits the rows exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

from schemas.model import Column as C
from schemas.model import Table
from streamdi.lake import SCRATCH_DIR, Lake

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def wide_table(name: str) -> Table:
    """Every kind of column a warehouse table has."""
    return Table(
        name=name,
        layer="warehouse",
        columns=(
            C("id", "bigint", False),
            C("name", "string"),
            C("price", "decimal(10,2)"),
            C("assets", "decimal(18,2)"),
            C("ratio", "double"),
            C("day", "date"),
            C("at", "timestamp"),
            C("current", "boolean"),
            C("count", "int"),
        ),
        key=("id",),
        order_by=("id",),
    )


SPARK_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("name", T.StringType(), True),
        T.StructField("price", T.DecimalType(10, 2), True),
        T.StructField("assets", T.DecimalType(18, 2), True),
        T.StructField("ratio", T.DoubleType(), True),
        T.StructField("day", T.DateType(), True),
        T.StructField("at", T.TimestampType(), True),
        T.StructField("current", T.BooleanType(), True),
        T.StructField("count", T.IntegerType(), True),
    ]
)

ROWS = [
    {
        "id": 7,
        "name": "seven",
        "price": Decimal("12.50"),
        "assets": Decimal("9999999999999999.99"),
        "ratio": 0.25,
        "day": date(1967, 4, 1),
        "at": datetime(2017, 7, 7, 0, 0, 0, 123456, tzinfo=UTC),
        "current": True,
        "count": -3,
    },
    {
        "id": 2,
        "name": None,
        "price": Decimal("-0.01"),
        "assets": None,
        "ratio": None,
        "day": date(9999, 12, 31),
        "at": None,
        "current": False,
        "count": None,
    },
    {
        "id": 40,
        "name": "forty",
        "price": None,
        "assets": Decimal("0.50"),
        "ratio": -1.5,
        "day": None,
        "at": datetime(1999, 1, 1, 23, 59, 59, tzinfo=UTC),
        "current": None,
        "count": 2147483647,
    },
]


def frame(spark, rows: list[dict], partitions: int = 2):
    return spark.createDataFrame(rows, schema=SPARK_SCHEMA).repartition(partitions)


def add_actions(lake: Lake, table: Table) -> list[dict]:
    """The add actions of the table's commits, in log order."""
    adds = []
    for entry in sorted((lake.path(table) / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds.append(action["add"])
    return adds


def data_files(lake: Lake, table: Table) -> list[str]:
    return sorted(p.name for p in lake.path(table).glob("*.parquet"))


def by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def test_a_dataframe_appended_is_written_by_the_executors_and_committed_with_its_statistics(spark, tmp_path):
    lake = Lake(tmp_path, spark)
    table = wide_table("wide")

    result = lake.append(table, frame(spark, ROWS), app_id="T1/wide", version=3)

    assert (result.committed, result.table_version, result.rows) == (True, 1, 3)
    assert by_id(lake.read_arrow(table).to_pylist()) == by_id(ROWS)
    # the same columns and types as the driver's write of the same rows
    by_driver = wide_table("wide_by_driver")
    lake.append(by_driver, lake.to_arrow(by_driver, frame(spark, ROWS)), app_id="T1/wide", version=3)
    assert lake.read_arrow(table).schema == lake.read_arrow(by_driver).schema
    assert not any(f.startswith("T1-") for f in data_files(lake, by_driver))  # delta-rs's own names
    assert lake.committed_version(table, "T1/wide") == 3
    # the executors' files, moved into the table under names of the app transaction; no scratch is left behind
    files = data_files(lake, table)
    assert files and all(f.startswith("T1-wide-v3-") and f.endswith(".snappy.parquet") for f in files)
    assert not (lake.path(table) / SCRATCH_DIR).exists()
    adds = add_actions(lake, table)
    assert sorted(a["path"] for a in adds) == files
    assert all(a["dataChange"] and a["size"] == (lake.path(table) / a["path"]).stat().st_size for a in adds)
    # the statistics of the whole table, summed over its files
    stats = [json.loads(a["stats"]) for a in adds]
    assert sum(s["numRecords"] for s in stats) == 3
    nulls = {c: sum(s["nullCount"][c] for s in stats) for c in table.column_names}
    assert nulls == {
        "id": 0,
        "name": 1,
        "price": 1,
        "assets": 1,
        "ratio": 1,
        "day": 1,
        "at": 1,
        "current": 1,
        "count": 1,
    }
    lows = [s["minValues"] for s in stats]
    highs = [s["maxValues"] for s in stats]
    assert min(m["id"] for m in lows) == 2 and max(m["id"] for m in highs) == 40
    assert min(m["price"] for m in lows if "price" in m) == -0.01
    assert max(m["day"] for m in highs if "day" in m) == "9999-12-31"
    assert min(m["day"] for m in lows if "day" in m) == "1967-04-01"
    # timestamps to the microsecond, in UTC; a decimal a JSON number could not hold exactly is left out
    assert min(m["at"] for m in lows if "at" in m) == "1999-01-01T23:59:59.000000Z"
    assert max(m["at"] for m in highs if "at" in m) == "2017-07-07T00:00:00.123456Z"
    assert not any("assets" in m for m in lows + highs)
    # the change feed has every row as an insert of that commit
    changes = lake.changes(table, 1, 1).to_pylist()
    assert {(c["_change_type"], c["_commit_version"]) for c in changes} == {("insert", 1)}
    assert by_id([{k: c[k] for k in table.column_names} for c in changes]) == by_id(ROWS)


def test_a_replayed_append_is_skipped_and_writes_no_file(spark, tmp_path):
    lake = Lake(tmp_path, spark)
    table = wide_table("replayed")
    lake.append(table, frame(spark, ROWS), app_id="T1/replayed", version=3)
    files = data_files(lake, table)

    again = lake.append(table, frame(spark, ROWS), app_id="T1/replayed", version=3)
    older = lake.append(table, frame(spark, ROWS), app_id="T1/replayed", version=2)

    assert (again.committed, again.table_version, again.rows) == (False, 1, 0)
    assert (older.committed, older.table_version) == (False, 1)
    assert data_files(lake, table) == files
    assert lake.read_arrow(table).num_rows == 3


def test_the_files_hold_the_same_rows_in_declared_order_whatever_the_dataframes_partitioning(spark, tmp_path):
    lake = Lake(tmp_path, spark)
    rows = [{**ROWS[0], "id": i, "name": f"n{i}"} for i in range(500, 0, -1)]
    contents = []
    for name, partitions in (("one", 1), ("seven", 7)):
        table = wide_table(name)
        lake.append(table, frame(spark, rows, partitions), app_id="T1/same", version=1)
        files = [pq.read_table(lake.path(table) / a["path"]) for a in add_actions(lake, table)]
        ids = [f["id"].to_pylist() for f in files]
        assert all(i == sorted(i) for i in ids)  # each file in the declared order
        assert sorted(i for f in ids for i in f) == list(range(1, 501))
        contents.append([(a["path"], f.to_pylist()) for a, f in zip(add_actions(lake, table), files, strict=True)])
        assert by_id(lake.read_arrow(table).to_pylist()) == by_id(rows)
    # the same files, row for row, under the same names (the session's two shuffle partitions)
    assert len(contents[0]) == 2
    assert contents[0] == contents[1]


def test_an_upsert_into_an_empty_table_is_an_executor_append_and_the_next_upsert_a_merge(spark, tmp_path):
    lake = Lake(tmp_path, spark)
    table = wide_table("upserted")

    first = lake.upsert(table, frame(spark, ROWS), app_id="T1/upserted", version=1)
    changed = {**ROWS[1], "name": "two", "count": 2}
    new = {**ROWS[0], "id": 41, "name": "forty-one"}
    second = lake.upsert(table, frame(spark, [changed, ROWS[2], new]), app_id="T1/upserted", version=2)

    assert (first.rows, second.rows) == (3, 3)
    assert by_id(lake.read_arrow(table).to_pylist()) == by_id([ROWS[0], changed, ROWS[2], new])
    assert [(c.table_version, c.operation, c.app_id) for c in lake.history(table)] == [
        (0, "CREATE TABLE", None),
        (1, "WRITE", "T1/upserted"),
        (2, "MERGE", "T1/upserted"),
    ]
    feed = lake.changes(table, 2, 2).to_pylist()
    assert sorted((c["_change_type"], c["id"]) for c in feed) == [
        ("insert", 41),
        ("update_postimage", 2),
        ("update_preimage", 2),
    ]


def test_an_empty_dataframe_records_only_the_app_transaction(spark, tmp_path):
    lake = Lake(tmp_path, spark)
    table = wide_table("nothing")

    result = lake.append(table, frame(spark, []), app_id="T1/nothing", version=4)

    assert (result.committed, result.rows) == (True, 0)
    assert lake.committed_version(table, "T1/nothing") == 4
    assert lake.read_arrow(table).num_rows == 0
    assert data_files(lake, table) == []


# -- crashes -------------------------------------------------------------------------------------------------


def child_append(root: str, name: str) -> None:
    """Entry point of the crash subprocess: a Spark session of its own appends ROWS as T1/<name>@5 and prints the
    result (dies at STREAMDI_FAULT_AT when it is set)."""
    from streamdi.settings import Settings
    from streamdi.spark import get_spark

    settings = Settings(
        home=Path(root) / "home", spark_master="local[1]", spark_remote="off", spark_driver_memory="512m"
    )
    spark = get_spark(settings, app_name="streamdi-executor-write-crash")
    result = Lake(Path(root), spark).append(wide_table(name), frame(spark, ROWS), app_id=f"T1/{name}", version=5)
    print(json.dumps({"committed": result.committed, "table_version": result.table_version, "rows": result.rows}))
    sys.stdout.flush()
    os._exit(0)  # no JVM shutdown: the answer is printed


APPEND_IN_CHILD = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_executor_writes as t; "
    "t.child_append(sys.argv[1], sys.argv[2])"
)


def run_child(root: Path, name: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    if fault:
        env["STREAMDI_FAULT_AT"] = fault
    return subprocess.run(
        [sys.executable, "-c", APPEND_IN_CHILD, str(root), name],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.faults
@pytest.mark.parametrize(
    ("fault", "committed_by_crash"),
    [("lake.after_executor_write", False), ("lake.before_commit", False), ("lake.after_commit", True)],
)
def test_a_crash_around_an_executor_write_then_a_rerun_commits_the_rows_exactly_once(
    tmp_path, fault, committed_by_crash
):
    lake = Lake(tmp_path)
    table = wide_table("crashed")

    crashed = run_child(tmp_path, "crashed", fault)

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert lake.committed_version(table, "T1/crashed") == (5 if committed_by_crash else None)
    assert lake.read_arrow(table).num_rows == (3 if committed_by_crash else 0)

    rerun = run_child(tmp_path, "crashed")
    again = run_child(tmp_path, "crashed")

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    expected_rerun = {"committed": False, "table_version": 1, "rows": 0} if committed_by_crash else None
    if expected_rerun is None:
        expected_rerun = {"committed": True, "table_version": 1, "rows": 3}
    assert json.loads(rerun.stdout) == expected_rerun
    assert json.loads(again.stdout) == {"committed": False, "table_version": 1, "rows": 0}
    assert by_id(lake.read_arrow(table).to_pylist()) == by_id(ROWS)
    assert [(c.table_version, c.app_id) for c in lake.history(table)] == [(0, None), (1, "T1/crashed")]
    # the crashed attempt's files were replaced under the same names: every file in the table is committed
    assert data_files(lake, table) == sorted(a["path"] for a in add_actions(lake, table))
    assert DeltaTable(str(lake.path(table))).to_pyarrow_table().num_rows == 3
