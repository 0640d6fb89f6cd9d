"""Migration benchmark: Batch1 throughput against `psql \\copy`, and the visibility latency of a micro-batch.

Not a test. Needs a lake whose warehouse tables hold a loaded batch, e.g. after

    STREAMDI_HOME=/tmp/mig-home streamdi load --data /tmp/streamdi-bench-sf3 --batch 1

and runs on an embedded PostgreSQL server of its own under `--home` (wiped first; DATABASE_URL is ignored):

    .venv/bin/python bench/migrate_throughput.py --lake /tmp/mig-home/lake

1. Throughput: `migrate_batch` of `--batch` into an empty `dw` (read the Delta change feed, net changes, COPY,
   ledger, one transaction), rows/s; `--repeat` runs on a truncated `dw`, the best is reported.
2. Baseline: the same rows exported to CSV files, then loaded by `psql -c "\\copy ..."` (one psql process per
   table, wall time including its start) into empty tables `LIKE dw.<table> INCLUDING ALL` (same primary keys
   and indexes) and, for reference, into bare tables without any index. Ratio = ours / psql (target >= 0.6).
3. Latency: on a copy of the lake's warehouse and batch log, `--micro-batches` times: commit `--trades` new
   trades to DimTrade in Delta as a new micro-batch (as T3 does), mark its transform done, then `migrate_batch`
   it; the time from the Delta commit returning to the PostgreSQL COMMIT returning (target <= 300 ms).
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import pyarrow as pa
import pyarrow.compute as pc
import typer

from schemas.platform import PLATFORM_TABLES
from schemas.warehouse import DIM_TRADE, WAREHOUSE_TABLES
from streamdi import embedded_pg
from streamdi.batchlog import BatchLog, LandedFile
from streamdi.lake import Lake
from streamdi.migrator import migrate_batch
from streamdi.scripts import script_app
from streamdi.settings import Settings

# `sql` is psycopg's module as streamdi.warehouse imports it: only streamdi/warehouse*.py import psycopg.
from streamdi.warehouse import Warehouse, open_warehouse, sql


def reset(warehouse: Warehouse) -> None:
    warehouse.empty_tables(WAREHOUSE_TABLES)


def psql(url: str, command: str) -> float:
    started = time.perf_counter()
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-qc", command], check=True, capture_output=True)
    return time.perf_counter() - started


def psql_baseline(warehouse: Warehouse, url: str, work: Path, indexed: bool) -> tuple[int, float]:
    """Rows and seconds of `\\copy` of every non-empty dw table's rows into fresh empty tables."""
    schema = "bench_indexed" if indexed else "bench_bare"
    warehouse.query(
        sql.SQL("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}").format(schema=sql.Identifier(schema)),
        role="admin",
    )
    rows = 0
    seconds = 0.0
    for table in WAREHOUSE_TABLES:
        csv = work / f"{table.name}.csv"
        if not csv.exists():
            psql(url, f"\\copy (SELECT * FROM dw.{table.name}) TO '{csv}' CSV")
        source = sql.Identifier("dw", table.name)
        count = warehouse.query(sql.SQL("SELECT count(*) FROM {}").format(source), role="admin")[1][0][0]
        if not count:
            continue
        like = sql.SQL("LIKE {} INCLUDING ALL" if indexed else "LIKE {}").format(source)
        warehouse.query(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(schema, table.name), like), role="admin")
        seconds += psql(url, f"\\copy {schema}.{table.name} FROM '{csv}' CSV")
        rows += count
    return rows, seconds


def copy_lake(source: Path, target: Path) -> Lake:
    """The warehouse and batch log of `source` (not staging), copied so the micro-batches leave it untouched."""
    shutil.rmtree(target, ignore_errors=True)
    for layer in {t.layer for t in (*WAREHOUSE_TABLES, *PLATFORM_TABLES)}:
        shutil.copytree(source / layer, target / layer)
    return Lake(target)


