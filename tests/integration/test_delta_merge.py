"""`streamdi.delta_merge`: the MERGE that keeps a table's files in its declared order, on real Delta tables.

Each upsert's rows, change data feed and app transaction are checked against a model of the table kept here (a dict
by key), and against delta-rs's own reading of the commit (its `load_cdf` and a checkpoint of the log)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from schemas.model import Column as C
from schemas.model import Table
from streamdi import row_order
from streamdi.lake import Lake

REPO = Path(__file__).resolve().parents[2]
ORDER = {"update_preimage": 0, "update_postimage": 1, "insert": 2, "delete": 3}

TABLE = Table(
    name="merged_in_order",
    layer="warehouse",
    columns=(
        C("id", "bigint", False),
        C("name", "string"),
        C("amount", "decimal(10,2)"),
        C("at", "timestamp", False),
    ),
    key=("id",),
    order_by=("id",),
    file_bytes=16 * 1024,
)
START = datetime(2020, 1, 1, tzinfo=UTC)


def row(id_: int, name: str | None = None, amount: str | None = "1.50") -> dict:
    return {
        "id": id_,
        "name": name if name is not None else f"name-{id_:06d}",
        "amount": None if amount is None else Decimal(amount),
        "at": START + timedelta(seconds=id_, microseconds=id_ % 997),
    }


def rows_of(rows: list[dict], table: Table = TABLE) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=table.arrow_schema())


def feed_of(lake: Lake, version: int) -> list[tuple]:
    got = lake.changes(TABLE, version, version).to_pylist()
    return sorted((r["id"], ORDER[r["_change_type"]], r["name"], r["amount"]) for r in got)


def delta_rs_feed(path: Path, version: int) -> list[tuple]:
    reader = DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version)
    got = pa.RecordBatchReader.from_stream(reader).read_all().to_pylist()
    return sorted((r["id"], ORDER[r["_change_type"]], r["name"], r["amount"]) for r in got)


def ranges(path: Path, column: str = "id") -> list[tuple]:
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return sorted(zip(actions[f"min.{column}"].to_pylist(), actions[f"max.{column}"].to_pylist(), strict=True))


def rows_in_files(path: Path) -> list[list[int]]:
    """The ids of each data file of the table, in the file's row order."""
    delta = DeltaTable(str(path))
    files = pa.table(delta.get_add_actions(flatten=True))["path"].to_pylist()
    return [pq.read_table(path / unquote(f), columns=["id"])["id"].to_pylist() for f in files]


@pytest.mark.parametrize("with_deletes", [False, True])
@pytest.mark.parametrize("packed", [False, True], ids=["arrow-sort", "kept-rows-in-order"])
def test_upserts_keep_the_files_apart_with_the_rows_feed_and_transactions_of_a_merge(
    tmp_path, monkeypatch, with_deletes, packed
):
    if packed:  # the rows a MERGE keeps are found in order and its new rows put among them (`row_order`)
        monkeypatch.setattr(row_order, "MIN_ROWS", 0)
    lake = Lake(tmp_path)
    path = lake.path(TABLE)
    model = {i: row(i) for i in range(0, 6_000, 2)}
    lake.append(TABLE, rows_of(list(model.values())), app_id="load", version=1)
    assert len(ranges(path)) >= 3
    pick = random.Random(7)
    for version in range(1, 7):
        updated = pick.sample(sorted(model), 40)
        equal = pick.sample(sorted(set(model) - set(updated)), 30)  # sent as they are: left alone
        inside = [i for i in pick.sample(range(1, 6_000, 2), 60) if i not in model]  # new keys among the others
        beyond = list(range(6_000 + 100 * version, 6_000 + 100 * version + 25))  # new keys past the end
        changes = [row(i, name=f"v{version}-{i}", amount=None if i % 3 == 0 else "7.25") for i in updated]
        source = changes + [model[i] for i in equal] + [row(i) for i in inside + beyond]
        pick.shuffle(source)
        before = {i: model[i] for i in updated}
        left = sorted(set(model) - set(updated) - set(equal))
        deleted = pick.sample(left, 25) if with_deletes else []
        gone = {i: model.pop(i) for i in deleted}
        model.update({r["id"]: r for r in source})
        doomed = (
            pa.table({"id": pa.array([*deleted, 999_999], pa.int64())}) if with_deletes else None
        )  # 999,999: absent

        result = lake.upsert(TABLE, rows_of(source), app_id="merge", version=version, deletes=doomed)
        assert result.committed
        assert lake.read_arrow(TABLE).sort_by("id").to_pylist() == [model[i] for i in sorted(model)]
        commit = DeltaTable(str(path)).history(1)[0]
        assert commit["operation"] == "MERGE" and commit["operationParameters"]["writer"] == "streamdi.delta_merge"
        expected = sorted(
            [(i, 0, before[i]["name"], before[i]["amount"]) for i in updated]
            + [(i, 1, model[i]["name"], model[i]["amount"]) for i in updated]
            + [(i, 2, model[i]["name"], model[i]["amount"]) for i in inside + beyond]
            + [(i, 3, gone[i]["name"], gone[i]["amount"]) for i in deleted]
        )
        table_version = result.table_version
        assert feed_of(lake, table_version) == expected
        assert delta_rs_feed(path, table_version) == expected
        spans = ranges(path)
        assert all(high < low for (_, high), (low, _) in zip(spans, spans[1:], strict=False)), spans
        assert all(ids == sorted(ids) for ids in rows_in_files(path))
        assert lake.upsert(TABLE, rows_of(source[:3]), app_id="merge", version=version).committed is False
        assert DeltaTable(str(path)).transaction_version("merge") == version

    delta = DeltaTable(str(path))
    delta.create_checkpoint()
    again = DeltaTable(str(path)).to_pyarrow_table().sort_by("id").cast(TABLE.arrow_schema())
    assert again.to_pylist() == [model[i] for i in sorted(model)]
    timestamps = ranges(path, "at")  # timestamps get bounds too, to the microsecond
    assert timestamps[0][0] == model[0]["at"] and timestamps[-1][1] == max(r["at"] for r in model.values())


