"""Push versus pull: the migration experiment of the streaming-ETL paper, on a drip stream of trades.

Not a test. For every migration interval (default 0.1, 0.5, 1, 2, 5, 10 s) and both modes it runs, for
`--duration` seconds, three threads against a fresh lake and a truncated PostgreSQL warehouse:
- a drip stream: every `--batch-every` s a micro-batch arrives (its arrival time is taken then) and is committed
  to the Delta warehouse as the dataflow would (batch log registration, DimTrade MERGE with `--trades` new trades
  and as many earlier trades completing, transform mark);
- a pusher: `migrate_pending` every interval (push mode, what `streamdi migrate --every INTERVAL` does);
- an analyst: the named query `trade_summary` every `--query-every` s; in "pull" mode it first runs
  `migrate_pending` (what `streamdi query --fresh` does), in "push" mode it only queries.
Measured per query: staleness (query snapshot time minus the arrival of the newest visible batch) and run time
(including the pull in pull mode); per batch: ingestion latency (visible in PostgreSQL minus arrival). When the
stream stops, the pusher keeps its schedule until every batch is visible, so the maximum covers every batch.

    .venv/bin/python bench/migration_modes.py [--out /tmp/streamdi-migration-modes] [--duration 12]

writes `<out>/migration_modes.csv` (one row per interval and mode), `<out>/queries.csv` (every query) and
`<out>/migration_modes.png` (three panels: staleness, query time, maximum ingestion latency). The embedded
PostgreSQL server and the lakes live under `<out>/work` (DATABASE_URL is ignored).
"""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import pyarrow as pa
import typer

from schemas.warehouse import DIM_TRADE, TRADE_TYPE, WAREHOUSE_TABLES
from streamdi import embedded_pg
from streamdi.batchlog import BatchLog, LandedFile
from streamdi.lake import Lake
from streamdi.migrator import migrate_pending
from streamdi.queries import NAMED_QUERIES
from streamdi.scripts import script_app
from streamdi.settings import Settings
from streamdi.warehouse import Warehouse, open_warehouse

TYPES = ["Limit Buy", "Limit Sell", "Market Buy", "Market Sell"]
TRADE_TYPES = [
    {"tt_id": "TLB", "tt_name": "Limit Buy", "tt_is_sell": 0, "tt_is_mrkt": 0},
    {"tt_id": "TLS", "tt_name": "Limit Sell", "tt_is_sell": 1, "tt_is_mrkt": 0},
    {"tt_id": "TMB", "tt_name": "Market Buy", "tt_is_sell": 0, "tt_is_mrkt": 1},
    {"tt_id": "TMS", "tt_name": "Market Sell", "tt_is_sell": 1, "tt_is_mrkt": 1},
]


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def trade(tradeid: int, batch: int, done: bool = False) -> dict:
    """A DimTrade row; `done` gives the trade's completed version (close date, trade price, fees)."""
    bid = Decimal("20.00") + Decimal(tradeid % 997) / 100
    return {
        "tradeid": tradeid,
        "sk_brokerid": 4_000_000 + tradeid % 31,
        "sk_createdateid": 20170704,
        "sk_createtimeid": 93000,
        "sk_closedateid": 20170705 if done else None,
        "sk_closetimeid": 100000 if done else None,
        "status": "Completed" if done else "Submitted",
        "type": TYPES[tradeid % 4],
        "cashflag": tradeid % 2 == 0,
        "sk_securityid": 10 + tradeid % 101,
        "sk_companyid": 20 + tradeid % 53,
        "quantity": 100 + tradeid % 400,
        "bidprice": bid,
        "sk_customerid": 30 + tradeid % 211,
        "sk_accountid": 40 + tradeid % 401,
        "executedby": f"Broker {tradeid % 17}",
        "tradeprice": bid + Decimal(tradeid % 7 - 3) / 10 if done else None,
        "fee": Decimal("1.50") if done else None,
        "commission": Decimal("2.25") if done else None,
        "tax": Decimal("0.75") if done else None,
        "batchid": 2 if batch > 1 else 1,
    }