def micro_batch_latency(lake: Lake, warehouse: Warehouse, trades: int, count: int) -> list[tuple[float, float]]:
    """(commit -> visible, migrate_batch alone) seconds for `count` micro-batches of `trades` new trades."""
    batch_log = BatchLog(lake)
    template = lake.read_arrow(DIM_TRADE).slice(0, trades)
    results = []
    for _ in range(count):
        batch_id = batch_log.last_batch_id() + 1
        now = dt.datetime.now(dt.UTC)
        landed = LandedFile(f"bench/trades-{batch_id}.txt", 0, "-", now, 2)
        batch_log.register([landed], now=now)
        first = pc.max(lake.read_columns(DIM_TRADE, ["tradeid"])["tradeid"]).as_py() + 1
        rows = template.set_column(0, "tradeid", pa.array(range(first, first + trades), pa.int64()))
        lake.upsert(DIM_TRADE, rows, app_id="T3/dimtrade", version=batch_id)
        committed = time.perf_counter()
        batch_log.mark(batch_id, "transform", "done", now=dt.datetime.now(dt.UTC))
        started = time.perf_counter()
        report = migrate_batch(lake, warehouse, batch_id)
        visible = time.perf_counter()
        assert report.tables.get("dimtrade") == trades, report
        results.append((visible - committed, visible - started))
    return results


app = script_app()


@app.command(help=__doc__)
def main(
    lake: Annotated[Path, typer.Option(help="lake root with the loaded warehouse tables")],
    home: Annotated[Path, typer.Option(help="scratch home (wiped)")] = Path("/tmp/streamdi-migbench"),
    batch: Annotated[int, typer.Option(help="micro-batch to migrate (default 1: Batch1)")] = 1,
    repeat: Annotated[int, typer.Option(help="throughput runs (best is reported)")] = 3,
    trades: Annotated[int, typer.Option(help="trades per latency micro-batch")] = 1000,
    micro_batches: Annotated[int, typer.Option(help="latency micro-batches")] = 5,
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them

    shutil.rmtree(args.home, ignore_errors=True)
    work = args.home / "work"
    work.mkdir(parents=True)
    settings = Settings(home=args.home, lake=args.lake, database_url=None)
    source = Lake(args.lake)
    try:
        warehouse = open_warehouse(settings)
        warehouse.ensure_objects(WAREHOUSE_TABLES)
        url = embedded_pg.ensure_server(settings)

        runs = []
        for _ in range(args.repeat):
            reset(warehouse)
            started = time.perf_counter()
            report = migrate_batch(source, warehouse, args.batch)
            runs.append((report.rows, time.perf_counter() - started))
            print(f"migrate_batch({args.batch}): {report.rows:,} rows in {runs[-1][1]:.2f}s")
        rows, seconds = min(runs, key=lambda r: r[1])
        ours = rows / seconds

        baselines = {}
        for indexed in (True, False):
            copied, copy_seconds = psql_baseline(warehouse, url, work, indexed)
            assert copied == rows, (copied, rows)
            baselines[indexed] = copied / copy_seconds
            kind = "same keys and indexes" if indexed else "no indexes"
            print(f"psql \\copy ({kind}): {copied:,} rows in {copy_seconds:.2f}s")

        lake = copy_lake(args.lake, args.home / "lake")
        latencies = micro_batch_latency(lake, warehouse, args.trades, args.micro_batches)

        print()
        print(f"throughput, batch {args.batch} ({rows:,} rows, best of {args.repeat}):")
        print(f"  streamdi migrate_batch         {ours:12,.0f} rows/s")
        print(f"  psql \\copy, same keys/indexes  {baselines[True]:12,.0f} rows/s   ratio {ours / baselines[True]:.2f}")
        print(
            f"  psql \\copy, bare tables        {baselines[False]:12,.0f} rows/s   ratio {ours / baselines[False]:.2f}"
        )
        total = [t for t, _ in latencies]
        migrate = [m for _, m in latencies]
        print(f"micro-batch of {args.trades} trades, Delta commit -> visible in PostgreSQL ({len(total)} runs):")
        print(
            f"  median {statistics.median(total) * 1000:.0f} ms, max {max(total) * 1000:.0f} ms "
            f"(migrate_batch alone: median {statistics.median(migrate) * 1000:.0f} ms)"
        )
    finally:
        embedded_pg.stop_server(settings)


if __name__ == "__main__":
    app()
