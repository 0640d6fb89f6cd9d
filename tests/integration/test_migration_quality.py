"""The data-quality record in PostgreSQL: `quality.results` and `quality.quarantine` (Delta) land in
`streamdi.quality_results` and `streamdi.quality_quarantine` in the same migration units as the `dw.*` tables of
their batches, exactly once, on real Delta tables and a real PostgreSQL database per test.

Quality rows are committed as the stage step commits them (`jobs/stage.py`, `_commit_quality`): results appended
with app transaction `stage/quality/<attempt>`, quarantined rows upserted with `stage/quarantine/<attempt>`, both
with the micro-batch as version. Expected rows are written out literally.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import psycopg.errors
import pytest
from test_migration_pending import (
    T0,
    TRADE_TYPES,
    StreamLake,
    arrow,
    database_settings,
    ledger_rows,
    metrics_rows,
    trade_row,
)

from schemas.model import Column, Table
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.warehouse import TRADE_TYPE, WAREHOUSE_TABLES
from streamdi.lake import Lake
from streamdi.migrator import MIGRATED_TABLES, migrate_batch, migrate_pending
from streamdi.warehouse import Warehouse, open_warehouse
from streamdi.warehouse_ddl import WarehouseSchemaError
from streamdi.warehouse_model import TableChange

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
T1 = T0 + dt.timedelta(minutes=1)
T2 = T0 + dt.timedelta(minutes=2)


# -- builders ----------------------------------------------------------------------------------------------


def result_row(batch_id: int, check_id: str, **overrides) -> dict:
    """A `quality.results` row: a passed warn check on staging.trade unless the test says otherwise."""
    row = {
        "batch_id": batch_id,
        "attempt": 0,
        "table_name": "staging.trade",
        "check_id": check_id,
        "expectation": "expect_column_values_to_not_be_null",
        "column_name": "t_id",
        "policy": "warn",
        "action": "passed",
        "success": True,
        "element_count": 3,
        "unexpected_count": 0,
        "detail": None,
    }
    row.update(overrides)
    return row


def quarantine_row(batch_id: int, line_no: int, check_ids: str, row: str, table_name: str = "staging.trade") -> dict:
    return {
        "batch_id": batch_id,
        "table_name": table_name,
        "row_key": f'{{"source_file": "Batch{batch_id}/Trade.txt", "line_no": {line_no}}}',
        "check_ids": check_ids,
        "row": row,
    }


def commit_quality(stream: StreamLake, batch_id: int, results: list[dict], quarantined: list[dict] = (), attempt=0):
    """What the stage step's `_commit_quality` commits for one attempt of one micro-batch."""
    if results:
        stream.lake.append(
            QUALITY_RESULTS, arrow(QUALITY_RESULTS, results), app_id=f"stage/quality/{attempt}", version=batch_id
        )
    if quarantined:
        stream.lake.upsert(
            QUARANTINE, arrow(QUARANTINE, quarantined), app_id=f"stage/quarantine/{attempt}", version=batch_id
        )


BATCH1_RESULTS = [
    result_row(1, "t_id_not_null", element_count=4),
    result_row(
        1,
        "t_qty_positive",
        expectation="expect_column_values_to_be_between",
        column_name="t_qty",
        policy="quarantine",
        action="quarantined",
        success=False,
        element_count=4,
        unexpected_count=1,
        detail='{"min_value": 1, "unexpected": [0]}',
    ),
    result_row(
        1,
        "tt_rows",
        table_name="staging.tradetype",
        expectation="expect_table_row_count_to_be_between",
        column_name=None,
        element_count=4,
    ),
]
BATCH1_QUARANTINE = [quarantine_row(1, 4, "t_qty_positive", '{"t_id": 4, "t_qty": 0, "t_comment": "a, \\"b\\""}')]
# Batch 2 halted on its first attempt; the operator resumed it and attempt 1 quarantined a row.
BATCH2_HALTED = [
    result_row(
        2,
        "t_id_unique",
        expectation="expect_column_values_to_be_unique",
        policy="halt",
        action="halted",
        success=False,
        unexpected_count=2,
        detail='{"unexpected": [7, 7]}',
    )
]
BATCH2_RESUMED = [
    {**BATCH2_HALTED[0], "attempt": 1, "action": "overridden"},
    result_row(
        2,
        "t_qty_positive",
        attempt=1,
        expectation="expect_column_values_to_be_between",
        column_name="t_qty",
        policy="quarantine",
        action="quarantined",
        success=False,
        unexpected_count=1,
        detail='{"min_value": 1, "unexpected": [-5]}',
    ),
]
BATCH2_QUARANTINE = [quarantine_row(2, 2, "t_qty_positive,t_price_set", '{"t_id": 9, "t_qty": -5, "t_price": null}')]