class DripStream:
    """Micro-batches of trades committed to a Delta warehouse the way the dataflow commits them."""

    def __init__(self, root: Path, trades_per_batch: int) -> None:
        self.lake = Lake(root)
        self.log = BatchLog(self.lake)
        self.trades_per_batch = trades_per_batch
        self.next_trade = 1

    def commit_batch(self, initial_trades: int = 0) -> int:
        arrived = now()
        batch_id = self.log.last_batch_id() + 1
        self.log.register([LandedFile(f"drip/trades-{batch_id:05d}.txt", 0, "-", arrived, 2)], now=arrived)
        new = initial_trades or self.trades_per_batch
        first = self.next_trade
        rows = [trade(t, batch_id) for t in range(first, first + new)]
        # as many earlier trades complete (the oldest still open ones)
        closing = (
            range(max(1, first - new * 4), max(1, first - new * 4) + min(new, first - 1)) if not initial_trades else ()
        )
        rows += [trade(t, batch_id, done=True) for t in closing]
        self.next_trade += new
        if batch_id == 1:
            self.lake.upsert(
                TRADE_TYPE,
                pa.Table.from_pylist(TRADE_TYPES, schema=TRADE_TYPE.arrow_schema()),
                app_id="T0/tradetype",
                version=batch_id,
            )
        self.lake.upsert(
            DIM_TRADE,
            pa.Table.from_pylist(rows, schema=DIM_TRADE.arrow_schema()),
            app_id="T3/dimtrade",
            version=batch_id,
        )
        self.log.mark(batch_id, "transform", "done", now=now())
        return batch_id


@dataclass
class QuerySample:
    interval: float
    mode: str
    at: float
    staleness: float | None
    seconds: float


def reset(warehouse: Warehouse) -> None:
    warehouse.empty_tables(WAREHOUSE_TABLES)


def run_one(
    warehouse: Warehouse, lake_dir: Path, interval: float, mode: str, args: SimpleNamespace
) -> tuple[list[QuerySample], list[float], int]:
    """One configuration: (query samples, ingestion latencies of the stream's batches, batches)."""
    shutil.rmtree(lake_dir, ignore_errors=True)
    reset(warehouse)
    stream = DripStream(lake_dir, args.trades)
    stream.commit_batch(initial_trades=args.initial_trades)
    migrate_pending(stream.lake, warehouse, mode="push")
    sql = NAMED_QUERIES["trade_summary"].sql
    stop_stream, stop_push, stop_query = threading.Event(), threading.Event(), threading.Event()
    produced: list[int] = []
    errors: list[BaseException] = []
    samples: list[QuerySample] = []

    def guarded(body):
        def run():
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                stop_stream.set()
                stop_push.set()
                stop_query.set()

        return threading.Thread(target=run, daemon=True)

    def drip():
        while not stop_stream.is_set():
            started = time.monotonic()
            produced.append(stream.commit_batch())
            stop_stream.wait(max(0.0, args.batch_every - (time.monotonic() - started)))

    def push():
        while not stop_push.is_set():
            started = time.monotonic()
            migrate_pending(stream.lake, warehouse, mode="push")
            stop_push.wait(max(0.0, interval - (time.monotonic() - started)))

    def query():
        begin = time.monotonic()
        while not stop_query.is_set():
            started = time.monotonic()
            if mode == "pull":
                migrate_pending(stream.lake, warehouse, mode="pull")
            snap = warehouse.read_snapshot(sql)
            samples.append(
                QuerySample(interval, mode, started - begin, snap.staleness_seconds, time.monotonic() - started)
            )
            stop_query.wait(max(0.0, args.query_every - (time.monotonic() - started)))

    threads = [guarded(drip), guarded(push), guarded(query)]
    for t in threads:
        t.start()
    time.sleep(args.duration)
    stop_query.set()
    stop_stream.set()
    threads[0].join()
    threads[2].join()
    last = produced[-1] if produced else 1
    deadline = time.monotonic() + interval * 3 + 30
    while not errors and (warehouse.last_visible_batch() or 0) < last and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_push.set()
    threads[1].join()
    if errors:
        raise errors[0]
    metrics = [m for m in warehouse.batch_metrics() if m["batch_id"] in set(produced)]
    latencies = [(m["visible_at"] - m["arrived_at"]).total_seconds() for m in metrics]
    return samples, latencies, len(produced)


