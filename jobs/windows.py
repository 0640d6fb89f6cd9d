"""Live windows (step AG): the trade and market aggregates of `schemas.windows`, kept up to date per micro-batch.

The records (completed trades from DimTrade, daily market rows from FactMarketHistory) are already in the
warehouse when this step runs (after T3 and T4); what it keeps is their windowed aggregates, rolled up along the
hierarchies, in `warehouse.trade_windows` and `warehouse.market_windows`.

**What a micro-batch recomputes.** The step finds the span of event time it may have changed:
- the event times of the records its commits inserted, changed or deleted (the change feed of DimTrade or
  FactMarketHistory; a row whose before and after images carry the same record changes nothing);
- the days from which a hierarchy changed: a DimSecurity, DimCompany or DimAccount version whose parent (company,
  industry, customer, broker) differs before and after the micro-batch on some days (`routing_changes`); any
  Industry change counts for all time;
- the event times whose lateness a moved watermark may have changed (`watermark_moves`).
Every declared window that overlaps that span is recomputed whole from the records in its time -- tumbling and
sliding windows by their start, sessions that reach into the span (`session_span`) -- and compared with the
stored rows: new and changed rows are upserted, vanished ones deleted. In order, a micro-batch recomputes the
windows of its own hours and days; the cost follows the span, not the history.

**One set of slices for all windows.** Per source and level, the records of the span are cut into slices
(`slice_partials`: per node and slice the sums, extremes, first and last event time), the slices into aligned blocks
(`jobs.slicing.build_blocks`), and every sliding window of every declaration is combined from the blocks that cover
it; a tumbling window is its slices regrouped (no blocks: they would hold about one block per slice at every level
for sparse nodes such as customers by the hour); sessions fuse consecutive slices of a node whose records are less
than the gap apart. Adding a window adds its combinations, not another pass over the records (bench/windows.py). The
records are read and cut into slices a piece at a time (`PIECE_RECORDS`, `jobs.windows_slices.merged`): a first
load's year of records is never held whole, only its slices (SF 100: a year of market rows, ~25 M; their slices:
~110 industries and sectors a day).

**Where the parts are.** This module is the step: what a micro-batch recomputes, read from and committed to the
lake. The records it reads come from `jobs.windows_sources` (routed along the hierarchies by
`jobs.windows_routing`, which also finds the re-routed days); the window rows are combined from slices in
`jobs.windows_slices`; watermarks, lateness and the late-record Alerts are `jobs.windows_lateness`.

**Exactly once.** Commits (app transactions `AG/<table>`, `AG/dimessages/<source>`, `AG/window_watermarks`): per
source the window rows and the late-record alerts, then the watermarks of both sources in one commit, which are
state the next micro-batch reads and therefore go last: a rerun after a crash before them recomputes the same
spans from the same change feeds and watermarks.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.beside import run_beside
from jobs.messages import commit_alert_changes
from jobs.scope import BatchScope
from jobs.windows_lateness import ALERT_SOURCE, LATE, NO_TIME, late_alerts, late_mask, watermark_moves
from jobs.windows_routing import rerouted, rerouted_spans
from jobs.windows_slices import (
    ALIGN_US,
    US_PER_DAY,
    Sliced,
    merged,
    no_slices,
    results_of,
    session_span,
    slice_rows_of,
    sliced,
    us,
    window_span,
)
from jobs.windows_sources import SOURCES, Changes
from schemas import warehouse as wh
from schemas import windows as ws
from schemas.model import Table
from streamdi.context import JobContext

log = logging.getLogger(__name__)

STEP = "AG"
# records read and sliced at a time: a first load's read spans a year of records (SF 100: ~25 M market rows), whose
# slices at the windows' levels are far fewer
PIECE_RECORDS = 1_000_000


def read_latest(ctx: JobContext, source: str) -> dict[int, int]:
    rows = ctx.lake.read_if_exists(ws.WINDOW_WATERMARKS, ["source_batch", "latest"], pc.field("source") == source)
    batches = rows["source_batch"].to_pylist()
    latest = rows["latest"].cast(pa.int64()).to_pylist()
    return dict(zip(batches, latest, strict=True))


def update_latest(ctx: JobContext, src, before: dict[int, int], changes: Changes) -> dict[int, int]:
    """The latest event time per TPC-DI batch after the micro-batch: raised by its new records; read again for a
    batch whose latest record it changed or removed."""
    after = dict(before)
    for b in _distinct(changes.batches):  # masks, not copies: a first load's changes are every record (SF 100: 42 M)
        new = (changes.batch == b) & changes.after
        old = (changes.batch == b) & ~changes.after
        if b in before and ((changes.ts == before[b]) & old).any() and not ((changes.ts == before[b]) & new).any():
            latest = src.latest_of(ctx, b)
        else:
            newest = int(np.max(changes.ts, where=new, initial=NO_TIME)) if new.any() else None
            candidates = [t for t in (before.get(b), newest) if t is not None]
            latest = max(candidates) if candidates else src.latest_of(ctx, b)
        if latest is None:
            after.pop(b, None)
        else:
            after[b] = latest
    return after


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values of an int array, in order (hashed: no sort or Python list of every value)."""
    return sorted(pc.unique(pa.array(values)).to_pylist()) if len(values) else []


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the live windows this micro-batch touched, for every source with declared windows."""
    out: dict[str, int] = {}
    sources = [src for source, src in SOURCES.items() if ws.windows_of(source)]
    if not sources or scope.committed(ctx, STEP, ws.WINDOW_WATERMARKS):  # the watermarks commit comes last
        return out
    days = rerouted(ctx, scope)
    marks, deletes, ends, ended = [], [], [], []
    # the sources' windows beside each other (`jobs.beside`), taken in the sources' order
    done_by_source = run_beside(
        scope,
        [functools.partial(run_source, ctx, scope, src, days) for src in sources],
        beside=ctx.settings.steps_beside,
    )
    for src, done in zip(sources, done_by_source, strict=True):
        if done is not None:
            rows, latest, gone, before = done
            out |= rows
            marks.append(_marks(src.name, latest))
            deletes.append(_marks(src.name, dict.fromkeys(gone, 0)).select(list(ws.WINDOW_WATERMARKS.key)))
            if ws.slice_keep(src.name) and _latest(before) != _latest(latest):
                (ends if latest else ended).append(_ends(src.name, _latest(latest)))
    if marks:  # what the views over the slices judge a window's age by (schemas.windows); often no change
        ctx.lake.upsert(
            ws.WINDOW_LATEST,
            pa.concat_tables(ends) if ends else ws.WINDOW_LATEST.arrow_schema().empty_table(),
            app_id=scope.app_id(STEP, ws.WINDOW_LATEST),
            version=scope.batch_id,
            deletes=pa.concat_tables(ended).select(list(ws.WINDOW_LATEST.key)) if ended else None,
        )
    if marks:
        ctx.lake.upsert(
            ws.WINDOW_WATERMARKS,
            pa.concat_tables(marks),
            app_id=scope.app_id(STEP, ws.WINDOW_WATERMARKS),
            version=scope.batch_id,
            deletes=pa.concat_tables(deletes),
        )
    return out


def _latest(latest: Mapping[int, int]) -> int | None:
    """The latest event time of all of a source's records (late ones included), from its latest per batch."""
    return max(latest.values()) if latest else None