def test_rows_equal_to_the_table_commit_only_the_transaction(tmp_path):
    lake = Lake(tmp_path)
    lake.append(TABLE, rows_of([row(i) for i in range(100)]), app_id="load", version=1)
    files = {a for a in DeltaTable(str(lake.path(TABLE))).file_uris()}
    result = lake.upsert(TABLE, rows_of([row(5), row(7)]), app_id="merge", version=1)
    assert result.committed and lake.changes(TABLE, result.table_version, result.table_version).num_rows == 0
    assert set(DeltaTable(str(lake.path(TABLE))).file_uris()) == files
    assert DeltaTable(str(lake.path(TABLE))).transaction_version("merge") == 1


def test_appends_past_the_end_grow_the_last_file_up_to_the_file_size(tmp_path):
    """New keys past the end join the table's last file while it is small, then start the next one: no file of a
    few rows per micro-batch, and the files stay in key order."""
    lake = Lake(tmp_path)
    path = lake.path(TABLE)
    lake.append(TABLE, rows_of([row(i) for i in range(10)]), app_id="load", version=1)
    for version in range(1, 41):
        first = 10 + 60 * (version - 1)
        source = [row(i) for i in range(first, first + 60)] + [row(first - 1, name="changed")]
        lake.upsert(TABLE, rows_of(source), app_id="merge", version=version)
    spans = ranges(path)
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    assert all(high < low for (_, high), (low, _) in zip(spans, spans[1:], strict=False))
    assert 2 <= len(spans) <= 6  # ~2,400 rows of ~16 KB files, not 41 files
    assert max(actions["size_bytes"].to_pylist()) < 3 * TABLE.file_bytes
    assert lake.read_arrow(TABLE).num_rows == 10 + 60 * 40


