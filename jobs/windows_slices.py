"""Window rows from slices (step AG, `jobs.windows`): the aggregates of every declared window, combined from one
set of slices per source and level.

Where it sits: the sources (`jobs.windows_sources`) read a span of records from the lake and route them along
the hierarchies into `Records`; this module turns them into the rows of `warehouse.trade_windows` or
`warehouse.market_windows` (`results`), which the step (`jobs.windows`) compares with the stored rows. Pure: no
lake, no clock.

Per source and level, the records are cut into slices (`slice_partials`: per node and slice the sums, extremes,
first and last event time), the slices into aligned blocks (`jobs.slicing.build_blocks`, the shared slicing
mechanism), and every sliding window of every declaration is combined from the blocks that cover it
(`window_rows`); a tumbling window is its slices regrouped (`tumbling_rows`); sessions fuse consecutive slices of a
node whose records are less than the gap apart (`session_rows`). Adding a window adds its combinations, not another
pass over the records (bench/windows.py). Slices of several sets of records combine into the slices of all (`merged`),
so a long read is sliced a piece at a time (`sliced`), and the windows are answered from the slices (`results_of`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs import slicing
from schemas import windows as ws
from schemas.model import Table

US_PER_DAY = 86_400_000_000
ALIGN_US = (ws.ALIGN - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)

# measure -> operator, per source; `first` and `last` (event times) serve sessions
MEASURES = ws.MEASURES
TIMES = {"first": "min", "last": "max"}
MONEY = {"value": 18, "commission": 18, "fee": 18, "high": 8, "low": 8}  # cents -> decimal(precision, 2)


def us(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


@dataclass
class Records:
    """One source's records: event time (µs since 1970, UTC), TPC-DI batch, message key, node per level (NULL where
    a level does not resolve) and measures (int64; money in cents)."""

    ts: np.ndarray
    batch: np.ndarray
    ident: pa.Array | None  # None where no one asks (the step's reads: late records are judged from the change feed)
    nodes: dict[str, pa.Array]
    measures: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.ts)

    def filter(self, keep: np.ndarray) -> Records:
        mask = pa.array(keep, pa.bool_())
        return Records(
            self.ts[keep],
            self.batch[keep],
            None if self.ident is None else self.ident.filter(mask),
            {k: v.filter(mask) for k, v in self.nodes.items()},
            {k: v[keep] for k, v in self.measures.items()},
        )


def slice_index(ts: np.ndarray, unit_us: int) -> np.ndarray:
    return np.floor_divide(np.asarray(ts, np.int64) - ALIGN_US, unit_us)


def slice_partials(
    records: Records, level: str, unit_us: int, ops: Mapping[str, str]
) -> tuple[pa.Array, slicing.Partials]:
    """The slices of one level: (its nodes, sorted; partials keyed by (node index, slice))."""
    nodes = records.nodes[level]
    has = np.asarray(pc.is_valid(nodes), dtype=bool) if len(nodes) else np.zeros(0, dtype=bool)
    nodes = nodes.filter(pa.array(has, pa.bool_()))
    distinct = pc.unique(nodes) if len(nodes) else nodes
    distinct = distinct.take(pc.sort_indices(distinct)) if len(distinct) else distinct
    codes = pc.index_in(nodes, value_set=distinct).to_numpy(zero_copy_only=False).astype(np.int64)
    ts = records.ts[has]
    values = {n: records.measures[n][has] for n in ops if n not in TIMES}
    values |= {"first": ts, "last": ts}
    keys = slicing.block_keys(codes, 0, slice_index(ts, unit_us))
    return distinct, slicing.Partials.of(keys, values, ops)


def window_span(window: ws.Window, lo_us: int, hi_us: int) -> tuple[int, int]:
    """(first, last) window number of the tumbling or sliding `window` whose windows overlap [lo_us, hi_us)."""
    unit = us(ws.SLICE[window.source])
    first_slice, last_slice = slice_index(np.array([lo_us]), unit)[0], slice_index(np.array([hi_us - 1]), unit)[0]
    size, slide = window.size_slices, window.slide_slices
    return int((first_slice - size) // slide + 1), int(last_slice // slide)


def window_rows(
    window: ws.Window, nodes: pa.Array, slices: slicing.Partials, tree: slicing.Partials, numbers: tuple[int, int]
) -> dict[str, np.ndarray | pa.Array]:
    """The windows numbered `numbers[0]..numbers[1]` of a tumbling or sliding `window` that hold a record of a node
    (window k covers the slices k * slide .. k * slide + size - 1), combined from `tree`, the level's slices and
    blocks (`slicing.build_blocks`, shared by every window of the level)."""
    size, slide = window.size_slices, window.slide_slices
    codes, _, s = slicing.key_parts(slices.keys)  # sorted by node, then slice
    first = np.maximum(np.floor_divide(s - size, slide) + 1, numbers[0])  # the windows that hold each slice
    last = np.minimum(np.floor_divide(s, slide), numbers[1])
    has = first <= last
    codes, first, last = codes[has], first[has], last[has]
    # a node's slices hold overlapping runs of windows: merge them, then list each run's windows once
    run = np.r_[True, (codes[1:] != codes[:-1]) | (first[1:] > last[:-1] + 1)] if len(codes) else codes > 0
    starts = np.flatnonzero(run)
    ends = np.r_[starts[1:], len(codes)][: len(starts)] - 1
    lo_k, hi_k, run_codes = first[starts], last[ends], codes[starts]
    counts = hi_k - lo_k + 1
    c = np.repeat(run_codes, counts)
    k = np.repeat(lo_k, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    lo = k * slide
    values = slicing.combine(c, lo, lo + size, tree, slicing.levels_for(size))
    unit = us(ws.SLICE[window.source])
    return {
        "node": nodes.take(pa.array(c, pa.int64())),
        "window_start": ALIGN_US + lo * unit,
        "window_end": ALIGN_US + (lo + size) * unit,
        **values,
    }


def tumbling_rows(
    window: ws.Window, nodes: pa.Array, slices: slicing.Partials, numbers: tuple[int, int]
) -> dict[str, np.ndarray | pa.Array]:
    """`window_rows` of a tumbling `window`, whose windows do not overlap: each slice belongs to one window, so the
    windows are the slices regrouped, without blocks (a level of sparse nodes, such as customers by the hour, has
    about one block per slice at every level of blocks: SF 30's year of trades, ~2 GiB of blocks for weeks)."""
    size = window.size_slices
    codes, _, s = slicing.key_parts(slices.keys)
    k = np.floor_divide(s, size)
    has = (k >= numbers[0]) & (k <= numbers[1])
    values = {n: v[has] for n, v in slices.values.items()}
    windows = slicing.Partials.of(slicing.block_keys(codes[has], 0, k[has]), values, slices.ops)
    c, _, k = slicing.key_parts(windows.keys)
    unit = us(ws.SLICE[window.source])
    return {
        "node": nodes.take(pa.array(c, pa.int64())),
        "window_start": ALIGN_US + k * size * unit,
        "window_end": ALIGN_US + (k + 1) * size * unit,
        **windows.values,
    }


def session_rows(window: ws.Window, nodes: pa.Array, slices: slicing.Partials) -> dict[str, np.ndarray | pa.Array]:
    """The sessions of every node: its slices fused while the next slice's first record is less than the gap
    after the previous slice's last (a gap of at least one slice keeps each slice within one session)."""
    gap = us(window.size)
    codes, _, _ = slicing.key_parts(slices.keys)
    first, last = slices.values["first"], slices.values["last"]
    if len(codes) == 0:
        return {
            "node": nodes.take(pa.array([], pa.int64())),
            "window_start": first,
            "window_end": last,
            **slices.values,
        }
    new = np.r_[True, (codes[1:] != codes[:-1]) | (first[1:] - last[:-1] >= gap)]
    starts = np.flatnonzero(new)
    values = {n: slicing.reduce_runs(op, slices.values[n], starts) for n, op in slices.ops.items()}
    return {
        "node": nodes.take(pa.array(codes[starts], pa.int64())),
        "window_start": values["first"],
        "window_end": values["last"] + gap,
        **values,
    }


Sliced = dict[str, tuple[pa.Array, slicing.Partials]]  # level -> (its nodes, sorted; its slices' partials)


def sliced(source: str, records: Records, levels: Iterable[str]) -> Sliced:
    """The slices of `records` at each of `levels` (`slice_partials`, with the sessions' first and last times)."""
    unit, ops = us(ws.SLICE[source]), MEASURES[source] | TIMES
    return {level: slice_partials(records, level, unit, ops) for level in sorted(set(levels))}


def no_slices(source: str, levels: Iterable[str]) -> Sliced:
    """`sliced` of no records."""
    ops = MEASURES[source] | TIMES
    none = slicing.Partials.of(np.array([], np.int64), {n: np.array([], np.int64) for n in ops}, ops)
    return {level: (pa.array([], pa.large_string()), none) for level in sorted(set(levels))}


def merged(parts: list[Sliced]) -> Sliced:
    """The slices of the records of every part together (pieces of one read, no record in two): each level's nodes
    united and the partials of a slice in several parts combined -- sums, extremes and times are associative, so a
    read taken a piece at a time gives the slices of the whole read. Combined once, at the end, a level at a time;
    **consumes** `parts` (each level is taken out of them as it is combined: SF 100's year of trades has about a
    slice per trade at the account and customer levels, so the parts and the whole are not held together). At least
    one part (`no_slices` stands for none)."""
    if len(parts) == 1:
        return dict(parts.pop())
    out: Sliced = {}
    for level in list(parts[0]):
        of_level = [p.pop(level) for p in parts]
        ops = of_level[0][1].ops
        nodes = pc.unique(pa.concat_arrays([part_nodes for part_nodes, _ in of_level]))
        nodes = nodes.take(pc.sort_indices(nodes))
        keys = []
        for part_nodes, part in of_level:
            codes, _, s = slicing.key_parts(part.keys)
            recode = pc.index_in(part_nodes, value_set=nodes).to_numpy(zero_copy_only=False).astype(np.int64)
            keys.append(slicing.block_keys(recode[codes], 0, s))
        values = {n: np.concatenate([part.values.pop(n) for _, part in of_level]) for n in ops}
        del of_level
        out[level] = (nodes, slicing.Partials.of(np.concatenate(keys), values, ops))
    parts.clear()
    return out


def results(
    source: str, records: Records, windows: tuple[ws.Window, ...], span: tuple[int, int], table: Table
) -> pa.Table:
    """The rows of every declared window of `source` that the span [lo, hi) of event time touches (sessions: that
    reach into it), from `records` (every on-time record those windows hold)."""
    return results_of(source, sliced(source, records, [lv for w in windows for lv in w.levels]), windows, span, table)


def results_of(
    source: str,
    slices_of: Sliced,
    windows: tuple[ws.Window, ...],
    span: tuple[int, int],
    table: Table,
    *,
    keep: Iterable[str] | None = None,
) -> pa.Table:
    """`results` from the records' slices (`sliced`, at least at the windows' levels). With `keep` (levels), the
    slices of every other level are taken out of `slices_of` once their windows are built (a first load's account
    and customer levels hold about a slice per trade: SF 100's year, ~1 GiB)."""
    kept = None if keep is None else set(keep)
    by_window: dict[str, list[pa.Table]] = {}
    for level in sorted({lv for w in windows for lv in w.levels}):
        for name, rows in _level_results(level, *slices_of[level], windows, span, table):
            by_window.setdefault(name, []).append(rows)
        if kept is not None and level not in kept:
            del slices_of[level]
    if not by_window:
        return table.arrow_schema().empty_table()
    # in the table's order, whose first column is the window: each window's rows sorted on their own (a sorted copy
    # of one window at a time, not of all)
    assert table.order_by[0] == "window_name", table.order_by
    return pa.concat_tables(
        [ao.sort(pa.concat_tables(by_window.pop(name)), list(table.order_by)) for name in sorted(by_window)]
    )


def _level_results(
    level: str,
    nodes: pa.Array,
    slices: slicing.Partials,
    windows: tuple[ws.Window, ...],
    span: tuple[int, int],
    table: Table,
) -> list[tuple[str, pa.Table]]:
    """(window name, its rows) of every window at `level`, from the level's slices."""
    sizes = [w.size_slices for w in windows if level in w.levels and w.kind == ws.SLIDING]
    tree = slicing.build_blocks(slices, slicing.levels_for(max(sizes))) if sizes else slices
    out = []
    for w in windows:
        if level not in w.levels:
            continue
        if w.kind == ws.SESSION:
            rows = session_rows(w, nodes, slices)
            ends = rows["window_end"] - us(w.size)
            keep = (rows["window_start"] < span[1] + us(w.size)) & (ends >= span[0] - us(w.size))
        else:
            if w.kind == ws.TUMBLING:
                rows = tumbling_rows(w, nodes, slices, window_span(w, *span))
            else:
                rows = window_rows(w, nodes, slices, tree, window_span(w, *span))
            keep = np.ones(len(rows["window_start"]), dtype=bool)
        out.append((w.name, window_table(w.name, level, rows, keep, table)))
    return out


def window_table(name: str, level: str, rows: Mapping, keep: np.ndarray, table: Table) -> pa.Table:
    """The rows of window `name` at `level` that `keep` selects (from `window_rows` or `session_rows`), in the
    schema of `table`."""
    n = int(keep.sum())
    mask = pa.array(keep, pa.bool_())
    cols: dict[str, pa.Array] = {
        "window_name": pa.array([name] * n, pa.large_string()),
        "level": pa.array([level] * n, pa.large_string()),
        "node": rows["node"].filter(mask).cast(pa.large_string()),
        "window_start": pa.array(rows["window_start"][keep], pa.timestamp("us", tz="UTC")),
        "window_end": pa.array(rows["window_end"][keep], pa.timestamp("us", tz="UTC")),
    }
    cols |= measure_columns(rows, keep, table.column_names[5:])
    return pa.table(cols).cast(table.arrow_schema())


def measure_columns(values: Mapping[str, np.ndarray], keep: np.ndarray, names: list[str]) -> dict[str, pa.Array]:
    """The measures `names` of `values` (int64; money in cents) where `keep` holds, as Arrow columns (money as
    decimals)."""
    return {
        c: ao.decimals(values[c][keep], MONEY[c], 2) if c in MONEY else pa.array(values[c][keep], pa.int64())
        for c in names
    }


def session_span(stored: pa.Table, span: tuple[int, int], gap_us: int) -> tuple[int, int]:
    """The span of event time to read to recompute the sessions that reach into `span`: `span` widened by the gap,
    and by the stored sessions that reach into that (a session is a chain of records less than the gap apart, so
    no chain outside these can join one inside)."""
    lo, hi = span[0] - gap_us, span[1] + gap_us
    if stored.num_rows:
        start = stored["window_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        end = stored["window_end"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        lo, hi = min(lo, int(start.min())), max(hi, int(end.max()))
    return lo, hi


def slice_rows(
    source: str, records: Records, keeps: Mapping[str, int], span: tuple[int, int], latest: int | None, table: Table
) -> pa.Table:
    """The rows of `table` (the source's slice table) for the levels of `keeps`: per level, node and slice the
    partial aggregate of `records` (on-time records covering every slice that [lo, hi) of event time touches),
    for the slices `span` touches that end after `latest - keeps[level]` (`latest`: the source's latest record)."""
    if latest is not None and keeps:  # only the records of slices that can be kept (Batch1: days of five years)
        records = records.filter(records.ts >= latest - max(keeps.values()) - us(ws.SLICE[source]))
    return slice_rows_of(source, sliced(source, records, keeps), keeps, span, latest, table)


def slice_rows_of(
    source: str, slices_of: Sliced, keeps: Mapping[str, int], span: tuple[int, int], latest: int | None, table: Table
) -> pa.Table:
    """`slice_rows` from the records' slices (`sliced`, at least at the levels of `keeps`): a slice that ends after
    `latest - keeps[level]` holds no record from before it, so the slices need not be cut to that time first."""
    unit = us(ws.SLICE[source])
    first, last = (int(i) for i in slice_index(np.array([span[0], span[1] - 1]), unit))
    parts = []
    for level in sorted(keeps):
        nodes, slices = slices_of[level]
        codes, _, s = slicing.key_parts(slices.keys)
        start = ALIGN_US + s * unit
        keep = (s >= first) & (s <= last)
        if latest is not None:
            keep &= start + unit > latest - keeps[level]
        mask = pa.array(keep, pa.bool_())
        n = int(keep.sum())
        cols: dict[str, pa.Array] = {
            "level": pa.array([level] * n, pa.large_string()),
            "node": nodes.take(pa.array(codes, pa.int64())).filter(mask).cast(pa.large_string()),
            "slice_start": pa.array(start[keep], pa.timestamp("us", tz="UTC")),
        }
        cols |= measure_columns(slices.values, keep, table.column_names[3:])
        parts.append(pa.table(cols).cast(table.arrow_schema()))
    if not parts:
        return table.arrow_schema().empty_table()
    out = pa.concat_tables(parts)
    return ao.sort(out, list(table.key)) if out.num_rows else out