# The PostgreSQL rows, every column in declared order, in key order.
RESULTS_1 = [
    (1, 0, "staging.trade", "t_id_not_null", "expect_column_values_to_not_be_null", "t_id", "warn", "passed",
     True, 4, 0, None),
    (1, 0, "staging.trade", "t_qty_positive", "expect_column_values_to_be_between", "t_qty", "quarantine",
     "quarantined", False, 4, 1, '{"min_value": 1, "unexpected": [0]}'),
    (1, 0, "staging.tradetype", "tt_rows", "expect_table_row_count_to_be_between", None, "warn", "passed",
     True, 4, 0, None),
]  # fmt: skip
RESULTS_2 = [
    (2, 0, "staging.trade", "t_id_unique", "expect_column_values_to_be_unique", "t_id", "halt", "halted",
     False, 3, 2, '{"unexpected": [7, 7]}'),
    (2, 1, "staging.trade", "t_id_unique", "expect_column_values_to_be_unique", "t_id", "halt", "overridden",
     False, 3, 2, '{"unexpected": [7, 7]}'),
    (2, 1, "staging.trade", "t_qty_positive", "expect_column_values_to_be_between", "t_qty", "quarantine",
     "quarantined", False, 3, 1, '{"min_value": 1, "unexpected": [-5]}'),
]  # fmt: skip
QUARANTINE_1 = [
    (1, "staging.trade", '{"source_file": "Batch1/Trade.txt", "line_no": 4}', "t_qty_positive",
     '{"t_id": 4, "t_qty": 0, "t_comment": "a, \\"b\\""}'),
]  # fmt: skip
QUARANTINE_2 = [
    (2, "staging.trade", '{"source_file": "Batch2/Trade.txt", "line_no": 2}', "t_qty_positive,t_price_set",
     '{"t_id": 9, "t_qty": -5, "t_price": null}'),
]  # fmt: skip


def quality_batch(stream: StreamLake, arrived_at: dt.datetime, attempts: list[tuple[list, list]], **batch) -> int:
    """A micro-batch as the dataflow commits it: its file, its stage's quality record (one (results, quarantined)
    pair per attempt), its warehouse commits, then the transform mark."""
    batch_id = stream.batch(arrived_at=arrived_at, transform_done=False, **batch)
    for attempt, (results, quarantined) in enumerate(attempts):
        commit_quality(stream, batch_id, results, quarantined, attempt=attempt)
    stream.mark_transformed(batch_id, arrived_at + dt.timedelta(seconds=1))
    return batch_id


def two_batches(stream: StreamLake) -> None:
    """Batch 1: trade types, trades 1-3 and its quality record; batch 2: trade 4, halted once, then resumed."""
    quality_batch(
        stream,
        T0,
        [(BATCH1_RESULTS, BATCH1_QUARANTINE)],
        reference={TRADE_TYPE: TRADE_TYPES},
        trades=[trade_row(i) for i in (1, 2, 3)],
    )
    quality_batch(stream, T1, [(BATCH2_HALTED, []), (BATCH2_RESUMED, BATCH2_QUARANTINE)], trades=[trade_row(4)])


# -- reading PostgreSQL with plain SQL --------------------------------------------------------------------


def quality_results(warehouse: Warehouse, role: str = "admin") -> list[tuple]:
    _, rows = warehouse.query(
        "SELECT * FROM streamdi.quality_results ORDER BY batch_id, attempt, table_name, check_id", role=role
    )
    return rows


def quality_quarantine(warehouse: Warehouse, role: str = "admin") -> list[tuple]:
    _, rows = warehouse.query(
        "SELECT * FROM streamdi.quality_quarantine ORDER BY batch_id, table_name, row_key", role=role
    )
    return rows


def tradeids(warehouse: Warehouse) -> list[int]:
    return [r[0] for r in warehouse.query("SELECT tradeid FROM dw.dimtrade ORDER BY 1")[1]]


def state(warehouse: Warehouse) -> tuple:
    """Everything a migration writes: trades, trade types, both quality tables, ledger and metrics."""
    _, types = warehouse.query("SELECT * FROM dw.tradetype ORDER BY 1")
    return (
        warehouse.query("SELECT * FROM dw.dimtrade ORDER BY tradeid")[1],
        types,
        quality_results(warehouse),
        quality_quarantine(warehouse),
        ledger_rows(warehouse),
        metrics_rows(warehouse),
    )


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def target(settings, warehouse, request) -> Warehouse:
    """A Warehouse on a fresh database named after the test, set up as every caller does: with the warehouse
    tables only (the quality tables must come along)."""
    name = "mq_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]
    db = database_settings(settings, warehouse, name)
    wh = open_warehouse(db)
    wh.ensure_objects(WAREHOUSE_TABLES)
    wh.database_url = db.database_url  # for the tests that migrate in a subprocess
    return wh


