"""Load throughput of the micro-batch dataflow into the Delta warehouse (stage + T0..T3 + DM; no PostgreSQL).

Usage: .venv/bin/python bench/load.py [--sf 3] [--data DIR] [--home DIR] [--drip 10]

Generates the data set if DIR has none, then in one process (Spark started once, before the clock):
1. Batch1 whole (the historical load): one micro-batch;
2. Batch2 whole: one incremental micro-batch;
3. Batch3 dripped as `--drip` micro-batches (the streaming case): seconds per micro-batch and its trades; or,
   with `--trades-apart`, as two micro-batches: every file but Trade.txt, then Trade.txt alone (a micro-batch of
   trades only, as when trades stream in between customer and account changes; at SF 6 it has ~1,000 lines).
Prints stage and transform seconds per micro-batch, the transform step times (and `compact`, the compaction the
transform job ends with), and the targets of issue 4:
Batch1 at SF 3 < 60 s, one incremental batch < 10 s, a 1,000-trade micro-batch through T0..T3 < 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from jobs import transform
from schemas import sources as src
from streamdi.context import JobContext
from streamdi.delivery import deliver_batch, drip_batch
from streamdi.generator import Params, generate
from streamdi.pipeline import collect_job, compact_job, stage_job
from streamdi.settings import Settings

TARGETS = {"Batch1": 60.0, "Batch2": 10.0}


def timed_compaction(ctx: JobContext) -> float:
    """The compaction a micro-batch's transform job ends with (`streamdi.pipeline.compact_job`), in seconds."""
    started = time.perf_counter()
    compact_job(ctx)
    return time.perf_counter() - started


TRADES_ONLY = "trades"


def split_trades(data: Path, batch: int, scratch: Path) -> dict[str, Path]:
    """Two data sets of one batch folder each (hard links, else copies): every file but Trade.txt, and Trade.txt
    alone."""
    shutil.rmtree(scratch, ignore_errors=True)
    parts = {"rest": scratch / "rest", TRADES_ONLY: scratch / "trades"}
    for source in sorted((data / f"Batch{batch}").iterdir()):
        part = parts[TRADES_ONLY if source.name == "Trade.txt" else "rest"] / f"Batch{batch}"
        part.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, part / source.name)
        except OSError:
            shutil.copyfile(source, part / source.name)
    return parts


def run_batch(ctx: JobContext, label: str, rows: list[dict]) -> None:
    collected = collect_job(ctx)
    for batch_id in collected.batch_ids:
        t0 = time.perf_counter()
        staged = stage_job(ctx, batch_id)
        t1 = time.perf_counter()
        report = transform.run(ctx, batch_id)
        report.seconds["compact"] = round(timed_compaction(ctx), 3)
        t2 = time.perf_counter()
        trades = 0
        trade_table = src.TRADE_CDC.staging if batch_id > 1 else src.TRADE.staging
        if ctx.lake.exists(trade_table):
            trades = ctx.lake.read(trade_table).where(f"batch_id = {batch_id}").count()
        rows.append(
            {
                "label": label,
                "batch": batch_id,
                "lines": staged["read"],
                "trades": trades,
                "stage": t1 - t0,
                "transform": t2 - t1,
                "steps": report.seconds,
            }
        )
        print(
            f"{label:<10} micro-batch {batch_id:>3}: {staged['read']:>10,} lines, {trades:>7,} trade lines; "
            f"stage {t1 - t0:6.2f}s, transform {t2 - t1:6.2f}s {report.seconds}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=3.0)
    parser.add_argument("--data", type=Path, default=None, help="data set directory (generated if empty)")
    parser.add_argument("--home", type=Path, default=None, help="scratch STREAMDI_HOME (default: temporary)")
    parser.add_argument("--drip", type=int, default=10, help="micro-batches for Batch3")
    parser.add_argument("--partitions", type=int, default=4, help="Spark shuffle partitions")
    parser.add_argument(
        "--trades-apart", action="store_true", help="Batch3 as its files but Trade.txt, then Trade.txt alone"
    )
    args = parser.parse_args()
    data = args.data or Path(tempfile.gettempdir()) / f"streamdi-bench-sf{args.sf:g}"
    if not (data / "Batch3" / "BatchDate.txt").exists():
        started = time.perf_counter()
        generate(Params(scale_factor=args.sf), data)
        print(f"generated SF {args.sf:g} into {data} in {time.perf_counter() - started:.1f}s")
    home = args.home or Path(tempfile.mkdtemp(prefix="streamdi-bench-home-"))
    shutil.rmtree(home, ignore_errors=True)
    settings = Settings(home=home, spark_shuffle_partitions=args.partitions)
    ctx = JobContext(settings)
    ctx.spark  # noqa: B018 - start the JVM before the clock
    rows: list[dict] = []
    for batch in (1, 2):
        deliver_batch(data, batch, settings.landing_dir)
        run_batch(ctx, f"Batch{batch}", rows)
    if args.trades_apart:
        for label, part in split_trades(data, 3, home / "bench-parts").items():
            deliver_batch(part, 3, settings.landing_dir)
            run_batch(ctx, label, rows)
    else:
        drip_batch(data, 3, settings.landing_dir, args.drip, lambda _g, _n: run_batch(ctx, "Batch3", rows))

    print("\nsummary (this machine):")
    for label, target in TARGETS.items():
        total = sum(r["stage"] + r["transform"] for r in rows if r["label"] == label)
        print(f"  {label} at SF {args.sf:g}: {total:6.1f}s (target {target:.0f}s, ratio {total / target:.2f})")
    for r in rows:
        if r["label"] == TRADES_ONLY:
            through = sum(r["steps"].get(step, 0.0) for step in ("T0", "T1", "T2", "T3"))
            print(
                f"  a micro-batch of {r['trades']:,} trade lines only: T0..T3 {through:.2f}s (target 2s, ratio "
                f"{through / 2:.2f}); stage + T0..DM {r['stage'] + r['transform']:.2f}s"
            )
    dripped = [r for r in rows if r["label"] == "Batch3"]
    if dripped:
        per = [r["stage"] + r["transform"] for r in dripped]
        trades = [r["trades"] for r in dripped]
        print(
            f"  Batch3 as {len(dripped)} micro-batches: median {sorted(per)[len(per) // 2]:.2f}s per micro-batch "
            f"(stage + T0..DM), {sum(trades) / len(trades):.0f} trade lines on average (target: 1,000 trades < 2s)"
        )


if __name__ == "__main__":
    main()