def _ends(source: str, latest: int | None) -> pa.Table:
    """The `warehouse.window_latest` row of one source."""
    return pa.table(
        {
            "source": pa.array([source], pa.large_string()),
            "latest": pa.array([latest or 0], pa.timestamp("us", tz="UTC")),
        }
    ).cast(ws.WINDOW_LATEST.arrow_schema())


def _marks(source: str, latest: dict[int, int]) -> pa.Table:
    """`staging.window_watermarks` rows of one source."""
    return pa.table(
        {
            "source": pa.array([source] * len(latest), pa.large_string()),
            "source_batch": pa.array(sorted(latest), pa.int32()),
            "latest": pa.array([latest[b] for b in sorted(latest)], pa.timestamp("us", tz="UTC")),
        }
    ).cast(ws.WINDOW_WATERMARKS.arrow_schema())


def run_source(
    ctx: JobContext, scope: BatchScope, src, rerouted_days: dict[str, list[tuple[int, int]]]
) -> tuple[dict[str, int], dict[int, int], list[int], dict[int, int]] | None:
    """One source's windows: what its changes, the re-routings and its moved watermarks touch (the module's doc).
    Commits the window rows, the slices and the Alerts; returns (rows written per table, the latest event time per
    TPC-DI batch after the micro-batch, batches that no longer have one, the latest per batch before it) for `run`
    to commit last, or None when the micro-batch touched nothing of the source."""
    source = src.name
    table = ws.WINDOW_TABLES[source]
    changes = src.changes(ctx, scope)
    if changes is None and not rerouted_spans(rerouted_days, source, np.iinfo(np.int64).max):
        return None
    changes = changes or Changes.none()
    grace = us(ws.GRACE[source])
    before = read_latest(ctx, source)
    latest = update_latest(ctx, src, before, changes)
    end_of_time = max([*latest.values(), int(changes.ts.max()) if len(changes.ts) else 0, 0]) + US_PER_DAY
    moves = watermark_moves(before, latest, grace)
    spans = [(int(changes.ts.min()), int(changes.ts.max()) + 1)] if len(changes.ts) else []
    spans += moves
    spans += rerouted_spans(rerouted_days, source, end_of_time)
    computed = compute(ctx, src, spans, moves, changes, latest, before)
    out: dict[str, int] = {}
    if computed is not None and not scope.committed(ctx, STEP, table):
        rows, gone = computed.rows, computed.gone
        ctx.lake.upsert(table, rows, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=gone)
        out[table.name] = out.get(table.name, 0) + rows.num_rows
    slices = ws.SLICE_TABLES[source]
    if computed is not None:  # committed like the window rows, empty when no window is answered when queried
        if not scope.committed(ctx, STEP, slices):
            ctx.lake.upsert(
                slices,
                computed.slices,
                app_id=scope.app_id(STEP, slices),
                version=scope.batch_id,
                deletes=computed.slices_gone,
            )
        out[slices.name] = computed.slices.num_rows
    if computed is not None and (computed.alerts.num_rows or _late_alerts_exist(ctx, source)):
        owners = pa.concat_arrays([computed.judged(), changes.ident.cast(pa.large_string())]).to_pylist()
        written = commit_alert_changes(
            ctx, scope, STEP, source, computed.alerts, source=ALERT_SOURCE[source], texts=(LATE,), owners=owners
        )
        if written:
            out[wh.DI_MESSAGES.name] = written
    log.info("AG micro-batch %s: %s windows: %s", scope.batch_id, source, out)
    return out, latest, sorted(set(before) - set(latest)), before


