"""A migration running beside its micro-batch's transform (`migrate_batch(beside=TransformProgress())`), on real
Delta tables written with `Lake` (no Spark) and a real PostgreSQL database of its own: tables land inside the open
transaction as the transform finishes them, a reader sees nothing of the batch until the transform is done, a commit
made after a table was declared finished still lands, and an abandoned transform leaves PostgreSQL as it was.

The expected rows come from the test's own `TradeModel`, not from the code under test.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from cli_runs import locked_tables
from test_migration_pending import (
    STATUS_TYPES,
    T0,
    TRADE_TYPES,
    StreamLake,
    arrow,
    completed,
    database_settings,
    ledger_rows,
    trade_row,
    trades_in_pg,
)

from schemas.warehouse import (
    ACCOUNT_TABLES,
    DIM_BROKER,
    DIM_TRADE,
    REFERENCE_TABLES,
    SECURITY_TABLES,
    STATUS_TYPE,
    TRADE_TYPE,
    WAREHOUSE_TABLES,
)
from streamdi.batchlog import LandedFile
from streamdi.migrator import TransformAbandoned, TransformProgress, migrate_batch
from streamdi.warehouse import open_warehouse

pytestmark = pytest.mark.integration

WAIT_S = 60
BEFORE_T3 = (*REFERENCE_TABLES, DIM_BROKER, *SECURITY_TABLES, *ACCOUNT_TABLES)  # T0, T1, T2's tables


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def ending(progress: TransformProgress):
    """A test that fails while a migration waits on `progress` abandons it, so the migration's thread ends."""
    try:
        yield
    finally:
        progress.abandon("the test ended")


def t3_lands(stream: StreamLake, target, progress: TransformProgress, batch_id: int, trades: list[dict]) -> None:
    """T0, T1 and T2 write nothing in the batch; T3 commits `trades` to DimTrade and is done; then wait until the
    migration beside it has landed DimTrade in its open transaction."""
    progress.finished(BEFORE_T3)
    stream.lake.upsert(DIM_TRADE, arrow(DIM_TRADE, trades), app_id="T3/dimtrade", version=batch_id)
    progress.finished([DIM_TRADE])
    wait_until(lambda: "dimtrade" in locked_tables(target), "DimTrade to land in the open transaction")


def started_batch(stream: StreamLake) -> int:
    """Batch 2 registered and staged, its transform not done."""
    batch_id = stream.log.last_batch_id() + 1
    at = T0 + dt.timedelta(minutes=batch_id)
    stream.log.register([LandedFile(f"Batch2/drip-{batch_id:04d}.txt", 10, f"sha-{batch_id}", at, 2)], now=at)
    stream.log.mark(batch_id, "stage", "done", now=at)
    return batch_id


@pytest.fixture
def target(settings, warehouse, request):
    """A Warehouse on a fresh database named after the test."""
    target = open_warehouse(database_settings(settings, warehouse, "beside_" + request.node.name.lower()[:40]))
    target.ensure_objects(WAREHOUSE_TABLES)
    return target


@pytest.fixture
def batch1(target, tmp_path):
    """Batch 1 (reference tables, trades 1-20) migrated the usual way."""
    stream = StreamLake(tmp_path / "lake")
    stream.batch(
        arrived_at=T0,
        reference={TRADE_TYPE: TRADE_TYPES, STATUS_TYPE: STATUS_TYPES},
        trades=[trade_row(i) for i in range(1, 21)],
    )
    assert migrate_batch(stream.lake, target, 1).batches == (1,)
    return stream


def test_tables_land_as_their_step_finishes_and_become_visible_with_the_transform(batch1, target):
    stream = batch1
    batch_id = started_batch(stream)
    progress = TransformProgress()
    with ThreadPoolExecutor(1) as pool, ending(progress):
        migration = pool.submit(migrate_batch, stream.lake, target, batch_id, beside=progress)
        # T3: trades 1-5 complete, trade 21 arrives
        first = [completed(trade_row(i), Decimal("30.50") + i) for i in range(1, 6)] + [trade_row(21, batchid=2)]
        t3_lands(stream, target, progress, batch_id, first)
        stream.model.apply(first)
        # landed, not visible: a reader still sees batch 1 only
        assert target.last_visible_batch() == 1
        assert [r[:2] for r in trades_in_pg(target)] == [(i, "Submitted") for i in range(1, 21)]
        assert not migration.done()
        # a later commit to DimTrade in the same micro-batch (a step that writes a table another step finished)
        late = [completed(trade_row(21, batchid=2), Decimal("9.99"))]
        stream.lake.upsert(DIM_TRADE, arrow(DIM_TRADE, late), app_id="DM/dimtrade", version=batch_id)
        stream.model.apply(late)
        stream.mark_transformed(batch_id, T0 + dt.timedelta(minutes=3))
        progress.done()
        report = migration.result(timeout=WAIT_S)
    assert report.batches == (batch_id,)
    assert target.last_visible_batch() == batch_id
    assert trades_in_pg(target) == stream.model.summary()
    # DimTrade landed in two parts of the one transaction: the step's commit, then the late one
    dimtrade = [r for r in ledger_rows(target) if r[0] == "dimtrade"]
    assert [(r[2], r[3], r[4]) for r in dimtrade] == [(1, 20, 0), (2, 6, 0), (2, 1, 0)]
    assert report.tables["dimtrade"] == 7


