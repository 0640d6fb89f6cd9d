"""Validation overhead of the staging suites, per micro-batch of a loaded lake (a benchmark, not a test).

Reads every staging table that has a suite from a lake that `bench/load.py` (or `streamdi load`) filled, and
for every micro-batch in it times `Validator.validate` on that micro-batch's rows of each table: the work the
stage step adds to the batch. Each micro-batch is validated twice; the second (warm) time is the one reported,
next to the number of trade rows it carries and, when `--load-seconds` gives the measured load time of the
first micro-batch (Batch1), the share of it.

    .venv/bin/python bench/quality.py --lake /tmp/bench-home/lake [--load-seconds 121]

Targets (issue 5): under 1 s warm for a 1,000-trade micro-batch, under 15% of the load time for Batch1 at SF 3.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas import sources as src  # noqa: E402
from streamdi import quality  # noqa: E402
from streamdi.lake import Lake  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, required=True, help="lake root of a loaded STREAMDI_HOME")
    parser.add_argument("--load-seconds", type=float, help="measured load time of the first micro-batch")
    args = parser.parse_args()

    started = time.perf_counter()
    validator = quality.validator()
    print(f"suites loaded, Great Expectations ready in {time.perf_counter() - started:.1f} s (once per process)")
    lake = Lake(args.lake)
    tables = {
        name: lake.read_arrow(suite.table) for name, suite in validator.suites.items() if lake.exists(suite.table)
    }
    batches = sorted({b for rows in tables.values() for b in rows["batch_id"].unique().to_pylist()})
    trade_tables = {src.TRADE.staging.qualified_name, src.TRADE_CDC.staging.qualified_name}
    print(f"{'micro-batch':>11} {'rows':>10} {'trades':>8} {'suites':>6} {'cold s':>7} {'warm s':>7}")
    for batch_id in batches:
        parts = {n: rows.filter(pc.equal(rows["batch_id"], batch_id)) for n, rows in tables.items()}
        parts = {n: p for n, p in parts.items() if p.num_rows}
        seconds = []
        for _ in range(2):
            t0 = time.perf_counter()
            for name, rows in parts.items():
                validator.validate(validator.suites[name], rows, batch_id)
            seconds.append(time.perf_counter() - t0)
        rows = sum(p.num_rows for p in parts.values())
        trades = sum(p.num_rows for n, p in parts.items() if n in trade_tables)
        line = f"{batch_id:>11} {rows:>10,} {trades:>8,} {len(parts):>6} {seconds[0]:>7.2f} {seconds[1]:>7.2f}"
        if batch_id == batches[0] and args.load_seconds:
            line += f"  ({seconds[1] / args.load_seconds:.1%} of {args.load_seconds:.0f} s)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
