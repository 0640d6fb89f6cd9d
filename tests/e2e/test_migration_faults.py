"""Crash tests of the migrator through the real CLI: `streamdi migrate` is killed with SIGKILL
(`STREAMDI_FAULT_AT`) before the transaction, during a COPY, after a COPY before its upsert and after every
upsert before COMMIT, while it catches up two batches (a unit touching three tables). PostgreSQL must then be
exactly at the previous ledger state; a rerun must give what an uninterrupted run gives -- every dw table by a
checksum query, no duplicate keys, the same ledger and batch metrics -- and DimTrade must hold exactly the rows
the test's own model says.

Lakes are hand-built with `Lake` (no Spark); each run migrates into a database of its own on the test server.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_migration_pending import (  # noqa: E402
    STATUS_TYPES,
    T0,
    TRADE_TYPES,
    StreamLake,
    checksums,
    completed,
    database_settings,
    ledger_rows,
    metrics_rows,
    trade_row,
    trades_in_pg,
)

from schemas.warehouse import STATUS_TYPE, TRADE_TYPE, WAREHOUSE_TABLES  # noqa: E402
from streamdi.lake import Lake  # noqa: E402
from streamdi.migrator import migrate_pending  # noqa: E402
from streamdi.warehouse import open_warehouse  # noqa: E402
from streamdi.warehouse_apply import COPY_CHUNK_ROWS  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

BIG = COPY_CHUNK_ROWS + 2_000  # DimTrade rows of batch 3: its COPY is sent in two chunks
# The unit of batches 3-4 changes StatusType, TradeType and DimTrade, in that order: `pg.during_copy#3` dies inside
# DimTrade's COPY after the other two were applied in the same transaction, `pg.after_copy#2` right after
# TradeType's COPY, before its upsert; `pg.before_commit` after every upsert, ledger and metrics row.
FAULTS = ["migrate.before_apply", "pg.during_copy#3", "pg.after_copy#2", "pg.before_commit"]


def cli(*args: str, home: Path, database_url: str, lake: Path, fault: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    env.update(STREAMDI_HOME=str(home), STREAMDI_LAKE=str(lake), DATABASE_URL=database_url, COLUMNS="200")
    if fault:
        env["STREAMDI_FAULT_AT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def lakes(tmp_path_factory) -> tuple[Path, Path, StreamLake]:
    """Two states of one stream: after batches 1-2, and after batches 3-4 plus a partly committed batch 5."""
    root = tmp_path_factory.mktemp("migration-faults")
    stream = StreamLake(root / "lake")
    stream.batch(
        arrived_at=T0,
        reference={TRADE_TYPE: TRADE_TYPES, STATUS_TYPE: STATUS_TYPES},
        trades=[trade_row(i) for i in range(1, 2_001)],
    )
    stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=1),
        trades=[completed(trade_row(i), Decimal("30.00") + i % 11) for i in range(1, 301)],
        deleted_trades=[1_999, 2_000],
    )
    first = root / "after-2"
    shutil.copytree(stream.lake.root, first)
    stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=2),
        reference={
            TRADE_TYPE: [{**TRADE_TYPES[3], "tt_name": "Market Sell (renamed)"}],
            STATUS_TYPE: [{"st_id": "CNCL", "st_name": "Canceled"}],
        },
        trades=[trade_row(i, batchid=3) for i in range(10_001, 10_001 + BIG)]
        + [completed(trade_row(i), Decimal("41.00")) for i in range(301, 401)],
    )
    stream.batch(
        arrived_at=T0 + dt.timedelta(minutes=3),
        trades=[trade_row(5, quantity=1, batchid=4)],
        deleted_trades=[6, 10_001],
    )
    stream.batch(arrived_at=T0 + dt.timedelta(minutes=4), trades=[trade_row(7, quantity=0)], transform_done=False)
    return first, stream.lake.root, stream


def run_to_final(settings, warehouse, tmp_path: Path, name: str, first: Path, final: Path, fault: str | None):
    """Migrate the first state in-process, then `streamdi migrate` (killed at `fault`, then rerun) on the final
    one. Returns the warehouse and what it held before the CLI ran."""
    db = database_settings(settings, warehouse, name)
    target = open_warehouse(db)
    target.ensure_objects(WAREHOUSE_TABLES)
    lake_dir = tmp_path / f"lake-{name}"
    shutil.copytree(first, lake_dir)
    assert migrate_pending(Lake(lake_dir), target).batches == (1, 2)
    before = (checksums(target), ledger_rows(target), metrics_rows(target))
    shutil.rmtree(lake_dir)
    shutil.copytree(final, lake_dir)
    if fault:
        crashed = cli("migrate", home=settings.home, database_url=db.database_url, lake=lake_dir, fault=fault)
        assert crashed.returncode == -9, (crashed.stdout, crashed.stderr)
        assert (checksums(target), ledger_rows(target), metrics_rows(target)) == before
    done = cli("migrate", home=settings.home, database_url=db.database_url, lake=lake_dir)
    assert done.returncode == 0, done.stderr
    assert "batches 3-4 visible in" in done.stdout
    return target, before


@pytest.fixture(scope="module")
def uninterrupted(settings, warehouse, lakes, tmp_path_factory):
    first, final, _ = lakes
    target, _ = run_to_final(settings, warehouse, tmp_path_factory.mktemp("ref"), "mig_faults_ref", first, final, None)
    return checksums(target), ledger_rows(target), metrics_rows(target)


@pytest.mark.parametrize("fault", FAULTS)
def test_killed_migration_then_rerun_equals_the_uninterrupted_run(settings, warehouse, lakes, uninterrupted, fault):
    first, final, stream = lakes
    name = "mig_fault_" + fault.replace(".", "_").replace("#", "_")
    target, before = run_to_final(settings, warehouse, Path(final).parent, name, first, final, fault)

    sums, ledger, metrics = uninterrupted
    assert checksums(target) == sums
    assert all(count == distinct_keys for count, distinct_keys, _ in sums.values())  # no duplicates
    assert sums["dimtrade"][0] == 2_000 - 2 + BIG - 2 and sums["tradetype"][0] == 4 and sums["statustype"][0] == 3
    assert trades_in_pg(target) == stream.model.summary()  # batch 5's trade 7 change is not there
    assert ledger_rows(target) == ledger
    assert [(t, b) for t, _, b, _, _ in ledger] == [
        ("dimtrade", 2),
        ("dimtrade", 4),
        ("statustype", 2),
        ("statustype", 4),
        ("tradetype", 2),
        ("tradetype", 4),
    ]
    assert [(b, unit, mode) for b, _, _, _, _, unit, mode in metrics_rows(target)] == [
        (1, 2, "pull"),
        (2, 2, "pull"),
        (3, 4, "push"),
        (4, 4, "push"),
    ]
    assert metrics_rows(target) == metrics and before[2] == metrics[:2]


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="restarts the embedded server (no DATABASE_URL)")
def test_postgres_restarted_in_the_middle_of_a_migration(settings, warehouse, lakes, uninterrupted, tmp_path):
    """PostgreSQL restarts while `streamdi migrate` is inside its transaction (between two COPY chunks of DimTrade):
    the run fails with one line that says what happened and what to do, PostgreSQL is exactly at the previous ledger
    state, and a rerun after the restart gives what an uninterrupted run gives."""
    from cli_runs import wait_paused

    from streamdi import embedded_pg

    first, final, _ = lakes
    db = database_settings(settings, warehouse, "mig_pg_restart")
    target = open_warehouse(db)
    target.ensure_objects(WAREHOUSE_TABLES)
    lake_dir = tmp_path / "lake"
    shutil.copytree(first, lake_dir)
    assert migrate_pending(Lake(lake_dir), target).batches == (1, 2)
    before = (checksums(target), ledger_rows(target), metrics_rows(target))
    shutil.rmtree(lake_dir)
    shutil.copytree(final, lake_dir)

    paused = tmp_path / "paused"
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    env.update(
        STREAMDI_HOME=str(settings.home),
        STREAMDI_LAKE=str(lake_dir),
        DATABASE_URL=db.database_url,
        COLUMNS="200",
        STREAMDI_FAULT_AT="pg.during_copy#3",
        STREAMDI_FAULT_PAUSE=str(paused),
    )
    migrating = subprocess.Popen(
        [sys.executable, "-m", "streamdi.run.cli", "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    wait_paused(paused, migrating, timeout=120)
    assert embedded_pg.stop_server(settings)  # fast shutdown: the migration's session is cut
    embedded_pg.ensure_server(settings)
    paused.unlink()
    out, err = (s.decode() for s in migrating.communicate(timeout=120))
    assert migrating.returncode == 1, (out, err)
    assert "was lost during a migration" in err and "nothing of it was committed" in err, err
    assert "Run again once the server is back" in err and "Traceback" not in err, err
    assert (checksums(target), ledger_rows(target), metrics_rows(target)) == before

    rerun = cli("migrate", home=settings.home, database_url=db.database_url, lake=lake_dir)
    assert rerun.returncode == 0, rerun.stderr
    assert "batches 3-4 visible in" in rerun.stdout
    assert (checksums(target), ledger_rows(target), metrics_rows(target)) == uninterrupted