def _late_alerts_exist(ctx: JobContext, source: str) -> bool:
    """Whether DImessages holds a late-record Alert of `source` (without one, and none raised, there is nothing to
    clear)."""
    if not ctx.lake.exists(wh.DI_MESSAGES):
        return False
    cond = (pc.field("messagesource") == ALERT_SOURCE[source]) & (pc.field("messagetext") == LATE)
    return ctx.lake.read_where(wh.DI_MESSAGES, cond, ["messagekey"]).num_rows > 0


@dataclass(frozen=True)
class Computed:
    rows: pa.Table  # window rows to upsert
    gone: pa.Table  # keys of window rows to delete (recomputed away, or older than their window's horizon)
    alerts: pa.Table  # late-record alerts of the records judged
    judged: Callable[[], pa.Array]  # message keys of the records whose lateness was judged (made when needed)
    slices: pa.Table  # slices to upsert (the levels of the windows answered when queried)
    slices_gone: pa.Table  # keys of slices to delete


def _spread(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A mask over `mask`'s positions: `values` at the positions where `mask` is set, False elsewhere."""
    out = np.zeros(len(mask), dtype=bool)
    out[np.flatnonzero(mask)] = values
    return out


def horizon(window: ws.Window, latest: Mapping[int, int]) -> int:
    """The end of time before which `window`'s rows are not kept: its `keep` before the source's latest record."""
    return _horizon(us(window.keep), latest)


def _horizon(keep_us: int, latest: Mapping[int, int]) -> int:
    return _latest(latest) - keep_us if latest else NO_TIME


def _hull(spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    spans = [s for s in spans if s[0] < s[1]]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def compute(
    ctx: JobContext,
    src,
    spans: list[tuple[int, int]],
    moves: list[tuple[int, int]],
    changes: Changes,
    latest: dict[int, int],
    before: dict[int, int],
) -> Computed | None:
    """What the micro-batch commits (reads only): the rows of the windows that overlap `spans` and end after their
    horizon, the rows that fell behind a horizon that moved on (`before` -> `latest`), and the lateness of the
    records whose lateness may have changed: those the micro-batch changed, and those in the spans where a
    watermark moved (`moves`)."""
    source = src.name
    grace = us(ws.GRACE[source])
    table = ws.WINDOW_TABLES[source]
    windows = ws.stored_of(source)
    keeps = {level: us(k) for level, k in ws.slice_keep(source).items()}
    spans = list(spans)
    aged, aged_slices = [], []
    for w in windows:
        old, new = horizon(w, before), horizon(w, latest)
        if new < old:  # a latest record went away: rows behind the old horizon may come back
            spans.append((max(new, 0), old))
        elif new > old and ctx.lake.exists(table):
            cond = (pc.field("window_name") == w.name) & (pc.field("window_end") <= _stamp(new))
            aged.append(_stored(ctx, table, cond).select(list(table.key)))
    slice_table = ws.SLICE_TABLES[source]
    unit = us(ws.SLICE[source])
    for level, keep in keeps.items():  # a slice is kept while it ends after its level's horizon
        old, new = _horizon(keep, before), _horizon(keep, latest)
        if new < old:
            spans.append((max(new, 0), old))
        elif new > old and ctx.lake.exists(slice_table):
            cond = (pc.field("level") == level) & (pc.field("slice_start") <= _stamp(new - unit))
            aged_slices.append(_stored(ctx, slice_table, cond).select(list(slice_table.key)))
    span = _hull(spans)
    rows = table.arrow_schema().empty_table()
    gone = table.arrow_schema().empty_table().select(list(table.key))
    slices = slice_table.arrow_schema().empty_table()
    slices_gone = slices.select(list(slice_table.key))
    if span is not None:
        rows, gone, slices, slices_gone = _recompute(ctx, src, windows, span, latest, keeps)
    judged_span = _hull(moves)
    mine = changes.after
    ts, batch = (changes.ts, changes.batch) if mine.all() else (changes.ts[mine], changes.batch[mine])
    late = late_mask(ts, batch, latest, grace)
    stamps = pa.table({"ident": changes.counted(mine & _spread(mine, late)), "ts": ts[late], "batch": batch[late]})
    judged = [lambda: changes.counted(mine)]
    if judged_span is not None:  # the records whose batch's watermark moved
        more = src.stamps(ctx, judged_span)  # message keys made only of the late ones, and when the owners are asked
        more_late = late_mask(more.ts, more.batch, latest, grace)
        late_ones = pa.table({"ident": more.keys(more_late), "ts": more.ts[more_late], "batch": more.batch[more_late]})
        stamps = ao.first_of_groups(
            ao.sort(pa.concat_tables([stamps, late_ones.cast(stamps.schema)]), ["ident"]), ["ident"]
        )
        judged.append(more.keys)
    alerts = late_alerts(source, stamps, latest)
    if not aged and not aged_slices and span is None and not len(ts) and judged_span is None:
        return None
    gone = pa.concat_tables([gone, *aged]) if aged else gone
    slices_gone = pa.concat_tables([slices_gone, *aged_slices]) if aged_slices else slices_gone
    return Computed(
        rows,
        gone,
        alerts,
        lambda: pa.concat_arrays([j().cast(pa.large_string()) for j in judged]),
        slices,
        slices_gone,
    )


def _recompute(
    ctx: JobContext,
    src,
    windows: tuple[ws.Window, ...],
    span: tuple[int, int],
    latest: dict[int, int],
    keeps: Mapping[str, int],
):
    """(rows to upsert, keys to delete) of the stored `windows` that overlap `span` and end after their
    horizon, then the same of the slices of the levels of `keeps` that `span` touches. Sessions may chain back past
    their horizon: the read starts a day before it and goes further back while a kept session begins within its
    gap of the read's start."""
    source = src.name
    table = ws.WINDOW_TABLES[source]
    slice_table = ws.SLICE_TABLES[source]
    unit = us(ws.SLICE[source])
    conds: list[tuple[ws.Window, pc.Expression, tuple[int, int] | None]] = []
    for w in windows:
        h = horizon(w, latest)
        after = pc.field("window_end") > _stamp(h) if h != NO_TIME else pc.scalar(True)
        if w.kind == ws.SESSION:
            gap = us(w.size)
            cond = (
                (pc.field("window_name") == w.name)
                & (pc.field("window_start") < _stamp(span[1] + gap))
                & (pc.field("window_end") >= _stamp(span[0]))
                & after
            )
            conds.append((w, cond, None))
        else:
            first, last = window_span(w, *span)
            if h != NO_TIME:  # the first window that ends after the horizon
                first = max(first, int((h - ALIGN_US - w.size_slices * unit) // (w.slide_slices * unit)) + 1)
            if first > last:
                continue
            lo = ALIGN_US + first * w.slide_slices * unit
            hi = ALIGN_US + (last * w.slide_slices + w.size_slices) * unit
            cond = (
                (pc.field("window_name") == w.name)
                & (pc.field("window_start") >= _stamp(lo))
                & (pc.field("window_start") < _stamp(hi))
            )
            conds.append((w, cond, (lo, hi)))
    # the stored rows of every window in one scan, then each window's own
    every = _stored(ctx, table, functools.reduce(operator.or_, [c for _, c, _ in conds])) if conds else None
    needs, stored = [], []
    sessions: list[tuple[ws.Window, int]] = []  # (window, earliest instant its sessions may need)
    for w, cond, need in conds:
        rows = every.filter(cond)
        if need is None:
            h, gap = horizon(w, latest), us(w.size)
            lo, hi = session_span(rows, span, gap)
            sessions.append((w, lo))
            need = (max(lo, h - gap - US_PER_DAY) if h != NO_TIME else lo, hi)
        needs.append(need)
        stored.append(rows)
    stored_slices = slice_table.arrow_schema().empty_table()
    if keeps:  # whole slices: the span's first to its last, from the first a level keeps (Batch1: not five years)
        first = span[0] if not latest else max(span[0], _latest(latest) - max(keeps.values()) - unit)
        lo = ALIGN_US + (min(first, span[1] - 1) - ALIGN_US) // unit * unit
        hi = ALIGN_US + ((span[1] - 1 - ALIGN_US) // unit + 1) * unit
        needs.append((lo, hi))
        cond = (
            pc.field("level").isin(sorted(keeps))
            & (pc.field("slice_start") >= _stamp(lo))
            & (pc.field("slice_start") < _stamp(hi))
        )
        stored_slices = _stored(ctx, slice_table, cond)
    if not needs:
        empty = table.arrow_schema().empty_table()
        none = slice_table.arrow_schema().empty_table()
        return empty, empty.select(list(table.key)), none, none.select(list(slice_table.key))
    read = (min(n[0] for n in needs), max(n[1] for n in needs))
    earliest = min([read[0], *(lo for _, lo in sessions)])
    levels = {lv for w in windows for lv in w.levels} | set(keeps)
    while True:
        slices_of = _sliced_read(ctx, src, read, latest, levels)
        new = kept(results_of(source, slices_of, windows, span, table, keep=keeps), windows, latest)
        starts = new["window_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        cut = any(  # a session starting within its gap of the read's start may reach further back
            read[0] > lo and (_named(new, w.name) & (starts < read[0] + us(w.size))).any() for w, lo in sessions
        )
        if not cut:
            break
        read = (max(earliest, read[0] - 2 * (read[1] - read[0])), read[1])
    rows, gone = ao.changes_against(new, pa.concat_tables([table.arrow_schema().empty_table(), *stored]), table.key)
    if not keeps:
        return rows, gone, stored_slices, stored_slices.select(list(slice_table.key))
    new_slices = slice_rows_of(source, slices_of, keeps, span, _latest(latest), slice_table)
    return rows, gone, *ao.changes_against(new_slices, stored_slices, slice_table.key)


def _sliced_read(ctx: JobContext, src, read: tuple[int, int], latest: Mapping[int, int], levels: set[str]) -> Sliced:
    """The slices at `levels` of the on-time records of the span `read`, read and sliced a piece at a time (a first
    load: a year of records); nothing of the pieces is held once they are merged."""
    parts = []
    for records in src.read_pieces(ctx, read, PIECE_RECORDS):
        late = late_mask(records.ts, records.batch, latest, us(ws.GRACE[src.name]))
        on_time = records.filter(~late) if late.any() else records  # (no copy of a read without late records)
        parts.append(sliced(src.name, on_time, levels))
    return merged(parts) if parts else no_slices(src.name, levels)


def kept(rows: pa.Table, windows: tuple[ws.Window, ...], latest: Mapping[int, int]) -> pa.Table:
    """The rows of windows that end after their window's horizon."""
    if not latest or rows.num_rows == 0:
        return rows
    limit = np.full(rows.num_rows, np.iinfo(np.int64).max)
    for w in windows:
        limit[_named(rows, w.name)] = horizon(w, latest)
    keep = np.asarray(rows["window_end"].cast(pa.int64()).to_numpy(zero_copy_only=False) > limit)
    return rows if keep.all() else rows.filter(pa.array(keep))  # (no copy when every row is kept: a first load)


def _named(rows: pa.Table, name: str) -> np.ndarray:
    """Which of `rows` are of the window `name` (a first load's window rows are millions: no Python list)."""
    return np.asarray(pc.equal(rows["window_name"], name), dtype=bool)


def _stamp(ts_us: int) -> pa.Scalar:
    return pa.scalar(int(ts_us), pa.timestamp("us", tz="UTC"))


def _stored(ctx: JobContext, table: Table, cond: pc.Expression) -> pa.Table:
    return ctx.lake.read_if_exists(table, condition=cond).cast(table.arrow_schema())
