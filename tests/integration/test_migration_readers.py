"""Batch atomicity as readers see it: while a separate process migrates micro-batches one transaction each, a
reader queries PostgreSQL in a tight loop; every snapshot must hold exactly the batches its `batch_metrics` says
are visible -- all rows of each, in both tables, and nothing of a later one."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from test_migration_pending import T0, TRADE_TYPES, StreamLake, database_settings, trade_row

from schemas.warehouse import TRADE_TYPE, WAREHOUSE_TABLES
from streamdi.warehouse import open_warehouse

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BATCHES = 10
TRADES_PER_BATCH = 2_000
MIGRATE_ONE_BY_ONE = """
import sys
from pathlib import Path
from streamdi.lake import Lake
from streamdi.migrator import migrate_batch
from streamdi.settings import Settings
from streamdi.warehouse import open_warehouse
warehouse = open_warehouse(Settings(home=sys.argv[1], database_url=sys.argv[2]))
lake = Lake(Path(sys.argv[3]))
for batch_id in range(1, int(sys.argv[4]) + 1):
    assert migrate_batch(lake, warehouse, batch_id).batches == (batch_id,)
"""


def expected_after(batch: int) -> tuple:
    """(trades, newest trade batch, quantity of trade 1, trade types) once batches 1..batch are visible: each
    batch adds TRADES_PER_BATCH trades, sets trade 1's quantity to its number, deletes the first trade of the
    batch before it, and adds one trade type."""
    if batch == 0:
        return (0, None, None, 0)
    deleted = batch - 1
    return (batch * TRADES_PER_BATCH - deleted, batch, batch if batch > 1 else trade_row(1)["quantity"], batch)


def build_stream(root: Path) -> StreamLake:
    stream = StreamLake(root)
    for b in range(1, BATCHES + 1):
        first = (b - 1) * TRADES_PER_BATCH + 1
        rows = [trade_row(i, batchid=b) for i in range(first, first + TRADES_PER_BATCH)]
        if b > 1:
            rows.append(trade_row(1, quantity=b, batchid=1))
        stream.batch(
            arrived_at=T0 + dt.timedelta(seconds=b),
            trades=rows,
            deleted_trades=[first - TRADES_PER_BATCH + 1] if b > 1 else [],
            reference={TRADE_TYPE: [{**TRADE_TYPES[0], "tt_id": f"B{b:02d}"}]},
        )
    return stream


def test_readers_never_see_a_half_migrated_batch(settings, warehouse, tmp_path):
    stream = build_stream(tmp_path / "lake")
    db = database_settings(settings, warehouse, "mig_readers")
    target = open_warehouse(db)
    target.ensure_objects(WAREHOUSE_TABLES)
    probe = """SELECT (SELECT count(*) FROM dw.dimtrade), (SELECT max(batchid) FROM dw.dimtrade),
                      (SELECT quantity FROM dw.dimtrade WHERE tradeid = 1), (SELECT count(*) FROM dw.tradetype)"""

    migrator = subprocess.Popen(
        [
            sys.executable,
            "-c",
            MIGRATE_ONE_BY_ONE,
            str(settings.home),
            db.database_url,
            str(stream.lake.root),
            str(BATCHES),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[int, int] = {}
    try:
        while True:
            finished = migrator.poll() is not None
            snap = target.read_snapshot(probe)
            visible = snap.newest_batch or 0
            assert snap.rows[0] == expected_after(visible), f"snapshot with batches 1..{visible} visible"
            seen[visible] = seen.get(visible, 0) + 1
            if finished:
                break
    finally:
        if migrator.poll() is None:
            migrator.kill()
        _, stderr = migrator.communicate(timeout=60)
    assert migrator.returncode == 0, stderr
    assert max(seen) == BATCHES
    # the reader really ran during the migrations: it saw several intermediate states
    assert len([b for b in seen if 0 < b < BATCHES]) >= 3, seen
