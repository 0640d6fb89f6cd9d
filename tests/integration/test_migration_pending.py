"""The migrator's units on real Delta tables (written with `Lake`, no Spark) and a real PostgreSQL database of
their own: catch-up of every pending batch in one transaction, partial batches left alone, per-batch metrics,
the dataflow's migrate stage after a pull, replays, staleness, and DDL for every declared warehouse table.

`StreamLake` (also used by the other migration tests) writes micro-batches the way the dataflow does: register a
landing file in the batch log, commit each table with app transaction `(step/table, batch)`, mark the transform
done. `TradeModel` is the test's own account of what DimTrade must hold, kept independently of the code under
test.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from psycopg.conninfo import make_conninfo

from schemas.model import Table
from schemas.warehouse import DIM_TRADE, STATUS_TYPE, TRADE_TYPE, WAREHOUSE_TABLES
from streamdi import embedded_pg
from streamdi.batchlog import BatchLog, LandedFile
from streamdi.context import JobContext
from streamdi.delta_log import remove_before
from streamdi.lake import Lake
from streamdi.migrator import migrate_batch, migrate_pending, pending_batches
from streamdi.run.pipeline import migrate_job
from streamdi.settings import Settings
from streamdi.warehouse import Warehouse, open_warehouse
from streamdi.warehouse_ddl import create_table_sql
from streamdi.warehouse_model import TableChange

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


# -- builders (shared with tests/integration/test_migration_readers.py and tests/e2e/test_migration_*.py) ------


def trade_row(tradeid: int, **overrides) -> dict:
    """A DimTrade row with every declared column; the test names only what matters to it."""
    row = {
        "tradeid": tradeid,
        "sk_brokerid": 4_000_000 + tradeid % 7,
        "sk_createdateid": 20170704,
        "sk_createtimeid": 93000,
        "sk_closedateid": None,
        "sk_closetimeid": None,
        "status": "Submitted",
        "type": "Market Buy",
        "cashflag": tradeid % 2 == 0,
        "sk_securityid": 10 + tradeid % 5,
        "sk_companyid": 20 + tradeid % 3,
        "quantity": 100 + tradeid % 50,
        "bidprice": Decimal("20.00") + Decimal(tradeid % 13),
        "sk_customerid": 30,
        "sk_accountid": 40 + tradeid % 9,
        "executedby": f"Broker {tradeid % 4}",
        "tradeprice": None,
        "fee": None,
        "commission": None,
        "tax": None,
        "batchid": 1,
    }
    row.update(overrides)
    return row


def completed(row: dict, price: Decimal) -> dict:
    """The trade's row once it completed at `price`."""
    return {
        **row,
        "status": "Completed",
        "sk_closedateid": 20170705,
        "sk_closetimeid": 100000,
        "tradeprice": price,
        "fee": Decimal("1.50"),
        "commission": Decimal("2.25"),
        "tax": Decimal("0.75"),
    }


TRADE_TYPES = [
    {"tt_id": "TLB", "tt_name": "Limit Buy", "tt_is_sell": 0, "tt_is_mrkt": 0},
    {"tt_id": "TLS", "tt_name": "Limit Sell", "tt_is_sell": 1, "tt_is_mrkt": 0},
    {"tt_id": "TMB", "tt_name": "Market Buy", "tt_is_sell": 0, "tt_is_mrkt": 1},
    {"tt_id": "TMS", "tt_name": "Market Sell", "tt_is_sell": 1, "tt_is_mrkt": 1},
]
STATUS_TYPES = [{"st_id": "CMPT", "st_name": "Completed"}, {"st_id": "SBMT", "st_name": "Submitted"}]


@dataclass
class TradeModel:
    """What DimTrade must hold: the test's own bookkeeping of the rows each batch writes."""

    rows: dict[int, dict] = field(default_factory=dict)

    def apply(self, upserts: list[dict], deletes: list[int] = ()) -> None:
        for tradeid in deletes:
            self.rows.pop(tradeid, None)
        for row in upserts:
            self.rows[row["tradeid"]] = row

    def summary(self) -> list[tuple]:
        """(tradeid, status, quantity, tradeprice, batchid) ordered by tradeid, as PostgreSQL returns it."""
        return [
            (r["tradeid"], r["status"], r["quantity"], r["tradeprice"], r["batchid"])
            for _, r in sorted(self.rows.items())
        ]


