"""Validation overhead of the data-quality suites, per micro-batch of a loaded lake (a benchmark, not a test).

Reads a lake that `bench/load.py` (or `streamdi load`) filled, and for every micro-batch in it times:
- staging: `Validator.validate` on that micro-batch's rows of each staging table with a suite (the work the
  stage step adds);
- warehouse: for each table a transform step built, reading back what the micro-batch's commit wrote
  (`jobs.validate.written_rows`, the Delta change feed) and the keys its checks resolve against
  (`jobs.validate.key_values`; counted in "wh check s"), and validating it (the work each step adds);
- record: the `quality.results` commits the dataflow makes for it (one for the staging suites, one per transform
  step), into a scratch lake.
Each micro-batch is validated twice; the second (warm) time is the one reported, next to the number of trade
rows it carries and, when `--load-seconds` gives the measured load time of the first micro-batch (Batch1), the
share of it. A last row validates every incremental micro-batch as one (their staged rows together, and per table
the last version of each row their commits wrote): the "1,000-trade micro-batch" of the target, out of a data set
whose micro-batches are smaller (SF 3: Batch2 and Batch3 together carry 1,030 trades).

    .venv/bin/python bench/quality.py --lake /tmp/bench-home/lake [--load-seconds 121]

Targets (issue 5): under 1 s warm for a 1,000-trade micro-batch, under 15% of the load time for Batch1 at SF 3.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import pyarrow as pa
import pyarrow.compute as pc
import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.validate import STEP_TABLES, key_values, written_rows  # noqa: E402
from schemas import sources as src  # noqa: E402
from schemas.quality import QUALITY_RESULTS  # noqa: E402
from streamdi import quality  # noqa: E402
from streamdi.lake import Lake  # noqa: E402
from streamdi.scripts import script_app  # noqa: E402

app = script_app()


@app.command(help=__doc__.splitlines()[0])
def main(
    lake: Annotated[Path, typer.Option(help="lake root of a loaded STREAMDI_HOME")],
    load_seconds: Annotated[float | None, typer.Option(help="measured load time of the first micro-batch")] = None,
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them

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
        f"{'wh rows':>9} {'wh suites':>9} {'wh read s':>9} {'wh check s':>10} {'record s':>8} {'total s':>8}"
    )
    scratch = Lake(Path(tempfile.mkdtemp(prefix="streamdi-bench-quality-")))
    for batch_id in batches:
        seconds = args.load_seconds if batch_id == 1 else None
        measure(validator, lake, scratch, tables, built, trade_tables, [batch_id], seconds)
    later = [b for b in batches if b > 1]
    if len(later) > 1:
        # every incremental micro-batch validated as ONE (as if they had arrived together): the "1,000-trade
        # micro-batch" of the target, out of data sets whose incremental micro-batches are smaller
        measure(validator, lake, scratch, tables, built, trade_tables, later, None)


def measure(validator, lake, scratch, tables, built, trade_tables, batch_ids, load_seconds) -> None:
    """Validate the rows of `batch_ids` as one micro-batch twice and print the second (warm) round. The results
    are recorded as the dataflow records them (one `quality.results` commit for the staging suites, one per
    transform step) into the scratch lake `scratch`."""
    wanted = pa.array(batch_ids, pa.int64())
    parts = {
        n: rows.filter(pc.is_in(rows["batch_id"], value_set=wanted.cast(rows["batch_id"].type)))
        for n, rows in tables.items()
    }
    parts = {n: p for n, p in parts.items() if p.num_rows}
    batch_id = batch_ids[-1]
    for _ in range(2):  # the second (warm) round is printed
        t0 = time.perf_counter()
        results = [
            validator.validate(validator.suites[n], rows, batch_id).result_rows(batch_id, 0)
            for n, rows in parts.items()
        ]
        staging_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        record(scratch, results)
        record_s = time.perf_counter() - t0
        read_s = check_s = 0.0
        wh_rows = wh_suites = 0
        by_step: dict[str, list] = {}
        for step, table, suite in built:
            t0 = time.perf_counter()
            written = [written_rows(lake, table, f"{step}/{table.name}", b) for b in batch_ids]
            written = [w for w in written if w is not None and w.num_rows]
            if len(written) > 1:  # a key written by several: its last version
                rows = pa.concat_tables(written)
                last = {k: i for i, k in enumerate(rows[table.key[0]].to_pylist())}
                written = [rows.take(sorted(last.values()))]
            read_s += time.perf_counter() - t0
            if not written:
                continue
            t0 = time.perf_counter()
            checked = validator.validate(suite, written[0], batch_id, parameters=key_values(lake, suite, written[0]))
            check_s += time.perf_counter() - t0
            by_step.setdefault(step, []).append(checked.result_rows(batch_id, 0))
            wh_rows += written[0].num_rows
            wh_suites += 1
        t0 = time.perf_counter()
        for step_results in by_step.values():
            record(scratch, step_results)
        record_s += time.perf_counter() - t0
    rows = sum(p.num_rows for p in parts.values())
    trades = sum(p.num_rows for n, p in parts.items() if n in trade_tables)
    total = staging_s + read_s + check_s + record_s
    label = str(batch_ids[0]) if len(batch_ids) == 1 else f"{batch_ids[0]}..{batch_ids[-1]} as one"
    line = (
        f"{label:>11} {rows:>10,} {trades:>8,} {len(parts):>6} {staging_s:>9.2f} "
        f"{wh_rows:>9,} {wh_suites:>9} {read_s:>9.2f} {check_s:>10.2f} {record_s:>8.2f} {total:>8.2f}"
    )
    if load_seconds:
        line += f"  ({total / load_seconds:.1%} of {load_seconds:.0f} s)"
    print(line, flush=True)


_commits = itertools.count(1)


def record(scratch: Lake, results: list) -> None:
    """One `quality.results` commit of `results` (result rows of several suites), as a step makes it."""
    if results:
        scratch.append(QUALITY_RESULTS, pa.concat_tables(results), app_id="bench", version=next(_commits))


if __name__ == "__main__":
    app()