def summarize(interval: float, mode: str, samples: list[QuerySample], latencies: list[float], batches: int) -> dict:
    staleness = [s.staleness for s in samples if s.staleness is not None]
    seconds = [s.seconds for s in samples]
    return {
        "interval_s": interval,
        "mode": mode,
        "batches": batches,
        "queries": len(samples),
        "staleness_mean_s": round(statistics.fmean(staleness), 4),
        "staleness_max_s": round(max(staleness), 4),
        "query_mean_ms": round(statistics.fmean(seconds) * 1000, 2),
        "query_max_ms": round(max(seconds) * 1000, 2),
        "ingestion_latency_mean_s": round(statistics.fmean(latencies), 4),
        "ingestion_latency_max_s": round(max(latencies), 4),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [
        ("staleness_mean_s", "staleness_max_s", "query staleness (s)", "mean (line) and max (dashed)"),
        ("query_mean_ms", "query_max_ms", "query run time (ms)", "mean (line) and max (dashed)"),
        ("ingestion_latency_max_s", None, "max ingestion latency (s)", "arrival -> visible in PostgreSQL"),
    ]
    for ax, (mean_key, max_key, label, note) in zip(axes, panels, strict=True):
        for mode, color in (("push", "tab:blue"), ("pull", "tab:orange")):
            sel = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["interval_s"])
            xs = [r["interval_s"] for r in sel]
            name = "push only" if mode == "push" else "pull before query"
            ax.plot(xs, [r[mean_key] for r in sel], "o-", color=color, label=name)
            if max_key:
                ax.plot(xs, [r[max_key] for r in sel], "--", color=color, alpha=0.6)
        ax.set_xscale("log")
        ax.set_xticks(sorted({r["interval_s"] for r in rows}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("migration interval (s)")
        ax.set_ylabel(label)
        ax.set_title(note, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("streamdi: push vs pull migration on a drip stream of trades")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


app = script_app()


@app.command(help=__doc__)
def main(
    out: Annotated[Path, typer.Option(help="output directory")] = Path("/tmp/streamdi-migration-modes"),
    intervals: Annotated[str, typer.Option(help="migration intervals, seconds")] = "0.1,0.5,1,2,5,10",
    duration: Annotated[float, typer.Option(help="seconds of stream per configuration")] = 12.0,
    batch_every: Annotated[float, typer.Option(help="seconds between micro-batches")] = 0.25,
    trades: Annotated[int, typer.Option(help="new trades per micro-batch")] = 100,
    initial_trades: Annotated[int, typer.Option(help="trades of the first (seed) batch")] = 20_000,
    query_every: Annotated[float, typer.Option(help="seconds between queries")] = 1.0,
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them

    intervals = [float(x) for x in args.intervals.split(",")]
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = Settings(home=work / "home", database_url=None)
    rows: list[dict] = []
    all_samples: list[QuerySample] = []
    try:
        warehouse = open_warehouse(settings)
        warehouse.ensure_objects(WAREHOUSE_TABLES)
        for interval in intervals:
            for mode in ("push", "pull"):
                samples, latencies, batches = run_one(warehouse, work / "lake", interval, mode, args)
                row = summarize(interval, mode, samples, latencies, batches)
                rows.append(row)
                all_samples += samples
                print(
                    f"interval {interval:>5}s {mode:<4}: {batches} batches, {row['queries']} queries, staleness "
                    f"mean {row['staleness_mean_s']:.3f}s max {row['staleness_max_s']:.3f}s, query mean "
                    f"{row['query_mean_ms']:.1f} ms, max ingestion latency {row['ingestion_latency_max_s']:.3f}s",
                    flush=True,
                )
    finally:
        embedded_pg.stop_server(settings)
    with open(args.out / "migration_modes.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(args.out / "queries.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["interval_s", "mode", "at_s", "staleness_s", "query_s"])
        for s in all_samples:
            writer.writerow([s.interval, s.mode, round(s.at, 4), s.staleness, round(s.seconds, 6)])
    plot(rows, args.out / "migration_modes.png")
    print(
        f"wrote {args.out / 'migration_modes.csv'}, {args.out / 'queries.csv'} and {args.out / 'migration_modes.png'}"
    )


if __name__ == "__main__":
    app()