class StreamLake:
    """Micro-batches written as the dataflow writes them (no Spark): file registered in the batch log, one commit
    per table with app transaction (step/table, batch), then the transform mark."""

    def __init__(self, root: Path) -> None:
        self.lake = Lake(root)
        self.log = BatchLog(self.lake)
        self.model = TradeModel()

    def batch(
        self,
        *,
        arrived_at: dt.datetime,
        trades: list[dict] = (),
        deleted_trades: list[int] = (),
        reference: dict[Table, list[dict]] | None = None,
        transform_done: bool = True,
    ) -> int:
        batch_id = self.log.last_batch_id() + 1
        landed = LandedFile(f"Batch1/drip-{batch_id:04d}.txt", 10, f"sha-{batch_id}", arrived_at, 1)
        self.log.register([landed], now=arrived_at)
        if transform_done:  # staged half a second after arrival (batch_metrics.staged_at)
            self.log.mark(batch_id, "stage", "done", now=arrived_at + dt.timedelta(milliseconds=500))
        for table, rows in (reference or {}).items():
            self.lake.upsert(table, arrow(table, rows), app_id=f"T0/{table.name}", version=batch_id)
        if trades or deleted_trades:
            key_schema = pa.schema([DIM_TRADE.arrow_schema().field("tradeid")])
            doomed = pa.Table.from_pylist([{"tradeid": t} for t in deleted_trades], schema=key_schema)
            self.lake.upsert(
                DIM_TRADE,
                arrow(DIM_TRADE, trades),
                app_id="T3/dimtrade",
                version=batch_id,
                deletes=doomed if deleted_trades else None,
            )
            if transform_done:
                self.model.apply(list(trades), list(deleted_trades))
        if transform_done:
            self.mark_transformed(batch_id, arrived_at + dt.timedelta(seconds=1))
        return batch_id

    def mark_transformed(self, batch_id: int, at: dt.datetime) -> None:
        self.log.mark(batch_id, "transform", "done", now=at)


def arrow(table: Table, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=table.arrow_schema())


def database_settings(settings: Settings, warehouse: Warehouse, name: str) -> Settings:
    """Settings for a fresh database `name` on the test server (dropped first if a previous run left it): the
    ledger and `batch_metrics` are per database, so each test migrates into one of its own. The database is
    reached by URL (`DATABASE_URL` in subprocesses); the test process keeps the embedded server running."""
    with warehouse.connect("admin") as conn:
        conn.autocommit = True
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    base = settings.database_url or embedded_pg.ensure_server(settings)
    return Settings(home=settings.home, database_url=make_conninfo(base, dbname=name))


def checksums(warehouse: Warehouse, tables: tuple[Table, ...] = WAREHOUSE_TABLES) -> dict[str, tuple]:
    """Per table: rows, distinct keys and an md5 over every row's text in key order (plain SQL, not the code
    under test)."""
    result = {}
    for t in tables:
        key = ", ".join(f"t.{k}" for k in t.key)
        _, rows = warehouse.query(
            f"SELECT count(*), count(DISTINCT ({key}, true)), "
            f"md5(coalesce(string_agg(t::text, '|' ORDER BY {key}), '')) FROM dw.{t.name} AS t"
        )
        result[t.name] = rows[0]
    return result


def trades_in_pg(warehouse: Warehouse) -> list[tuple]:
    _, rows = warehouse.query("SELECT tradeid, status, quantity, tradeprice, batchid FROM dw.dimtrade ORDER BY 1")
    return rows


def ledger_rows(warehouse: Warehouse) -> list[tuple]:
    _, rows = warehouse.query(
        "SELECT table_name, delta_version, batch_id, rows_upserted, rows_deleted FROM streamdi.migration_ledger "
        "ORDER BY table_name, delta_version"
    )
    return rows


def metrics_rows(warehouse: Warehouse) -> list[tuple]:
    _, rows = warehouse.query(
        "SELECT batch_id, arrived_at, staged_at, delta_committed_at, rows, unit_last_batch, mode "
        "FROM streamdi.batch_metrics "
        "ORDER BY batch_id"
    )
    return rows


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def target(settings, warehouse, request):
    """A Warehouse on a fresh database named after the test."""
    name = "mig_" + request.node.name.lower().replace("[", "_").replace("]", "")[:40]
    db_settings = database_settings(settings, warehouse, name)
    wh = open_warehouse(db_settings)
    wh.ensure_objects(WAREHOUSE_TABLES)
    wh.settings = db_settings  # for tests that build a JobContext on it
    return wh


