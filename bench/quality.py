"""Validation overhead of the data-quality suites, per micro-batch of a loaded lake (a benchmark, not a test).

Reads a lake that `bench/load.py` (or `streamdi load`) filled, and for every micro-batch in it times:
- staging: `Validator.validate` on that micro-batch's rows of each staging table with a suite (the work the
  stage step adds);
- warehouse: for each table a transform step built, reading back what the micro-batch's commit wrote
  (`jobs.validate.written_rows`, the Delta change feed) and the keys its checks resolve against
  (`jobs.validate.key_values`; counted in "wh check s"), and validating it (the work each step adds, without the
  one small `quality.results` commit per step).
Each micro-batch is validated twice; the second (warm) time is the one reported, next to the number of trade
rows it carries and, when `--load-seconds` gives the measured load time of the first micro-batch (Batch1), the
share of it.

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

from jobs.validate import STEP_TABLES, key_values, written_rows  # noqa: E402
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
        name: lake.read_arrow(suite.table)
        for name, suite in validator.suites.items()
        if suite.table.layer == "staging" and lake.exists(suite.table)
    }
    batches = sorted({b for rows in tables.values() for b in rows["batch_id"].unique().to_pylist()})
    built = [
        (step, t, validator.suite_for(t))
        for step, ts in STEP_TABLES.items()
        for t in ts
        if validator.suite_for(t) and lake.exists(t)
    ]
    trade_tables = {src.TRADE.staging.qualified_name, src.TRADE_CDC.staging.qualified_name}
    print(
        f"{'micro-batch':>11} {'rows':>10} {'trades':>8} {'suites':>6} {'staging s':>9} "
        f"{'wh rows':>9} {'wh suites':>9} {'wh read s':>9} {'wh check s':>10} {'total s':>8}"
    )
    for batch_id in batches:
        parts = {n: rows.filter(pc.equal(rows["batch_id"], batch_id)) for n, rows in tables.items()}
        parts = {n: p for n, p in parts.items() if p.num_rows}
        for _ in range(2):  # the second (warm) round is printed
            t0 = time.perf_counter()
            for name, rows in parts.items():
                validator.validate(validator.suites[name], rows, batch_id)
            staging_s = time.perf_counter() - t0
            read_s = check_s = 0.0
            wh_rows = wh_suites = 0
            for step, table, suite in built:
                t0 = time.perf_counter()
                written = written_rows(lake, table, f"{step}/{table.name}", batch_id)
                read_s += time.perf_counter() - t0
                if written is None or written.num_rows == 0:
                    continue
                t0 = time.perf_counter()
                validator.validate(suite, written, batch_id, parameters=key_values(lake, suite, written))
                check_s += time.perf_counter() - t0
                wh_rows += written.num_rows
                wh_suites += 1
        rows = sum(p.num_rows for p in parts.values())
        trades = sum(p.num_rows for n, p in parts.items() if n in trade_tables)
        total = staging_s + read_s + check_s
        line = (
            f"{batch_id:>11} {rows:>10,} {trades:>8,} {len(parts):>6} {staging_s:>9.2f} "
            f"{wh_rows:>9,} {wh_suites:>9} {read_s:>9.2f} {check_s:>10.2f} {total:>8.2f}"
        )
        if batch_id == batches[0] and args.load_seconds:
            line += f"  ({total / args.load_seconds:.1%} of {args.load_seconds:.0f} s)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
