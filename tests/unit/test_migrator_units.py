"""Pure parts of the migrator: which Delta versions belong to a batch, the net change per key, and where each
migrated table lands (PostgreSQL table, ledger key)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas.model import Column, Table
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.warehouse import DIM_TRADE, WAREHOUSE_TABLES
from streamdi.lake import CommitInfo
from streamdi.migrator import MIGRATED_TABLES, net_changes, rows_per_batch, target_version
from streamdi.warehouse_ddl import create_table_sql
from streamdi.warehouse_model import ledger_key, pg_qualified_name

T = Table("t", "warehouse", (Column("id", "int", False), Column("v", "string")), key=("id",), order_by=("id",))

HISTORY = [
    CommitInfo(0, "CREATE TABLE", None, None),
    CommitInfo(1, "WRITE", "T0/t", 1),
    CommitInfo(2, "MERGE", "T0/t", 2),
    CommitInfo(3, "OPTIMIZE", None, None),
    CommitInfo(4, "MERGE", "T0/t", 3),
]


@pytest.mark.parametrize(
    ("after", "batch", "expected"),
    [(0, 1, 1), (0, 2, 3), (1, 2, 3), (0, 3, 4), (3, 2, 3), (4, 9, 4), (0, 0, 0)],
)
def test_target_version_stops_at_the_first_commit_of_a_later_batch(after, batch, expected):
    assert target_version(HISTORY, after, batch) == expected


def cdf(rows):
    ids, values, kinds, versions = zip(*rows, strict=True)
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "v": list(values),
            "_change_type": list(kinds),
            "_commit_version": pa.array(versions, pa.int64()),
        }
    )


def test_last_change_per_key_wins_and_deletes_are_separated():
    changes = cdf(
        [
            (1, "a", "insert", 1),
            (2, "b", "insert", 1),
            (1, "a", "update_preimage", 2),
            (1, "a2", "update_postimage", 2),
            (3, "c", "insert", 2),
            (2, "b", "delete", 3),
            (3, "c", "update_preimage", 3),
            (3, "c3", "update_postimage", 3),
        ]
    )
    upserts, deletes = net_changes(changes, T)
    assert upserts.to_pylist() == [{"id": 1, "v": "a2"}, {"id": 3, "v": "c3"}]
    assert deletes.to_pylist() == [{"id": 2}]


def test_a_key_deleted_then_reinserted_is_an_upsert():
    upserts, deletes = net_changes(cdf([(5, "x", "insert", 1), (5, "x", "delete", 2), (5, "y", "insert", 3)]), T)
    assert upserts.to_pylist() == [{"id": 5, "v": "y"}]
    assert deletes.num_rows == 0


def test_two_changes_of_one_key_in_one_commit_are_refused():
    with pytest.raises(ValueError, match="changes the same key more than once"):
        net_changes(cdf([(1, "a", "insert", 1), (1, "b", "insert", 1)]), T)


def test_empty_feed_gives_empty_changes():
    upserts, deletes = net_changes(cdf([(1, "a", "update_preimage", 1)]), T)
    assert (upserts.num_rows, deletes.num_rows, deletes.column_names) == (0, 0, ["id"])


PAIR = Table(
    "pair",
    "warehouse",
    (Column("a", "int", False), Column("b", "string", False), Column("v", "string")),
    key=("a", "b"),
    order_by=("a", "b"),
)


def test_composite_keys_over_several_chunks_keep_each_keys_last_change():
    schema = pa.schema(
        [
            pa.field("a", pa.int32()),
            pa.field("b", pa.large_string()),
            pa.field("v", pa.large_string()),
            pa.field("_change_type", pa.string()),
            pa.field("_commit_version", pa.int64()),
        ]
    )
    chunk1 = pa.table(
        {
            "a": [1, 1, 2],
            "b": ["x", "y", "x"],
            "v": ["1x", "1y", "2x"],
            "_change_type": ["insert"] * 3,
            "_commit_version": [1, 1, 1],
        },
        schema=schema,
    )
    chunk2 = pa.table(
        {
            "a": [1, 2, 1, 1],
            "b": ["x", "x", "x", "y"],
            "v": ["1x", "2x", "1x'", "1y"],
            "_change_type": ["update_preimage", "delete", "update_postimage", "delete"],
            "_commit_version": [2, 2, 2, 3],
        },
        schema=schema,
    )
    chunk3 = pa.table(
        {"a": [1], "b": ["y"], "v": ["1y again"], "_change_type": ["insert"], "_commit_version": [4]}, schema=schema
    )
    feed = pa.concat_tables([chunk1, chunk2, chunk3])
    assert feed["a"].num_chunks == 3

    upserts, deletes = net_changes(feed, PAIR)

    assert sorted(upserts.to_pylist(), key=lambda r: (r["a"], r["b"])) == [
        {"a": 1, "b": "x", "v": "1x'"},
        {"a": 1, "b": "y", "v": "1y again"},
    ]
    assert deletes.to_pylist() == [{"a": 2, "b": "x"}]


def test_the_same_composite_key_twice_in_one_commit_is_refused_but_equal_parts_are_not_enough():
    feed = pa.table(
        {
            "a": pa.array([1, 1, 1], pa.int32()),
            "b": ["x", "y", "x"],
            "v": ["p", "q", "r"],
            "_change_type": ["insert"] * 3,
            "_commit_version": pa.array([1, 1, 1], pa.int64()),
        }
    )
    with pytest.raises(ValueError, match="changes the same key more than once"):
        net_changes(feed, PAIR)
    upserts, _ = net_changes(feed.slice(0, 2), PAIR)
    assert upserts.num_rows == 2


def test_rows_per_batch_counts_every_change_but_preimages_by_the_batch_of_its_commit():
    changes = cdf(
        [
            (1, "a", "insert", 1),
            (2, "b", "insert", 1),
            (1, "a", "update_preimage", 2),
            (1, "a2", "update_postimage", 2),
            (3, "c", "insert", 3),  # table version 3 is OPTIMIZE: no batch
            (2, "b", "delete", 4),
        ]
    )
    assert rows_per_batch(changes, HISTORY) == {1: 2, 2: 1, 3: 1}


def test_migrated_tables_are_the_warehouse_then_the_quality_tables_each_with_its_own_ledger_key_and_pg_table():
    assert MIGRATED_TABLES[len(WAREHOUSE_TABLES) :] == (QUALITY_RESULTS, QUARANTINE)
    assert MIGRATED_TABLES[: len(WAREHOUSE_TABLES)] == WAREHOUSE_TABLES
    assert [(ledger_key(t), pg_qualified_name(t)) for t in (DIM_TRADE, QUALITY_RESULTS, QUARANTINE)] == [
        ("dimtrade", "dw.dimtrade"),
        ("quality.results", "streamdi.quality_results"),
        ("quality.quarantine", "streamdi.quality_quarantine"),
    ]
    # warehouse tables keep the ledger keys databases migrated before already hold
    assert [ledger_key(t) for t in WAREHOUSE_TABLES] == [t.name for t in WAREHOUSE_TABLES]
    assert len({ledger_key(t) for t in MIGRATED_TABLES}) == len(MIGRATED_TABLES)
    assert len({pg_qualified_name(t) for t in MIGRATED_TABLES}) == len(MIGRATED_TABLES)


def test_quality_ddl_names_the_platform_table():
    assert create_table_sql(QUARANTINE) == (
        'CREATE TABLE IF NOT EXISTS streamdi."quality_quarantine" (\n'
        '    "batch_id" bigint NOT NULL,\n'
        '    "table_name" text NOT NULL,\n'
        '    "row_key" text NOT NULL,\n'
        '    "check_ids" text NOT NULL,\n'
        '    "row" text NOT NULL,\n'
        '    PRIMARY KEY ("batch_id", "table_name", "row_key")\n'
        ");"
    )