def first_batches(stream: StreamLake) -> None:
    """Batch 1: reference tables and 30 trades; batch 2: 10 trades complete, 5 new, 3 deleted."""
    stream.batch(
        arrived_at=T0,
        reference={TRADE_TYPE: TRADE_TYPES, STATUS_TYPE: STATUS_TYPES},
        trades=[trade_row(i) for i in range(1, 31)],
    )
    stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=1),
        trades=[completed(trade_row(i), Decimal("21.10") + i) for i in range(1, 11)]
        + [trade_row(i, batchid=2) for i in range(31, 36)],
        deleted_trades=[28, 29, 30],
    )


# -- tests --------------------------------------------------------------------------------------------------


def test_ddl_covers_every_declared_warehouse_table_with_its_key_and_indexes(target):
    _, pk_rows = target.query(
        """SELECT c.relname, array_agg(a.attname ORDER BY k.ord)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE n.nspname = 'dw' AND i.indisprimary GROUP BY c.relname""",
        role="admin",
    )
    assert dict(pk_rows) == {t.name: list(t.key) for t in WAREHOUSE_TABLES}
    _, index_rows = target.query(
        "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'dw' AND indexname NOT LIKE '%pkey'"
    )
    expected = sorted(
        (t.name, f"CREATE INDEX {t.name}_{'_'.join(cols)}_idx ON dw.{t.name} USING btree ({', '.join(cols)})")
        for t in WAREHOUSE_TABLES
        for cols in t.pg_indexes
    )
    assert sorted(index_rows) == expected
    assert ("dimtrade", "CREATE INDEX dimtrade_sk_accountid_idx ON dw.dimtrade USING btree (sk_accountid)") in expected
    assert all(create_table_sql(t).startswith(f'CREATE TABLE IF NOT EXISTS dw."{t.name}"') for t in WAREHOUSE_TABLES)


def test_pull_catches_up_every_committed_batch_in_one_transaction(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    third = stream.batch(arrived_at=T0 + dt.timedelta(minutes=2), trades=[trade_row(40, batchid=3)])
    # Batch 4 committed DimTrade but its transform is not done: nothing of it may become visible.
    stream.batch(arrived_at=T0 + dt.timedelta(minutes=3), trades=[trade_row(99, batchid=4)], transform_done=False)

    assert pending_batches(stream.lake, target) == [1, 2, 3]
    report = migrate_pending(stream.lake, target)

    assert report.batches == (1, 2, 3)
    assert report.tables == {"statustype": 2, "tradetype": 4, "dimtrade": 33}  # 35 trades, 3 deleted, +1
    assert trades_in_pg(target) == stream.model.summary()
    assert 99 not in [r[0] for r in trades_in_pg(target)]
    # one ledger row per table, all carrying the unit's last batch
    assert [(t, b) for t, _, b, _, _ in ledger_rows(target)] == [("dimtrade", 3), ("statustype", 3), ("tradetype", 3)]
    # every batch of the unit has its metrics row; rows = change rows of the batch's commits (4+2 / 30 | 15+3 | 1)
    second_arrival = T0 + dt.timedelta(minutes=1)
    half = dt.timedelta(milliseconds=500)
    third_arrival = T0 + dt.timedelta(minutes=2)
    assert metrics_rows(target) == [
        (1, T0, T0 + half, T0 + dt.timedelta(seconds=1), 36, 3, "pull"),
        (2, second_arrival, second_arrival + half, second_arrival + dt.timedelta(seconds=1), 18, 3, "pull"),
        (3, third_arrival, third_arrival + half, third_arrival + dt.timedelta(seconds=1), 1, 3, "pull"),
    ]
    _, visible = target.query("SELECT count(DISTINCT visible_at) FROM streamdi.batch_metrics")
    assert visible == [(1,)]  # one transaction
    assert third == 3 and pending_batches(stream.lake, target) == []
    assert migrate_pending(stream.lake, target).batches == ()


def test_dataflow_migrate_stage_after_a_pull_is_a_no_op_and_is_marked_done(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    migrate_pending(stream.lake, target)
    before = (checksums(target), ledger_rows(target), metrics_rows(target))
    ctx = JobContext(target.settings, lake=stream.lake)

    detail = migrate_job(ctx, 2)

    assert detail == {"rows": {}, "versions": {}, "batches": []}
    assert stream.log.is_done(2, "migrate")
    assert (checksums(target), ledger_rows(target), metrics_rows(target)) == before


def test_push_per_batch_then_replays_change_nothing(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=2),
        trades=[trade_row(31, quantity=7, batchid=3)],
        reference={TRADE_TYPE: [{**TRADE_TYPES[0], "tt_name": "Limit Buy (renamed)"}]},
    )

    assert migrate_batch(stream.lake, target, 1).batches == (1,)
    after_one = trades_in_pg(target)
    assert migrate_batch(stream.lake, target, 2).tables == {"dimtrade": 18}
    assert migrate_batch(stream.lake, target, 3).tables == {"dimtrade": 1, "tradetype": 1}
    assert trades_in_pg(target) == stream.model.summary() != after_one
    assert [r[0] for r in metrics_rows(target)] == [1, 2, 3]
    state = (checksums(target), ledger_rows(target), metrics_rows(target))

    # Replays: every per-batch migration again, a pull, and the raw changes of batch 2 re-applied.
    for batch_id in (1, 2, 3):
        assert migrate_batch(stream.lake, target, batch_id).batches == ()
    assert migrate_pending(stream.lake, target).batches == ()
    feed = stream.lake.changes(DIM_TRADE, 1, stream.lake.version(DIM_TRADE))
    replay = TableChange(DIM_TRADE, 2, 2, arrow(DIM_TRADE, []), feed.select(["tradeid"]).slice(0, 3))
    assert target.apply_changes([replay]) == {"dimtrade": 0}
    assert (checksums(target), ledger_rows(target), metrics_rows(target)) == state


def test_query_snapshot_reports_the_staleness_of_the_newest_visible_batch(target, tmp_path):
    stream = StreamLake(tmp_path / "lake")
    assert target.read_snapshot("SELECT 1").staleness_seconds is None
    arrived = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)
    stream.batch(arrived_at=arrived - dt.timedelta(minutes=5), trades=[trade_row(1)])
    stream.batch(arrived_at=arrived, trades=[trade_row(2)])
    migrate_pending(stream.lake, target)

    snap = target.read_snapshot("SELECT count(*) AS trades FROM dw.dimtrade")

    assert (snap.columns, snap.rows, snap.newest_batch, snap.newest_arrived_at) == (["trades"], [(2,)], 2, arrived)
    assert 30 <= snap.staleness_seconds < 60
    assert snap.seconds >= 0


