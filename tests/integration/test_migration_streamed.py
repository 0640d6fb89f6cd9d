"""A first load's big tables migrated from their Delta files a piece at a time (`streamdi.migrator.STREAMED_ROWS`,
`streamdi.delta_appends.AppendedRows`), on real Delta tables and a real PostgreSQL: the same rows, ledger and
metrics as a migration that holds each table's change feed, duplicate keys refused before anything lands, and a
crash in the middle of the streamed COPY leaving PostgreSQL where it was, with a rerun landing each row once.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from test_migration_pending import (
    T0,
    StreamLake,
    arrow,
    checksums,
    completed,
    database_settings,
    ledger_rows,
    metrics_rows,
    trade_row,
    trades_in_pg,
)
from test_warehouse import child_env

from schemas.warehouse import DIM_TRADE, WAREHOUSE_TABLES
from streamdi import migrator
from streamdi.delta_appends import AppendedRows
from streamdi.lake import Lake
from streamdi.migrator import migrate_batch, migrate_pending
from streamdi.warehouse import open_warehouse
from streamdi.warehouse_apply import COPY_CHUNK_ROWS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def fresh_target(settings, warehouse, name: str):
    wh = open_warehouse(database_settings(settings, warehouse, name))
    wh.ensure_objects(WAREHOUSE_TABLES)
    return wh


def three_batches(stream: StreamLake) -> None:
    """Batch 1 appends 40 trades; batch 2 completes 5 of them, adds 3 and deletes 2 (a MERGE); batch 3 appends 6."""
    minute = dt.timedelta(minutes=1)
    stream.batch(arrived_at=T0, trades=[trade_row(i) for i in range(1, 41)])
    stream.batch(
        arrived_at=T0 + minute,
        trades=[completed(trade_row(i), Decimal("20.50") + i) for i in range(1, 6)]
        + [trade_row(i, batchid=2) for i in range(41, 44)],
        deleted_trades=[39, 40],
    )
    stream.batch(arrived_at=T0 + 2 * minute, trades=[trade_row(i, batchid=3) for i in range(44, 50)])


def test_appended_rows_are_the_rows_of_commits_that_only_appended(tmp_path):
    lake = Lake(tmp_path / "lake")
    first = lake.append(DIM_TRADE, arrow(DIM_TRADE, [trade_row(i) for i in range(1, 6)]), app_id="a", version=1)
    second = lake.append(DIM_TRADE, arrow(DIM_TRADE, [trade_row(i) for i in range(6, 9)]), app_id="a", version=2)
    merged = lake.upsert(DIM_TRADE, arrow(DIM_TRADE, [trade_row(2, quantity=1)]), app_id="a", version=3)
    path, schema = lake.path(DIM_TRADE), DIM_TRADE.arrow_schema()

    rows = AppendedRows.of(path, first.table_version, second.table_version, schema)

    assert rows.rows_per_version == {first.table_version: 5, second.table_version: 3}
    assert rows.num_rows == 8 and rows.column_names == DIM_TRADE.column_names
    assert rows.select(["tradeid"]).to_pylist() == [{"tradeid": i} for i in range(1, 9)]
    batches = list(rows.to_batches(max_chunksize=3))
    assert [b.num_rows for b in batches] == [3, 2, 3]  # a file's rows in pieces, never two files in one
    assert (
        pa.Table.from_batches(batches).to_pylist() == arrow(DIM_TRADE, [trade_row(i) for i in range(1, 9)]).to_pylist()
    )
    assert all(b.schema == schema for b in batches)
    assert AppendedRows.of(path, first.table_version, merged.table_version, schema) is None  # a MERGE rewrote a file


def test_a_load_streamed_from_the_files_lands_what_a_held_feed_lands(settings, warehouse, tmp_path, monkeypatch):
    stream = StreamLake(tmp_path / "lake")
    three_batches(stream)
    held = fresh_target(settings, warehouse, "mig_streamed_held")
    streamed = fresh_target(settings, warehouse, "mig_streamed_files")

    report_held = migrate_batch(stream.lake, held, 1)
    monkeypatch.setattr(migrator, "STREAMED_ROWS", 1)
    report_streamed = migrate_batch(stream.lake, streamed, 1)
    assert report_held.tables == report_streamed.tables == {"dimtrade": 40}
    # the rest: batch 2 is a MERGE (its feed is held whatever the threshold), batch 3 an append of 6 rows
    monkeypatch.setattr(migrator, "STREAMED_ROWS", 10**9)
    migrate_pending(stream.lake, held)
    monkeypatch.setattr(migrator, "STREAMED_ROWS", 1)
    migrate_pending(stream.lake, streamed)

    assert trades_in_pg(streamed) == stream.model.summary()
    assert len(stream.model.summary()) == 47
    assert checksums(streamed) == checksums(held)
    assert ledger_rows(streamed) == ledger_rows(held)
    assert metrics_rows(streamed) == metrics_rows(held)
    assert [r[4] for r in metrics_rows(streamed)] == [40, 10, 6]  # change rows per batch: 40 | 5+3+2 | 6


def test_streamed_rows_with_a_key_twice_are_refused_before_anything_lands(settings, warehouse, tmp_path, monkeypatch):
    stream = StreamLake(tmp_path / "lake")
    stream.batch(arrived_at=T0, trades=[trade_row(i) for i in range(1, 4)])
    # a second append of trade 2 (no MERGE): the table now holds the key twice, which no net change can say
    stream.lake.append(DIM_TRADE, arrow(DIM_TRADE, [trade_row(2, quantity=9)]), app_id="T3/dimtrade", version=2)
    stream.batch(arrived_at=T0 + dt.timedelta(minutes=1))
    target = fresh_target(settings, warehouse, "mig_streamed_twice")
    monkeypatch.setattr(migrator, "STREAMED_ROWS", 1)

    with pytest.raises(ValueError, match="dimtrade: upserts hold more than one row for some key"):
        migrate_pending(stream.lake, target)

    assert trades_in_pg(target) == []
    assert ledger_rows(target) == [] and metrics_rows(target) == []


# -- a crash in the middle of a streamed COPY ------------------------------------------------------------------

CRASH_TRADES = COPY_CHUNK_ROWS + 2_500  # more than one COPY chunk, so pg.during_copy fires with part of it sent


def child_migrate(lake_root: str) -> None:
    """Entry point of the crash subprocess: migrate every pending batch, streaming any append from its files."""
    from streamdi.settings import load_settings

    migrator.STREAMED_ROWS = 1
    report = migrate_pending(Lake(Path(lake_root)), open_warehouse(load_settings()))
    print(json.dumps(report.tables))


CHILD = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_migration_streamed as t; t.child_migrate(sys.argv[1])"
)


@pytest.mark.faults
def test_a_crash_in_the_middle_of_a_streamed_copy_leaves_postgres_as_it_was(settings, warehouse, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    stream.batch(arrived_at=T0, trades=[trade_row(i) for i in range(1, CRASH_TRADES + 1)])
    db_settings = database_settings(settings, warehouse, "mig_streamed_crash")
    target = open_warehouse(db_settings)
    target.ensure_objects(WAREHOUSE_TABLES)

    def child(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / "lake")],
            cwd=REPO,
            env=child_env(db_settings, **extra),
            capture_output=True,
            text=True,
            timeout=120,
        )

    crashed = child(STREAMDI_FAULT_AT="pg.during_copy")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert target.query("SELECT count(*) FROM dw.dimtrade")[1] == [(0,)]
    assert ledger_rows(target) == [] and metrics_rows(target) == []

    rerun = child()
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {"dimtrade": CRASH_TRADES}
    assert trades_in_pg(target) == stream.model.summary()
    assert ledger_rows(target) == [("dimtrade", stream.lake.version(DIM_TRADE), 1, CRASH_TRADES, 0)]
    assert child().stdout.strip() == "{}"  # nothing pending: nothing lands twice
