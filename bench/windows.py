"""Cost of the live windows per micro-batch as the number of concurrent windows grows: shared slices against
per-window buckets.

Usage: .venv/bin/python bench/windows.py --home DIR [--days 30] [--counts 1,4,16,64] [--repeat 3] [--dense 100000]
       [--commit]

DIR is a streamdi home with a loaded warehouse (e.g. `streamdi load --data <SF 3> --batch 1`). Its completed trades
are read and routed once (`jobs.windows_sources.TradeSource.read`, not timed); then every one of the last `--days`
days of trades is one micro-batch: the windows whose span touches that day are recomputed from the records they cover,
exactly as step AG does after its reads (warm, in this process, no I/O), for N concurrent sliding windows (slide
1 hour, sizes spread from 1 hour to 7 days, rolled up to industry and sector), two ways:
- **shared**: `jobs.windows_slices.results`: records cut into hourly slices once per level, blocks of slices built once,
  every window combined from the blocks that cover it (Scotty's stream slicing with an aggregate tree);
- **per window**: each window bucketed on its own, every record added to every window that contains it (the
  classic per-window buckets: a record of a 7-day window sliding by the hour lands in 168 buckets).
Both produce the same rows (checked). A third way is what the windows declared `stored=False` cost (schemas.windows):
- **queried**: the micro-batch only keeps the slices of its day (`jobs.windows_slices.slice_rows`, the rows of
  `trade_window_slices`), whatever the number of windows; the windows are combined from the stored slices when
  someone asks. Printed apart: the micro-batch's cost (`queried`) and the cost of answering all N windows of the
  day from the slices (`answer`, here in Python; PostgreSQL's views do the same in SQL), whose rows are checked
  against the other two ways.
With `--commit`, each micro-batch's output is also committed as AG commits it (a MERGE on the key into a Delta
table in a scratch lake, one table per workload, way and N): the stored windows' rows (`commit_stored_ms`) against
the slices (`commit_queried_ms`). Those are the costs a micro-batch of the stream pays for its windows.
TPC-DI's trades are sparse per node and hour (SF 3: ~200 completed trades a day over ~100 industries), so a
slice seldom holds more than one record; `--dense R` adds a second workload of R synthetic records per day (same
nodes, uniform times) where slices hold many records. Prints, per workload and N: output rows per micro-batch, the
median milliseconds per micro-batch of each way, their ratio, and records/s (the records the micro-batch's windows
cover, over the time; for `queried`, the day's records over its time).
Writes bench/out/windows.json. The end-to-end delay of an aggregate inside the stream service is the stream's
arrival -> visible latency (the window rows commit in the micro-batch's transform and migrate with it): see
bench/stream.py, whose step breakdown shows AG.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import numpy as np
import pyarrow as pa
import typer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs import arrow_ops as ao  # noqa: E402
from jobs import slicing  # noqa: E402
from jobs import windows_slices as win  # noqa: E402
from jobs.windows_sources import TradeSource  # noqa: E402
from schemas import windows as ws  # noqa: E402
from streamdi.context import JobContext  # noqa: E402
from streamdi.lake import Lake  # noqa: E402
from streamdi.scripts import script_app  # noqa: E402
from streamdi.settings import Settings  # noqa: E402

H = dt.timedelta(hours=1)
LEVELS = (ws.INDUSTRY, ws.SECTOR)


def declared(n: int) -> tuple[ws.Window, ...]:
    """N sliding windows, slide one hour, sizes spread geometrically from 1 hour to 168 hours."""
    sizes = sorted({max(1, round(168 ** (i / max(n - 1, 1)))) for i in range(n)})
    extra = [s for s in range(2, 169) if s not in sizes][: n - len(sizes)]
    return tuple(
        ws.Window(f"w{s}h", ws.TRADES, ws.SLIDING, s * H, LEVELS, slide=H) for s in sorted([*sizes, *extra])[:n]
    )


def per_window(records: win.Records, windows: tuple[ws.Window, ...], span: tuple[int, int]) -> pa.Table:
    """Every window bucketed on its own: each record goes into every window that contains it."""
    unit = win.us(ws.SLICE[ws.TRADES])
    ops = win.MEASURES[ws.TRADES] | win.TIMES
    parts = []
    for w in windows:
        numbers = win.window_span(w, *span)
        for level in w.levels:
            nodes = records.nodes[level]
            distinct = nodes.unique().sort()
            codes = np.asarray(pa.compute.index_in(nodes, value_set=distinct), dtype=np.int64)
            s = win.slice_index(records.ts, unit)
            first = np.maximum((s - w.size_slices) // w.slide_slices + 1, numbers[0])
            last = np.minimum(s // w.slide_slices, numbers[1])
            counts = np.maximum(last - first + 1, 0)
            row = np.repeat(np.arange(len(s)), counts)
            k = np.repeat(first, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
            key = (codes[row] << 32) | (k + (1 << 31))
            order = np.argsort(key, kind="stable")
            key, row = key[order], row[order]
            starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else key
            values = {"first": records.ts, "last": records.ts} | {
                m: records.measures[m] for m in win.MEASURES[ws.TRADES]
            }
            out = {n: slicing.reduce_runs(op, values[n][row], starts) for n, op in ops.items()} if len(key) else {}
            kk = (key[starts] & 0xFFFFFFFF) - (1 << 31) if len(key) else key
            rows = {
                "node": distinct.take(pa.array(key[starts] >> 32 if len(key) else key)),
                "window_start": win.ALIGN_US + kk * w.slide_slices * unit,
                "window_end": win.ALIGN_US + (kk * w.slide_slices + w.size_slices) * unit,
                **({n: v for n, v in out.items()} if len(key) else {n: key for n in ops}),
            }
            parts.append(win.window_table(w.name, level, rows, np.ones(len(kk), dtype=bool), ws.TRADE_WINDOWS))
    out = pa.concat_tables(parts)
    return out.sort_by([(c, "ascending") for c in ws.TRADE_WINDOWS.order_by])


def as_records(slices: pa.Table) -> win.Records:
    """Slice rows (`slice_rows`) as records at their slice's start: combining them gives the windows' rows."""
    n = slices.num_rows
    level = slices["level"].to_pylist()
    nodes = slices["node"]
    return win.Records(
        ts=slices["slice_start"].cast(pa.int64()).to_numpy(zero_copy_only=False),
        batch=np.zeros(n, np.int64),
        ident=pa.array([""] * n, pa.large_string()),
        nodes={
            lv: pa.array([v if lvl == lv else None for v, lvl in zip(nodes.to_pylist(), level, strict=True)])
            for lv in LEVELS
        },
        measures={
            m: ao.cents(slices[m]) if m in win.MONEY else slices[m].cast(pa.int64()).to_numpy(zero_copy_only=False)
            for m in win.MEASURES[ws.TRADES]
        },
    )


def dense_records(records: win.Records, per_day: int, days: list[int]) -> win.Records:
    """`per_day` records on each of `days` (and the week before, which their windows reach), at uniform times, each
    with the nodes of a random record of `records` (a fixed seed)."""
    rng = np.random.default_rng(11)
    first = (days[0] - 8) * win.US_PER_DAY
    n = per_day * (len(days) + 8)
    ts = np.sort(rng.integers(first, (days[-1] + 1) * win.US_PER_DAY, n))
    pick = pa.array(rng.integers(0, len(records), n))
    return win.Records(
        ts=ts,
        batch=np.full(n, 2, np.int64),
        ident=pa.array([f"T_ID={i}" for i in range(n)], pa.large_string()),
        nodes={lv: records.nodes[lv].take(pick) for lv in LEVELS},
        measures={m: v[np.asarray(pick)] for m, v in records.measures.items()},
    )


app = script_app()


@app.command(help=__doc__.split("\n")[0])
def main(
    home: Annotated[Path, typer.Option()],
    days: Annotated[int, typer.Option()] = 30,
    counts: Annotated[str, typer.Option()] = "1,4,16,64",
    repeat: Annotated[int, typer.Option()] = 3,
    dense: Annotated[int, typer.Option(help="also R synthetic records per day (0: not)")] = 0,
    commit: Annotated[bool, typer.Option(help="also time the commit of each micro-batch's rows (Delta MERGE)")] = False,
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them
    ctx = JobContext(Settings(home=args.home), lake=Lake(args.home / "lake"))
    started = time.perf_counter()
    records = TradeSource().read(ctx, (0, win.ALIGN_US + 60 * 365 * win.US_PER_DAY))
    print(f"{len(records):,} completed trades read and routed in {time.perf_counter() - started:.1f} s (not timed)")
    last_day = int(records.ts.max()) // win.US_PER_DAY
    days = [last_day - i for i in range(args.days)][::-1]
    report = []
    workloads = [("TPC-DI trades", records)]
    if args.dense:
        workloads.append((f"{args.dense:,} records a day", dense_records(records, args.dense, days)))
    for workload, data in workloads:
        print(f"-- {workload}: one day per micro-batch, the last {len(days)} days")
        for n in (int(c) for c in args.counts.split(",")):
            scratch = Lake(Path(tempfile.mkdtemp(prefix="windows-bench-"))) if args.commit else None
            line = measure(data, declared(n), days, args.repeat, scratch) | {"workload": workload, "windows": n}
            if scratch is not None:
                shutil.rmtree(scratch.root, ignore_errors=True)
            report.append(line)
            print(
                f"{n:3d} windows: {line['rows_per_micro_batch']:>8,.0f} rows, {line['records_covered']:>9,.0f} "
                f"records / micro-batch; shared {line['shared_ms']:8.2f} ms, per window {line['per_window_ms']:8.2f} "
                f"ms (x{line['ratio']}); records/s {line['shared_records_per_s']:,} vs "
                f"{line['per_window_records_per_s']:,}; queried {line['queried_ms']:6.2f} ms "
                f"({line['slice_rows_per_micro_batch']:,.0f} slice rows, {line['queried_records_per_s']:,} records/s), "
                f"answer {line['answer_ms']:8.2f} ms"
                + (
                    f"; commit stored {line['commit_stored_ms']:8.1f} ms, queried {line['commit_queried_ms']:6.1f} ms"
                    if args.commit
                    else ""
                )
            )
    out = REPO / "bench" / "out" / "windows.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps({"home": str(args.home), "days": args.days, "trades": len(records), "lines": report}, indent=1)
    )
    print(f"written {out}")


def measure(
    records: win.Records, windows: tuple[ws.Window, ...], days: list[int], repeat: int, scratch: Lake | None = None
) -> dict:
    """Median over `days` of the best of `repeat` runs of each way, for one micro-batch per day; with a `scratch`
    lake, also the commit of each micro-batch's stored windows and of its slices (once each, in day order)."""
    longest = max(w.size for w in windows)
    keeps = dict.fromkeys(LEVELS, win.us(longest))
    shared_ms, own_ms, queried_ms, answer_ms, rows, covered, slice_rows, today = [], [], [], [], [], [], [], []
    commits: dict[str, list[float]] = {"stored": [], "queried": []}
    for day in days:
        span = (day * win.US_PER_DAY, (day + 1) * win.US_PER_DAY)
        near = (span[0] - win.us(longest), span[1] + win.us(longest))
        mine = records.filter((records.ts >= near[0]) & (records.ts < near[1]))
        own_day = mine.filter((mine.ts >= span[0]) & (mine.ts < span[1]))
        stored = as_records(win.slice_rows(ws.TRADES, mine, keeps, near, None, ws.TRADE_WINDOW_SLICES))
        ways = {
            "shared": lambda m=mine, s=span: win.results(ws.TRADES, m, windows, s, ws.TRADE_WINDOWS),
            "own": lambda m=mine, s=span: per_window(m, windows, s),
            "queried": lambda m=own_day, s=span: win.slice_rows(ws.TRADES, m, keeps, s, None, ws.TRADE_WINDOW_SLICES),
            "answer": lambda m=stored, s=span: win.results(ws.TRADES, m, windows, s, ws.TRADE_WINDOWS),
        }
        timings = {}
        for name, fn in ways.items():
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                out = fn()
                best = min(best, time.perf_counter() - t0)
            timings[name] = (best, out)
        if not timings["shared"][1].equals(timings["own"][1]):
            raise SystemExit(f"the two ways differ on day {day} with {len(windows)} windows")
        if not timings["shared"][1].equals(timings["answer"][1]):
            raise SystemExit(f"the windows answered from the slices differ on day {day} with {len(windows)} windows")
        shared_ms.append(timings["shared"][0] * 1000)
        own_ms.append(timings["own"][0] * 1000)
        queried_ms.append(timings["queried"][0] * 1000)
        answer_ms.append(timings["answer"][0] * 1000)
        rows.append(timings["shared"][1].num_rows)
        slice_rows.append(timings["queried"][1].num_rows)
        covered.append(len(mine))
        today.append(len(own_day))
        if scratch is not None:
            for way, table in (("stored", ws.TRADE_WINDOWS), ("queried", ws.TRADE_WINDOW_SLICES)):
                out = timings["shared" if way == "stored" else "queried"][1]
                t0 = time.perf_counter()
                scratch.upsert(table, out, app_id=f"bench/{table.name}", version=day)
                commits[way].append((time.perf_counter() - t0) * 1000)
    line = {
        "rows_per_micro_batch": statistics.median(rows),
        "records_covered": statistics.median(covered),
        "shared_ms": round(statistics.median(shared_ms), 2),
        "per_window_ms": round(statistics.median(own_ms), 2),
        "queried_ms": round(statistics.median(queried_ms), 2),
        "answer_ms": round(statistics.median(answer_ms), 2),
        "slice_rows_per_micro_batch": statistics.median(slice_rows),
        "records_today": statistics.median(today),
    }
    line["queried_records_per_s"] = round(line["records_today"] / line["queried_ms"] * 1000)
    if scratch is not None:
        line["commit_stored_ms"] = round(statistics.median(commits["stored"]), 1)
        line["commit_queried_ms"] = round(statistics.median(commits["queried"]), 1)
    line["ratio"] = round(line["per_window_ms"] / line["shared_ms"], 2)
    line["shared_records_per_s"] = round(line["records_covered"] / line["shared_ms"] * 1000)
    line["per_window_records_per_s"] = round(line["records_covered"] / line["per_window_ms"] * 1000)
    return line


if __name__ == "__main__":
    app()