CRASH_IN_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.integration.test_delta_merge import TABLE, row, rows_of
from streamdi.lake import Lake
lake = Lake(Path(sys.argv[1]))
lake.upsert(TABLE, rows_of([row(3, name="changed"), row(500)]), app_id="merge", version=1)
"""


def test_a_crash_between_the_files_and_the_commit_leaves_the_table_and_the_rerun_commits_once(tmp_path):
    lake_dir = tmp_path
    lake = Lake(lake_dir)
    path = lake.path(TABLE)
    lake.append(TABLE, rows_of([row(i) for i in range(300)]), app_id="load", version=1)
    version = DeltaTable(str(path)).version()
    code = CRASH_IN_CHILD.format(repo=str(REPO))
    env = {**os.environ, "STREAMDI_FAULT_AT": "lake.merge_files_written"}
    crashed = subprocess.run([sys.executable, "-c", code, str(lake_dir)], env=env, capture_output=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr
    assert DeltaTable(str(path)).version() == version
    assert lake.read_arrow(TABLE).sort_by("id").to_pylist() == [row(i) for i in range(300)]
    env.pop("STREAMDI_FAULT_AT")
    rerun = subprocess.run([sys.executable, "-c", code, str(lake_dir)], env=env, capture_output=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    rerun = subprocess.run([sys.executable, "-c", code, str(lake_dir)], env=env, capture_output=True, timeout=120)
    assert DeltaTable(str(path)).version() == version + 1
    expected = [row(i) for i in range(300)] + [row(500)]
    expected[3] = row(3, name="changed")
    assert Lake(lake_dir).read_arrow(TABLE).sort_by("id").to_pylist() == expected
    logged = (path / "_delta_log" / f"{version + 1:020d}.json").read_text().splitlines()
    assert {next(iter(json.loads(line))) for line in logged} == {"commitInfo", "txn", "remove", "add", "cdc"}


def test_a_table_without_its_own_file_size_is_merged_by_delta_rs(tmp_path):
    lake = Lake(tmp_path)
    table = Table(**{**TABLE.__dict__, "name": "merged_by_delta_rs", "file_bytes": None})
    lake.append(table, rows_of([row(i) for i in range(20)], table), app_id="load", version=1)
    gone = rows_of([row(4)], table).select(["id"])
    lake.upsert(table, rows_of([row(2, name="x")], table), app_id="merge", version=1, deletes=gone)
    commit = DeltaTable(str(lake.path(table))).history(1)[0]
    assert commit["operation"] == "MERGE" and "writer" not in commit["operationParameters"]
    assert lake.read_arrow(table).sort_by("id").to_pylist() == [
        row(i, name="x" if i == 2 else None) for i in range(20) if i != 4
    ]


def test_a_held_table_is_given_the_rows_of_the_files_its_merge_wrote(tmp_path):
    """A resident table whose files are held gets the rows of the files the MERGE wrote: with every data file moved
    away afterwards, the new version is still read whole, from memory."""
    lake = Lake(tmp_path / "lake")
    table = Table(**{**TABLE.__dict__, "name": "held_in_order", "resident": True})
    lake.append(table, rows_of([row(i) for i in range(1_000)], table), app_id="load", version=1)
    for _ in range(3):  # read from its files until holding it pays, then held
        lake.read_where(table, pc.field("id") == 3, ["id"])
    lake.upsert(table, rows_of([row(3, name="changed"), row(2_000)], table), app_id="merge", version=1)
    away = tmp_path / "away"
    away.mkdir()
    for file in lake.path(table).glob("*.parquet"):
        file.rename(away / file.name)
    got = lake.read_where(table, pc.field("id") >= 0, ["id", "name"]).sort_by("id")
    assert got.num_rows == 1_001 and got.to_pylist()[3] == {"id": 3, "name": "changed"}
    assert got.to_pylist()[-1] == {"id": 2_000, "name": "name-002000"}


def test_a_key_twice_in_the_source_is_refused_and_a_key_deleted_twice_goes_once(tmp_path):
    lake = Lake(tmp_path)
    lake.append(TABLE, rows_of([row(i) for i in range(50)]), app_id="load", version=1)
    with pytest.raises(Exception, match="multiple source rows"):  # delta-rs's MERGE says so; nothing is written
        lake.upsert(TABLE, rows_of([row(3, name="a"), row(3, name="b")]), app_id="merge", version=1)
    assert lake.read_arrow(TABLE).sort_by("id").to_pylist() == [row(i) for i in range(50)]
    twice = pa.table({"id": pa.array([5, 5], pa.int64())})
    result = lake.upsert(TABLE, rows_of([row(4, name="c")]), app_id="merge", version=2, deletes=twice)
    assert [r["id"] for r in lake.read_arrow(TABLE).sort_by("id").to_pylist()] == [i for i in range(50) if i != 5]
    feed = lake.changes(TABLE, result.table_version, result.table_version).to_pylist()
    assert sorted((r["id"], r["_change_type"]) for r in feed) == [
        (4, "update_postimage"),
        (4, "update_preimage"),
        (5, "delete"),
    ]