def test_an_abandoned_transform_leaves_postgresql_as_it_was_and_a_later_migration_lands_the_batch(batch1, target):
    stream = batch1
    before = (trades_in_pg(target), ledger_rows(target))
    batch_id = started_batch(stream)
    progress = TransformProgress()
    with ThreadPoolExecutor(1) as pool, ending(progress):
        migration = pool.submit(migrate_batch, stream.lake, target, batch_id, beside=progress)
        rows = [completed(trade_row(i), Decimal("11.25")) for i in range(6, 9)]
        t3_lands(stream, target, progress, batch_id, rows)
        progress.abandon("the transform halted")
        with pytest.raises(TransformAbandoned, match="the transform halted"):
            migration.result(timeout=WAIT_S)
    assert "dimtrade" not in locked_tables(target)
    assert (trades_in_pg(target), ledger_rows(target)) == before
    assert target.last_visible_batch() == 1
    # the operator resumes, the transform finishes: the ordinary migrate step lands the batch once
    stream.model.apply(rows)
    stream.mark_transformed(batch_id, T0 + dt.timedelta(minutes=4))
    assert migrate_batch(stream.lake, target, batch_id).batches == (batch_id,)
    assert trades_in_pg(target) == stream.model.summary()
    assert [(r[2], r[3]) for r in ledger_rows(target) if r[0] == "dimtrade"] == [(1, 20), (2, 3)]


def test_progress_waits_end_when_the_transform_is_done_or_abandoned():
    done, abandoned = TransformProgress(), TransformProgress()
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(done.wait_for, DIM_TRADE)
        whole = pool.submit(abandoned.wait_for, None)
        time.sleep(0.2)
        assert not waiting.done() and not whole.done()
        done.done()
        abandoned.abandon("failed")
        assert waiting.result(timeout=WAIT_S) is True
        with pytest.raises(TransformAbandoned, match="failed"):
            whole.result(timeout=WAIT_S)
    finished = TransformProgress()
    finished.finished([DIM_TRADE])
    assert finished.wait_for(DIM_TRADE) is False  # finished, the transform not done yet


def test_progress_names_the_first_finished_table_in_the_order_given():
    progress = TransformProgress()
    tables = [*ACCOUNT_TABLES, DIM_TRADE]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(progress.next_finished, tables)
        time.sleep(0.2)
        assert not waiting.done()  # none finished yet
        progress.finished([DIM_TRADE])
        assert waiting.result(timeout=WAIT_S) == (DIM_TRADE, False)
    progress.finished(ACCOUNT_TABLES)
    assert progress.next_finished(tables) == (ACCOUNT_TABLES[0], False)
    progress.done()
    assert progress.next_finished([DIM_BROKER]) == (DIM_BROKER, True)
    progress.abandon("failed")
    with pytest.raises(TransformAbandoned, match="failed"):
        progress.next_finished([DIM_BROKER])


def test_a_table_finished_before_an_earlier_one_lands_first(batch1, target):
    """T3 finishes DimTrade while T2 still runs: the migration lands DimTrade without waiting for T2's tables, which
    come earlier in its order."""
    stream = batch1
    batch_id = started_batch(stream)
    progress = TransformProgress()
    with ThreadPoolExecutor(1) as pool, ending(progress):
        migration = pool.submit(migrate_batch, stream.lake, target, batch_id, beside=progress)
        progress.finished([*REFERENCE_TABLES, DIM_BROKER, *SECURITY_TABLES])  # T0 and T1; T2 has not finished
        rows = [trade_row(i, batchid=2) for i in range(41, 44)]
        stream.lake.upsert(DIM_TRADE, arrow(DIM_TRADE, rows), app_id="T3/dimtrade", version=batch_id)
        progress.finished([DIM_TRADE])
        wait_until(lambda: "dimtrade" in locked_tables(target), "DimTrade to land while T2's tables are unfinished")
        assert not migration.done()
        stream.model.apply(rows)
        progress.finished(ACCOUNT_TABLES)
        stream.mark_transformed(batch_id, T0 + dt.timedelta(minutes=3))
        progress.done()
        assert migration.result(timeout=WAIT_S).batches == (batch_id,)
    assert trades_in_pg(target) == stream.model.summary()
    assert [(r[2], r[3]) for r in ledger_rows(target) if r[0] == "dimtrade"] == [(1, 20), (2, 3)]


def test_a_compaction_after_a_table_landed_adds_no_second_change_and_the_next_batch_migrates_on(batch1, target):
    """A compaction (`compact_job`) while the migration is open: a commit without data to a table the migration
    already landed. It is not landed as an empty second change; the next migration takes it."""
    stream = batch1
    batch_id = started_batch(stream)
    progress = TransformProgress()
    with ThreadPoolExecutor(1) as pool, ending(progress):
        migration = pool.submit(migrate_batch, stream.lake, target, batch_id, beside=progress)
        rows = [trade_row(i, batchid=2) for i in range(41, 44)]  # new trades: a file of their own
        t3_lands(stream, target, progress, batch_id, rows)
        stream.model.apply(rows)
        before = stream.lake.version(DIM_TRADE)
        assert stream.lake.compact(min_small_files=2)[DIM_TRADE.qualified_name] == 2
        assert stream.lake.version(DIM_TRADE) == before + 1
        stream.mark_transformed(batch_id, T0 + dt.timedelta(minutes=3))
        progress.done()
        report = migration.result(timeout=WAIT_S)
    assert report.versions["dimtrade"] == before
    assert [(r[1], r[2], r[3]) for r in ledger_rows(target) if r[0] == "dimtrade" and r[2] == 2] == [(before, 2, 3)]
    stream.batch(arrived_at=T0 + dt.timedelta(minutes=5), trades=[trade_row(50, batchid=3)])
    assert migrate_batch(stream.lake, target, 3).batches == (3,)
    assert trades_in_pg(target) == stream.model.summary()