def test_database_settings_gives_an_empty_database_of_its_own(target):
    name = target.query("SELECT current_database()")[1][0][0]
    assert name.startswith("mig_test_database_settings")
    assert target.query("SELECT count(*) FROM streamdi.batch_metrics")[1] == [(0,)]


def test_a_pull_migrates_past_a_batch_an_operator_skipped(tmp_path, target):
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    skipped = stream.batch(arrived_at=T0 + dt.timedelta(minutes=2), transform_done=False)
    assert stream.log.skip(skipped, "delivered twice", now=T0 + dt.timedelta(minutes=3)) == [
        "stage",
        "transform",
        "migrate",
    ]
    after = stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=4), trades=[trade_row(i, batchid=3) for i in range(36, 38)]
    )

    assert pending_batches(stream.lake, target) == [1, 2, skipped, after]
    report = migrate_pending(stream.lake, target)
    assert report.batches == (1, 2, 3, 4)
    assert target.last_visible_batch() == after
    assert trades_in_pg(target) == stream.model.summary()
    assert [r[0] for r in trades_in_pg(target)][-2:] == [36, 37]


def test_a_migration_passes_over_commits_the_log_cleanup_removed(tmp_path, target):
    """After a pull, DimTrade gets commits without data (a vacuum's) and a checkpoint, and the log cleanup
    (`delta_log.remove_before`) deletes every commit file before it: the ledger's version and the ones after it
    are gone. The next pull reads from the oldest commit the log still has and lands the next batch's trades."""
    stream = StreamLake(tmp_path / "lake")
    first_batches(stream)
    assert migrate_pending(stream.lake, target).batches == (1, 2)
    migrated = stream.lake.version(DIM_TRADE)
    path = stream.lake.path(DIM_TRADE)
    delta = DeltaTable(str(path))
    delta.vacuum(0, dry_run=False, enforce_retention_duration=False)  # the files batch 2's MERGE replaced
    delta.update_incremental()
    assert delta.version() == migrated + 2  # VACUUM START, VACUUM END: no data
    delta.create_checkpoint()
    assert remove_before(path / "_delta_log", delta.version()) == migrated + 2  # the commits before the checkpoint
    later = stream.batch(arrived_at=T0 + dt.timedelta(minutes=2), trades=[trade_row(50, batchid=3)])

    report = migrate_pending(stream.lake, target)

    assert report.batches == (later,) and report.tables == {"dimtrade": 1}
    assert trades_in_pg(target) == stream.model.summary()
    assert [r[0] for r in trades_in_pg(target)][-1] == 50