# -- tests --------------------------------------------------------------------------------------------------


def test_quality_record_lands_with_its_batches_in_one_transaction(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    two_batches(stream)

    report = migrate_pending(stream.lake, target)

    assert report.batches == (1, 2)
    assert report.tables == {"tradetype": 4, "dimtrade": 4, "quality.results": 6, "quality.quarantine": 2}
    assert report.versions == {"tradetype": 1, "dimtrade": 2, "quality.results": 3, "quality.quarantine": 2}
    assert quality_results(target) == RESULTS_1 + RESULTS_2
    assert quality_quarantine(target) == QUARANTINE_1 + QUARANTINE_2
    assert tradeids(target) == [1, 2, 3, 4]
    # The quality tables have ledger keys of their own; the warehouse tables keep their bare names.
    assert ledger_rows(target) == [
        ("dimtrade", 2, 2, 4, 0),
        ("quality.quarantine", 2, 2, 2, 0),
        ("quality.results", 3, 2, 6, 0),
        ("tradetype", 1, 2, 4, 0),
    ]
    # batch_metrics.rows counts warehouse rows only: 4 trade types + 3 trades, then 1 trade.
    assert metrics_rows(target) == [
        (1, T0, None, T0 + dt.timedelta(seconds=1), 7, 2, "pull"),  # (no stage mark in these micro-batches)
        (2, T1, None, T1 + dt.timedelta(seconds=1), 1, 2, "pull"),
    ]
    _, committed = target.query(
        "SELECT count(DISTINCT xmin::text) FROM (SELECT xmin FROM streamdi.quality_results UNION ALL "
        "SELECT xmin FROM streamdi.quality_quarantine UNION ALL SELECT xmin FROM dw.dimtrade "
        "UNION ALL SELECT xmin FROM streamdi.batch_metrics) AS t",
        role="admin",
    )
    assert committed == [(1,)]  # every row written by one transaction


def test_a_batch_becomes_visible_with_its_quality_record_and_nothing_of_the_next(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    two_batches(stream)

    assert migrate_batch(stream.lake, target, 1).tables == {
        "tradetype": 4,
        "dimtrade": 3,
        "quality.results": 3,
        "quality.quarantine": 1,
    }
    assert quality_results(target) == RESULTS_1
    assert quality_quarantine(target) == QUARANTINE_1
    assert tradeids(target) == [1, 2, 3]
    assert [r for r in ledger_rows(target) if r[0].startswith("quality.")] == [
        ("quality.quarantine", 1, 1, 1, 0),
        ("quality.results", 1, 1, 3, 0),
    ]

    assert migrate_batch(stream.lake, target, 2).tables == {
        "dimtrade": 1,
        "quality.results": 3,
        "quality.quarantine": 1,
    }
    assert quality_results(target) == RESULTS_1 + RESULTS_2
    assert quality_quarantine(target) == QUARANTINE_1 + QUARANTINE_2
    assert [r for r in ledger_rows(target) if r[0].startswith("quality.")] == [
        ("quality.quarantine", 1, 1, 1, 0),
        ("quality.quarantine", 2, 2, 1, 0),
        ("quality.results", 1, 1, 3, 0),
        ("quality.results", 3, 2, 3, 0),
    ]
    assert [r[4] for r in metrics_rows(target)] == [7, 1]  # rows


def test_replays_change_nothing_and_a_batch_with_only_quality_rows_migrates(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    two_batches(stream)
    migrate_pending(stream.lake, target)
    before = state(target)

    # Replays: each batch pushed again, a pull, the stage's commits again (skipped by their app transactions), and
    # the raw change of batch 1's results re-applied.
    assert migrate_batch(stream.lake, target, 1).batches == ()
    assert migrate_batch(stream.lake, target, 2).batches == ()
    assert migrate_pending(stream.lake, target).batches == ()
    commit_quality(stream, 2, BATCH2_RESUMED, BATCH2_QUARANTINE, attempt=1)
    assert stream.lake.version(QUALITY_RESULTS) == 3 and stream.lake.version(QUARANTINE) == 2
    no_deletes = arrow(QUALITY_RESULTS, []).select(list(QUALITY_RESULTS.key))
    replay = TableChange(QUALITY_RESULTS, 1, 1, arrow(QUALITY_RESULTS, BATCH1_RESULTS), no_deletes)
    assert target.apply_changes([replay]) == {"quality.results": 0}
    assert state(target) == before

    # Batch 3 changed no warehouse table: its results still become visible with it.
    passed = result_row(3, "t_id_not_null", element_count=1)
    third = quality_batch(stream, T2, [([passed], [])])
    report = migrate_batch(stream.lake, target, third)

    assert (report.batches, report.tables) == ((3,), {"quality.results": 1})
    assert quality_results(target) == [
        *RESULTS_1,
        *RESULTS_2,
        (3, 0, "staging.trade", "t_id_not_null", "expect_column_values_to_not_be_null", "t_id", "warn", "passed",
         True, 1, 0, None),
    ]  # fmt: skip
    assert quality_quarantine(target) == QUARANTINE_1 + QUARANTINE_2
    assert ledger_rows(target)[-2:] == [("quality.results", 4, 3, 1, 0), ("tradetype", 1, 2, 4, 0)]
    assert metrics_rows(target)[-1] == (3, T2, None, T2 + dt.timedelta(seconds=1), 0, 3, "push")


def test_a_lake_without_quality_tables_migrates_as_before_and_catches_up_when_they_appear(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    stream.batch(arrived_at=T0, reference={TRADE_TYPE: TRADE_TYPES}, trades=[trade_row(i) for i in (1, 2, 3)])
    stream.batch(arrived_at=T1, trades=[trade_row(4)])
    assert not stream.lake.exists(QUALITY_RESULTS) and not stream.lake.exists(QUARANTINE)

    report = migrate_pending(stream.lake, target)

    assert report.batches == (1, 2)
    assert report.tables == {"tradetype": 4, "dimtrade": 4}
    assert report.versions == {"tradetype": 1, "dimtrade": 2}
    assert ledger_rows(target) == [("dimtrade", 2, 2, 4, 0), ("tradetype", 1, 2, 4, 0)]
    assert (quality_results(target), quality_quarantine(target)) == ([], [])
    assert [r[4] for r in metrics_rows(target)] == [7, 1]  # rows

    # The stage starts recording quality with batch 3 (e.g. after an upgrade): the next unit lands it.
    third = quality_batch(stream, T2, [(BATCH1_RESULTS[:1], [])], trades=[trade_row(5)])
    assert migrate_batch(stream.lake, target, third).tables == {"dimtrade": 1, "quality.results": 1}
    assert quality_results(target) == RESULTS_1[:1]
    assert ledger_rows(target)[-2:] == [("quality.results", 1, 3, 1, 0), ("tradetype", 1, 2, 4, 0)]


def test_a_warehouse_table_named_like_a_quality_table_keeps_a_ledger_of_its_own(target, tmp_path):
    results = Table(
        "results", "warehouse", (Column("id", "int", False), Column("v", "string")), key=("id",), order_by=("id",)
    )
    target.ensure_objects([results])
    stream = StreamLake(tmp_path / "lake")
    batch_id = stream.batch(arrived_at=T0, transform_done=False)
    # dw "results" gets two commits (Delta version 2), quality.results one (version 1).
    stream.lake.upsert(results, arrow(results, [{"id": 1, "v": "a"}]), app_id="T0/results", version=batch_id)
    stream.lake.upsert(results, arrow(results, [{"id": 2, "v": "b"}]), app_id="T1/results", version=batch_id)
    commit_quality(stream, batch_id, BATCH1_RESULTS)
    stream.mark_transformed(batch_id, T0 + dt.timedelta(seconds=1))

    report = migrate_pending(stream.lake, target, (results, *MIGRATED_TABLES))

    assert report.tables == {"results": 2, "quality.results": 3}
    assert target.query("SELECT * FROM dw.results ORDER BY id")[1] == [(1, "a"), (2, "b")]
    assert quality_results(target) == RESULTS_1
    assert ledger_rows(target) == [("quality.results", 1, 1, 3, 0), ("results", 2, 1, 2, 0)]


def test_quality_tables_are_platform_objects_the_reader_can_select(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    two_batches(stream)
    migrate_pending(stream.lake, target)

    # Created by ensure_objects(WAREHOUSE_TABLES) (the fixture), with the declared columns and keys.
    _, keys = target.query(
        """SELECT c.relname, array_agg(a.attname ORDER BY k.ord)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE n.nspname = 'streamdi' AND i.indisprimary AND c.relname LIKE 'quality%' GROUP BY c.relname
           ORDER BY 1""",
        role="admin",
    )
    assert keys == [
        ("quality_quarantine", ["batch_id", "table_name", "row_key"]),
        ("quality_results", ["batch_id", "attempt", "table_name", "check_id"]),
    ]
    _, columns = target.query(
        """SELECT column_name, data_type, is_nullable FROM information_schema.columns
           WHERE table_schema = 'streamdi' AND table_name = 'quality_quarantine' ORDER BY ordinal_position"""
    )
    assert columns == [
        ("batch_id", "bigint", "NO"),
        ("table_name", "text", "NO"),
        ("row_key", "text", "NO"),
        ("check_ids", "text", "NO"),
        ("row", "text", "NO"),
    ]

    assert quality_results(target, role="reader") == RESULTS_1 + RESULTS_2
    assert quality_quarantine(target, role="reader") == QUARANTINE_1 + QUARANTINE_2
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table quality_results"):
        target.query("DELETE FROM streamdi.quality_results", role="reader")


def test_a_quality_table_that_drifted_is_refused(settings, warehouse):
    db = database_settings(settings, warehouse, "mq_drift")
    admin = open_warehouse(db)
    admin.query(
        "CREATE SCHEMA streamdi; CREATE TABLE streamdi.quality_quarantine (batch_id bigint, table_name text, "
        "row_key text, check_ids text, row jsonb, PRIMARY KEY (batch_id, table_name, row_key))",
        role="admin",
    )

    with pytest.raises(WarehouseSchemaError) as excinfo:
        open_warehouse(db).ensure_objects(WAREHOUSE_TABLES)

    assert str(excinfo.value).splitlines()[1:] == [
        "  - streamdi.quality_quarantine.check_ids: is nullable, declared NOT NULL",
        "  - streamdi.quality_quarantine.row: type is jsonb, declared text",
        "  - streamdi.quality_quarantine.row: is nullable, declared NOT NULL",
    ]
    assert admin.query("SELECT to_regclass('dw.dimtrade')", role="admin")[1] == [(None,)]  # nothing created


MIGRATE = """
import sys
from pathlib import Path
from streamdi.lake import Lake
from streamdi.migrator import migrate_pending
from streamdi.settings import Settings
from streamdi.warehouse import open_warehouse
warehouse = open_warehouse(Settings(home=Path(sys.argv[1]), database_url=sys.argv[2]))
migrate_pending(Lake(Path(sys.argv[3])), warehouse)
"""


# (batches migrated before the crash, fault). After batch 1 the unit of batch 2 changes DimTrade, quality.results
# and quality.quarantine, in that order, each through a temporary table: `pg.during_copy#2` dies inside the results'
# COPY after DimTrade was applied, `pg.after_copy#3` after the quarantine's COPY before its upsert. From nothing, the
# unit of batches 1-2 COPYs TradeType, DimTrade, quality.results, quality.quarantine straight into the empty tables.
CRASHES = [
    (1, "migrate.before_apply"),
    (1, "pg.during_copy#2"),
    (1, "pg.after_copy#3"),
    (1, "pg.before_commit"),
    (0, "pg.during_copy#3"),
    (0, "pg.after_copy#4"),
]


@pytest.mark.parametrize(("migrated", "fault"), CRASHES)
def test_a_migration_killed_at_a_fault_point_leaves_the_previous_state_and_a_rerun_completes(
    target, tmp_path, settings, migrated, fault
):
    stream = StreamLake(tmp_path / "lake")
    two_batches(stream)
    if migrated:
        migrate_batch(stream.lake, target, migrated)
    before = state(target)
    script = tmp_path / "migrate.py"
    script.write_text(MIGRATE)
    env = {**os.environ, "STREAMDI_FAULT_AT": fault}
    args = [sys.executable, str(script), str(settings.home), target.database_url, str(stream.lake.root)]

    crashed = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)

    assert crashed.returncode == -9, crashed.stderr
    assert state(target) == before
    assert migrate_pending(Lake(stream.lake.root), target).batches == tuple(range(migrated + 1, 3))
    assert quality_results(target) == RESULTS_1 + RESULTS_2
    assert quality_quarantine(target) == QUARANTINE_1 + QUARANTINE_2
    assert tradeids(target) == [1, 2, 3, 4]
    assert [r for r in ledger_rows(target) if r[0] == "quality.results"] == (
        [("quality.results", 1, 1, 3, 0), ("quality.results", 3, 2, 3, 0)]
        if migrated
        else [("quality.results", 3, 2, 6, 0)]
    )
