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
(`slice_partials`: per node and slice the sums, extremes, first and last event time), the slices into aligned
blocks (`jobs.slicing.build_blocks`), and every tumbling and sliding window of every declaration is combined from
the blocks that cover it; sessions fuse consecutive slices of a node whose records are less than the gap apart.
Adding a window adds its combinations, not another pass over the records (bench/windows.py).

**Exactly once.** Commits (app transactions `AG/<table>`, `AG/dimessages/<source>`, `AG/window_watermarks`): per
source the window rows and the late-record alerts, then the watermarks of both sources in one commit, which are
state the next micro-batch reads and therefore go last: a rerun after a crash before them recomputes the same
spans from the same change feeds and watermarks.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs import slicing
from jobs.messages import alert_rows, commit_alert_changes
from jobs.scope import BatchScope
from jobs.valid_at import take, valid_versions
from schemas import warehouse as wh
from schemas import windows as ws
from schemas.model import Table
from streamdi.context import JobContext

log = logging.getLogger(__name__)

STEP = "AG"
LATE = "Late record past grace"
ALERT_SOURCE = {ws.TRADES: "TradeWindows", ws.MARKET: "MarketWindows"}

US_PER_DAY = 86_400_000_000
ALIGN_US = (ws.ALIGN - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
NO_TIME = np.iinfo(np.int64).min  # the watermark before any record: nothing is late

# measure -> operator, per source; `first` and `last` (event times) serve sessions
MEASURES: dict[str, dict[str, str]] = {
    ws.TRADES: {"trades": "sum", "quantity": "sum", "value": "sum", "commission": "sum", "fee": "sum"},
    ws.MARKET: {"days": "sum", "volume": "sum", "high": "max", "low": "min"},
}
TIMES = {"first": "min", "last": "max"}
MONEY = {"value": 18, "commission": 18, "fee": 18, "high": 8, "low": 8}  # cents -> decimal(precision, 2)


def us(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


# ------------------------------------------------------------------------------------------------ records
@dataclass
class Records:
    """One source's records: event time (µs since 1970, UTC), TPC-DI batch, message key, node per level (NULL where
    a level does not resolve) and measures (int64; money in cents)."""

    ts: np.ndarray
    batch: np.ndarray
    ident: pa.Array
    nodes: dict[str, pa.Array]
    measures: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.ts)

    def filter(self, keep: np.ndarray) -> Records:
        mask = pa.array(keep, pa.bool_())
        return Records(
            self.ts[keep],
            self.batch[keep],
            self.ident.filter(mask),
            {k: v.filter(mask) for k, v in self.nodes.items()},
            {k: v[keep] for k, v in self.measures.items()},
        )


# ------------------------------------------------------------------------------------------------ lateness
def watermarks(latest: Mapping[int, int]) -> Callable[[np.ndarray], np.ndarray]:
    """The watermark of each TPC-DI batch: the latest event time of the batches before it (NO_TIME for none)."""
    batches = np.array(sorted(latest), np.int64)
    running = np.maximum.accumulate(np.array([latest[b] for b in batches], np.int64)) if len(batches) else batches

    def of(batch: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(batches, np.asarray(batch, np.int64), side="left") - 1  # batches strictly before
        return np.where(pos >= 0, running[np.maximum(pos, 0)] if len(running) else NO_TIME, NO_TIME)

    return of


def late_mask(ts: np.ndarray, batch: np.ndarray, latest: Mapping[int, int], grace_us: int) -> np.ndarray:
    """Whether each record is late: its event time is before its batch's watermark minus the grace."""
    mark = watermarks(latest)(batch)
    return (mark != NO_TIME) & (np.asarray(ts, np.int64) < mark - grace_us)


def watermark_moves(before: Mapping[int, int], after: Mapping[int, int], grace_us: int) -> list[tuple[int, int]]:
    """The spans of event time in which lateness may differ between the watermarks `before` and `after`: per batch
    of `after` whose watermark moved, from the lower to the higher of the two, minus the grace. A watermark that
    appears (NO_TIME before) opens the span from the start of time."""
    out = []
    batches = np.array(sorted(after), np.int64)
    old, new = watermarks(before)(batches), watermarks(after)(batches)
    for o, n in zip(old.tolist(), new.tolist(), strict=True):
        if o != n:
            lo = 0 if NO_TIME in (o, n) else min(o, n) - grace_us
            out.append((lo, max(o, n) - grace_us + 1))
    return out


# ------------------------------------------------------------------------------------------------ hierarchies
def routing_changes(before: list[tuple], after: list[tuple]) -> list[tuple[int, int]]:
    """The spans of days [start, end) on which a key's parent differs between two sets of its versions, each
    `(key, effective day, end day, parent)`: the changed rows of an SCD2 dimension before and after a micro-batch
    (a version closed by a new one is in both, with its old and its new end day). Days outside every version of a
    set have no parent there."""
    keys: dict = {}
    for side, rows in ((0, before), (1, after)):
        for key, start, end, parent in rows:
            keys.setdefault(key, ([], []))[side].append((start, end, parent))
    spans = []
    for sides in keys.values():
        bounds = sorted({d for versions in sides for s, e, _ in versions for d in (s, e)})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            parents = [next((p for s, e, p in versions if s <= lo < e), None) for versions in sides]
            if parents[0] != parents[1]:
                spans.append((lo, hi))
    return merge_spans(spans)


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


# ------------------------------------------------------------------------------------------------ slices
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


def results(
    source: str, records: Records, windows: tuple[ws.Window, ...], span: tuple[int, int], table: Table
) -> pa.Table:
    """The rows of every declared window of `source` that the span [lo, hi) of event time touches (sessions: that
    reach into it), from `records` (every on-time record those windows hold)."""
    unit = us(ws.SLICE[source])
    ops = MEASURES[source] | TIMES
    parts = []
    for level in sorted({lv for w in windows for lv in w.levels}):
        nodes, slices = slice_partials(records, level, unit, ops)
        sizes = [w.size_slices for w in windows if level in w.levels and w.kind != ws.SESSION]
        tree = slicing.build_blocks(slices, slicing.levels_for(max(sizes))) if sizes else slices
        for w in windows:
            if level not in w.levels:
                continue
            if w.kind == ws.SESSION:
                rows = session_rows(w, nodes, slices)
                ends = rows["window_end"] - us(w.size)
                keep = (rows["window_start"] < span[1] + us(w.size)) & (ends >= span[0] - us(w.size))
            else:
                rows = window_rows(w, nodes, slices, tree, window_span(w, *span))
                keep = np.ones(len(rows["window_start"]), dtype=bool)
            parts.append(_table(w.name, level, rows, keep, table))
    if not parts:
        return table.arrow_schema().empty_table()
    out = pa.concat_tables(parts)
    return ao.sort(out, list(table.order_by)) if out.num_rows else out


def _table(name: str, level: str, rows: Mapping, keep: np.ndarray, table: Table) -> pa.Table:
    n = int(keep.sum())
    mask = pa.array(keep, pa.bool_())
    cols: dict[str, pa.Array] = {
        "window_name": pa.array([name] * n, pa.large_string()),
        "level": pa.array([level] * n, pa.large_string()),
        "node": rows["node"].filter(mask).cast(pa.large_string()),
        "window_start": pa.array(rows["window_start"][keep], pa.timestamp("us", tz="UTC")),
        "window_end": pa.array(rows["window_end"][keep], pa.timestamp("us", tz="UTC")),
    }
    for c in table.column_names[5:]:
        v = rows[c][keep]
        cols[c] = ao.decimals(v, MONEY[c], 2) if c in MONEY else pa.array(v, pa.int64())
    return pa.table(cols).cast(table.arrow_schema())


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


# ------------------------------------------------------------------------------------------------ time
def date_id_days(ids: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of DimDate ids (yyyymmdd)."""
    ids = np.asarray(ids, np.int64)
    months = (ids // 10000 - 1970) * 12 + (ids // 100 % 100 - 1)
    return months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64) + ids % 100 - 1


def time_id_us(ids: np.ndarray) -> np.ndarray:
    """Microseconds since midnight of DimTime ids (hhmmss)."""
    ids = np.asarray(ids, np.int64)
    return ((ids // 10000) * 3600 + (ids // 100 % 100) * 60 + ids % 100) * 1_000_000


def _iso(ts_us: int) -> str:
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(ts_us))).isoformat(sep=" ")


# ------------------------------------------------------------------------------------------------ sources
@dataclass(frozen=True)
class Changes:
    """The records a micro-batch changed (before and after images that differ), as event times and batches; their
    message keys are made only when asked for (most micro-batches raise and clear no Alert)."""

    ts: np.ndarray  # event time of each changed record that counts (completed trades, market rows)
    batch: np.ndarray  # its TPC-DI batch
    after: np.ndarray  # True for an after image (the record now), False for a before image
    batches: np.ndarray  # TPC-DI batches of every changed record
    rows: pa.Table  # every changed record (counting or not)
    counting: np.ndarray  # which of `rows` count (ts, batch and after are theirs, in order)
    key_of: Callable[[pa.Table], pa.Array]  # message keys of rows

    @property
    def ident(self) -> pa.Array:
        """Message keys of every changed record."""
        return self.key_of(self.rows)

    def counted(self, which: np.ndarray) -> pa.Array:
        """Message keys of the counting records selected by `which` (parallel to ts)."""
        return self.key_of(self.rows.filter(pa.array(self.counting)).filter(pa.array(which)))

    @classmethod
    def none(cls) -> Changes:
        nothing = np.array([], np.int64)
        return cls(nothing, nothing, np.array([], bool), nothing, pa.table({}), np.array([], bool), _no_keys)


def _no_keys(rows: pa.Table) -> pa.Array:
    return pa.array([], pa.large_string())


def _net_changes(feed: pa.Table | None, columns: list[str]) -> pa.Table | None:
    """The rows of a change feed that are not cancelled by an equal row of the other side, with `_after` (a feed of
    inserts only, the usual case, is taken as it is)."""
    if feed is None or feed.num_rows == 0:
        return None
    after = pc.is_in(feed["_change_type"], value_set=pa.array(["insert", "update_postimage"]))
    if pc.all(after).as_py():
        return feed.select(columns).append_column("_after", after)
    signed = feed.select(columns).append_column("_sign", pc.if_else(after, 1, -1).cast(pa.int64()))
    net = signed.group_by(columns, use_threads=False).aggregate([("_sign", "sum")])
    net = net.filter(pc.not_equal(net["_sign_sum"], 0))
    if net.num_rows == 0:
        return None
    return net.append_column("_after", pc.greater(net["_sign_sum"], 0))


class TradeSource:
    """Completed trades (DimTrade) at their completion time."""

    name = ws.TRADES
    table = wh.DIM_TRADE
    _FEED = ["tradeid", "status", "sk_closedateid", "sk_closetimeid", "batchid", "quantity", "tradeprice"]
    _FEED += ["fee", "commission", "sk_securityid", "sk_accountid"]

    def changes(self, ctx: JobContext, scope: BatchScope) -> Changes | None:
        net = _net_changes(scope.changed(ctx, self.table, [*self._FEED, "_change_type"]), self._FEED)
        if net is None:
            return None
        counts = np.asarray(pc.equal(net["status"], "Completed").fill_null(False), dtype=bool)
        done = net.filter(pa.array(counts))
        return Changes(
            ts=self._ts(done),
            batch=ao.column(done, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            after=np.asarray(done["_after"], dtype=bool),
            batches=ao.column(net, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            rows=net,
            counting=counts,
            key_of=self._ident,
        )

    @staticmethod
    def _ts(rows: pa.Table) -> np.ndarray:
        day = date_id_days(ao.column(rows, "sk_closedateid").to_numpy(zero_copy_only=False))
        return day * US_PER_DAY + time_id_us(ao.column(rows, "sk_closetimeid").to_numpy(zero_copy_only=False))

    @staticmethod
    def _ident(rows: pa.Table) -> pa.Array:
        return _joined("T_ID=", rows["tradeid"])

    def _completed(self, ctx: JobContext, cond: pc.Expression, columns: list[str]) -> pa.Table:
        return ctx.lake.read_if_exists(self.table, columns, (pc.field("status") == "Completed") & cond)

    def stamps(self, ctx: JobContext, span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(event time, TPC-DI batch, message key) of the records in `span`, without routing them."""
        rows = self._completed(ctx, _date_range("sk_closedateid", span), _STAMP_COLUMNS)
        ts = self._ts(rows)
        keep = (ts >= span[0]) & (ts < span[1])
        rows = rows.filter(pa.array(keep))
        return ts[keep], ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64), self._ident(rows)

    def latest_of(self, ctx: JobContext, batch: int) -> int | None:
        rows = self._completed(ctx, pc.field("batchid") == batch, ["sk_closedateid", "sk_closetimeid"])
        return int(self._ts(rows).max()) if rows.num_rows else None

    def read(self, ctx: JobContext, span: tuple[int, int]) -> Records:
        columns = [*self._FEED, "sk_companyid", "sk_customerid", "sk_brokerid"]
        rows = self._completed(ctx, _date_range("sk_closedateid", span), columns)
        ts = self._ts(rows)
        keep = (ts >= span[0]) & (ts < span[1])
        order = pc.sort_indices(rows["tradeid"]).to_numpy()  # in trade order, the span's only
        order = order[keep[order]]
        rows, ts = rows.take(pa.array(order)), ts[order]
        day = np.floor_divide(ts, US_PER_DAY)
        symbol = _lookup(ctx, wh.DIM_SECURITY, "sk_securityid", rows["sk_securityid"], "symbol")
        nodes = route_securities(ctx, symbol, day, rows["sk_companyid"])
        account = _lookup(ctx, wh.DIM_ACCOUNT, "sk_accountid", rows["sk_accountid"], "accountid")
        nodes |= route_accounts(ctx, account, day, rows["sk_customerid"], rows["sk_brokerid"])
        quantity = ao.column(rows, "quantity").to_numpy(zero_copy_only=False).astype(np.int64)
        return Records(
            ts=ts,
            batch=ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            ident=self._ident(rows),
            nodes=nodes,
            measures={
                "trades": np.ones(rows.num_rows, np.int64),
                "quantity": quantity,
                "value": quantity * ao.cents(rows["tradeprice"]),
                "commission": ao.cents(rows["commission"]),
                "fee": ao.cents(rows["fee"]),
            },
        )


class MarketSource:
    """Daily market rows (FactMarketHistory) on their market date."""

    name = ws.MARKET
    table = wh.FACT_MARKET_HISTORY
    _FEED = ["symbol", "sk_dateid", "volume", "dayhigh", "daylow", "batchid"]

    def changes(self, ctx: JobContext, scope: BatchScope) -> Changes | None:
        net = _net_changes(scope.changed(ctx, self.table, [*self._FEED, "_change_type"]), self._FEED)
        if net is None:
            return None
        batches = ao.column(net, "batchid").to_numpy(zero_copy_only=False).astype(np.int64)
        every = np.ones(net.num_rows, dtype=bool)
        return Changes(self._ts(net), batches, np.asarray(net["_after"], dtype=bool), batches, net, every, self._ident)

    @staticmethod
    def _ts(rows: pa.Table) -> np.ndarray:
        return date_id_days(ao.column(rows, "sk_dateid").to_numpy(zero_copy_only=False)) * US_PER_DAY

    @staticmethod
    def _ident(rows: pa.Table) -> pa.Array:
        return _joined("SYMB=", rows["symbol"], ":DATE=", rows["sk_dateid"])

    def stamps(self, ctx: JobContext, span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(event time, TPC-DI batch, message key) of the records in `span`."""
        rows = ctx.lake.read_if_exists(self.table, ["symbol", "sk_dateid", "batchid"], _date_range("sk_dateid", span))
        batch = ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64)
        return self._ts(rows), batch, self._ident(rows)

    def latest_of(self, ctx: JobContext, batch: int) -> int | None:
        if not ctx.lake.exists(self.table):
            return None
        rows = ctx.lake.read_where(self.table, pc.field("batchid") == batch, ["sk_dateid"])
        return int(self._ts(rows).max()) if rows.num_rows else None

    def read(self, ctx: JobContext, span: tuple[int, int]) -> Records:
        columns = [*self._FEED, "sk_companyid"]
        rows = ao.sort(
            ctx.lake.read_if_exists(self.table, columns, _date_range("sk_dateid", span)), ["symbol", "sk_dateid"]
        )
        ts = self._ts(rows)
        return Records(
            ts=ts,
            batch=ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            ident=self._ident(rows),
            nodes=route_securities(ctx, rows["symbol"], np.floor_divide(ts, US_PER_DAY), rows["sk_companyid"]),
            measures={
                "days": np.ones(rows.num_rows, np.int64),
                "volume": ao.column(rows, "volume").to_numpy(zero_copy_only=False).astype(np.int64),
                "high": ao.cents(rows["dayhigh"]),
                "low": ao.cents(rows["daylow"]),
            },
        )


SOURCES = {ws.TRADES: TradeSource(), ws.MARKET: MarketSource()}
_STAMP_COLUMNS = ["tradeid", "sk_closedateid", "sk_closetimeid", "batchid"]


def _date_range(column: str, span: tuple[int, int]) -> pc.Expression:
    """`column` (a DimDate id) within the days of the span [lo, hi) of µs."""
    first, last = (int(ao.date_ids(np.array([t // US_PER_DAY]))[0]) for t in (span[0], span[1] - 1))
    return (pc.field(column) >= first) & (pc.field(column) <= last)


def _joined(*parts: str | pa.ChunkedArray) -> pa.Array:
    """Text columns and literals joined element-wise (message keys such as `T_ID=5`)."""
    values = [
        pa.scalar(p, pa.large_string())
        if isinstance(p, str)
        else ao.column(pa.table({"p": p}), "p").cast(pa.large_string())
        for p in parts
    ]
    lengths = [len(v) for v in values if isinstance(v, pa.Array)]
    if lengths and lengths[0] == 0:
        return pa.array([], pa.large_string())
    return pc.binary_join_element_wise(*values, pa.scalar("", pa.large_string()))


def _lookup(ctx: JobContext, table: Table, key: str, values: pa.ChunkedArray | pa.Array, column: str) -> pa.Array:
    """`column` of the `table` row whose unique `key` is each of `values` (NULL where none)."""
    values = ao.column(pa.table({"v": values}), "v")
    if not ctx.lake.exists(table) or len(values) == 0:
        return pa.nulls(len(values), table.arrow_schema().field(column).type)
    rows = ctx.lake.read_where(table, pc.field(key).isin(pc.unique(values)), [key, column])
    index = pc.index_in(values, value_set=rows[key].combine_chunks())
    return take(rows[column], pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int64))


def _versions(ctx: JobContext, table: Table, key: str, values: pa.Array, columns: list[str]) -> pa.Table:
    cols = [key, *columns, "effectivedate", "enddate"]
    if len(values) == 0:
        return table.arrow_schema().empty_table().select(cols)
    return ctx.lake.read_if_exists(table, cols, pc.field(key).isin(pc.unique(values.drop_null())))


def _valid(versions: pa.Table, key: str, values: pa.Array, days: np.ndarray) -> np.ndarray:
    return valid_versions(values, days, versions[key], versions["effectivedate"], versions["enddate"])


def route_securities(
    ctx: JobContext, symbols: pa.Array | pa.ChunkedArray, days: np.ndarray, fallback_company: pa.ChunkedArray
) -> dict[str, pa.Array]:
    """`security_routes` of records (symbol, day), with the versions of their symbols read from the lake."""
    symbols = ao.column(pa.table({"s": symbols}), "s").cast(pa.large_string())
    securities = _versions(ctx, wh.DIM_SECURITY, "symbol", symbols.cast(pa.string()), ["sk_companyid"])
    companies = ctx.lake.read_if_exists(
        wh.DIM_COMPANY, ["sk_companyid", "companyid", "industry", "effectivedate", "enddate"]
    )
    industries = ao.sort(ctx.lake.read_if_exists(wh.INDUSTRY, ["in_id", "in_name", "in_sc_id"]), ["in_id"])
    return security_routes(symbols, days, fallback_company, securities, companies, industries)


def security_routes(
    symbols: pa.Array,
    days: np.ndarray,
    fallback_company: pa.Array | pa.ChunkedArray,
    securities: pa.Table,
    companies: pa.Table,
    industries: pa.Table,
) -> dict[str, pa.Array]:
    """security, company, industry and sector of records (symbol, day): the DimSecurity version of the symbol
    valid that day gives the company (CIK), the DimCompany version of the CIK valid that day its industry, and the
    industry its sector. A symbol without a version that day takes the company version `fallback_company` names;
    a CIK without one, that company version's industry. DimCompany names its industry: a name that several
    Industry rows share (never in official data) is the first of `industries` (sorted by IN_ID: the lowest)."""
    v = _valid(securities, "symbol", symbols, days)
    sk_company = pc.coalesce(take(securities["sk_companyid"], v), ao.column(pa.table({"f": fallback_company}), "f"))
    own = pc.fill_null(pc.index_in(sk_company, value_set=companies["sk_companyid"].combine_chunks()), -1)
    own = own.to_numpy(zero_copy_only=False).astype(np.int64)
    cik = take(companies["companyid"], own)
    cv = _valid(companies, "companyid", cik, days)
    cv = np.where(cv >= 0, cv, own)
    industry_name = take(companies["industry"], cv)
    ind = pc.index_in(industry_name, value_set=industries["in_name"].combine_chunks())
    ind = pc.fill_null(ind, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return {
        ws.SECURITY: symbols,
        ws.COMPANY: cik.cast(pa.large_string()),
        ws.INDUSTRY: take(industries["in_id"], ind).cast(pa.large_string()),
        ws.SECTOR: take(industries["in_sc_id"], ind).cast(pa.large_string()),
    }


def route_accounts(
    ctx: JobContext,
    accounts: pa.Array,
    days: np.ndarray,
    fallback_customer: pa.ChunkedArray,
    fallback_broker: pa.ChunkedArray,
) -> dict[str, pa.Array]:
    """`account_routes` of records (account id, day), with the versions of their accounts read from the lake."""
    versions = _versions(ctx, wh.DIM_ACCOUNT, "accountid", accounts, ["sk_customerid", "sk_brokerid"])
    routes = account_routes(accounts, days, fallback_customer, fallback_broker, versions)
    return {
        ws.ACCOUNT: routes[ws.ACCOUNT],
        ws.CUSTOMER: _lookup(ctx, wh.DIM_CUSTOMER, "sk_customerid", routes[ws.CUSTOMER], "customerid").cast(
            pa.large_string()
        ),
        ws.BROKER: _lookup(ctx, wh.DIM_BROKER, "sk_brokerid", routes[ws.BROKER], "brokerid").cast(pa.large_string()),
    }


def account_routes(
    accounts: pa.Array,
    days: np.ndarray,
    fallback_customer: pa.Array | pa.ChunkedArray,
    fallback_broker: pa.Array | pa.ChunkedArray,
    versions: pa.Table,
) -> dict[str, pa.Array]:
    """account (its id) and the customer and broker versions (surrogate keys) of records (account id, day): those
    of the DimAccount version valid that day, or the versions the record names when the account has none."""
    v = _valid(versions, "accountid", accounts, days)
    fc = ao.column(pa.table({"f": fallback_customer}), "f")
    fb = ao.column(pa.table({"f": fallback_broker}), "f")
    return {
        ws.ACCOUNT: ao.column(pa.table({"a": accounts}), "a").cast(pa.large_string()),
        ws.CUSTOMER: pc.coalesce(take(versions["sk_customerid"], v), fc),
        ws.BROKER: pc.coalesce(take(versions["sk_brokerid"], v), fb),
    }


HIERARCHIES: dict[str, tuple[tuple[Table, str, tuple[str, ...]], ...]] = {
    # (dimension, natural key, parent columns) whose versions route a source's records
    ws.TRADES: (
        (wh.DIM_SECURITY, "symbol", ("sk_companyid",)),
        (wh.DIM_COMPANY, "companyid", ("industry",)),
        (wh.DIM_ACCOUNT, "accountid", ("sk_customerid", "sk_brokerid")),
    ),
    ws.MARKET: ((wh.DIM_SECURITY, "symbol", ("sk_companyid",)), (wh.DIM_COMPANY, "companyid", ("industry",))),
}


def rerouted(ctx: JobContext, scope: BatchScope) -> dict[str, list[tuple[int, int]]]:
    """Per hierarchy dimension this micro-batch changed, the spans of days [start, end) whose records it re-routes
    (`routing_changes`); a changed Industry re-routes every day."""
    out: dict[str, list[tuple[int, int]]] = {}
    if scope.changed(ctx, wh.INDUSTRY, ["in_id"]) is not None:
        out[wh.INDUSTRY.name] = [(0, np.iinfo(np.int32).max)]
    dimensions = {
        table.name: (table, key, parents) for hierarchy in HIERARCHIES.values() for table, key, parents in hierarchy
    }
    for table, key, parents in dimensions.values():
        feed = scope.changed(ctx, table, [key, *parents, "effectivedate", "enddate", "_change_type"])
        if feed is None or feed.num_rows == 0:
            continue
        after = np.asarray(pc.is_in(feed["_change_type"], value_set=pa.array(["insert", "update_postimage"])))
        eff, end = ao.days(feed["effectivedate"]), ao.days(feed["enddate"])
        keys = feed[key].to_pylist()
        values = list(zip(*(feed[p].to_pylist() for p in parents), strict=True))
        rows = [(k, int(s), int(e), p) for k, s, e, p in zip(keys, eff, end, values, strict=True)]
        before_rows = [r for r, a in zip(rows, after, strict=True) if not a]
        after_rows = [r for r, a in zip(rows, after, strict=True) if a]
        out[table.name] = routing_changes(before_rows, after_rows)
    return out


def rerouted_spans(days: dict[str, list[tuple[int, int]]], source: str, end: int) -> list[tuple[int, int]]:
    """The spans of event time (µs) of `source`'s records that `rerouted` days re-route, clamped to [0, end)."""
    tables = [wh.INDUSTRY.name, *(t.name for t, _, _ in HIERARCHIES[source])]
    spans = [(max(lo * US_PER_DAY, 0), min(hi * US_PER_DAY, end)) for t in tables for lo, hi in days.get(t, [])]
    return [(lo, hi) for lo, hi in spans if lo < hi]


# ------------------------------------------------------------------------------------------------ run
def read_latest(ctx: JobContext, source: str) -> dict[int, int]:
    rows = ctx.lake.read_if_exists(ws.WINDOW_WATERMARKS, ["source_batch", "latest"], pc.field("source") == source)
    batches = rows["source_batch"].to_pylist()
    latest = rows["latest"].cast(pa.int64()).to_pylist()
    return dict(zip(batches, latest, strict=True))


def update_latest(ctx: JobContext, src, before: dict[int, int], changes: Changes) -> dict[int, int]:
    """The latest event time per TPC-DI batch after the micro-batch: raised by its new records; read again for a
    batch whose latest record it changed or removed."""
    after = dict(before)
    for b in sorted(set(changes.batches.tolist())):
        mine = changes.batch == b
        new = changes.ts[mine & changes.after]
        old = changes.ts[mine & ~changes.after]
        if b in before and (old == before[b]).any() and not (new == before[b]).any():
            latest = src.latest_of(ctx, b)
        else:
            candidates = [t for t in (before.get(b), int(new.max()) if len(new) else None) if t is not None]
            latest = max(candidates) if candidates else src.latest_of(ctx, b)
        if latest is None:
            after.pop(b, None)
        else:
            after[b] = latest
    return after


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the live windows this micro-batch touched, for every source with declared windows."""
    out: dict[str, int] = {}
    sources = [src for source, src in SOURCES.items() if ws.windows_of(source)]
    if not sources or scope.committed(ctx, STEP, ws.WINDOW_WATERMARKS):  # the watermarks commit comes last
        return out
    days = rerouted(ctx, scope)
    marks, deletes = [], []
    for src in sources:
        done = run_source(ctx, scope, src, days)
        if done is not None:
            rows, latest, gone = done
            out |= rows
            marks.append(_marks(src.name, latest))
            deletes.append(_marks(src.name, dict.fromkeys(gone, 0)).select(list(ws.WINDOW_WATERMARKS.key)))
    if marks:
        ctx.lake.upsert(
            ws.WINDOW_WATERMARKS,
            pa.concat_tables(marks),
            app_id=scope.app_id(STEP, ws.WINDOW_WATERMARKS),
            version=scope.batch_id,
            deletes=pa.concat_tables(deletes),
        )
    return out


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
) -> tuple[dict[str, int], dict[int, int], list[int]] | None:
    """One source's windows: what its changes, the re-routings and its moved watermarks touch (the module's doc).
    Commits the window rows and the Alerts; returns (rows written per table, the latest event time per TPC-DI
    batch after the micro-batch, batches that no longer have one) for `run` to commit last, or None when the
    micro-batch touched nothing of the source."""
    source = src.name
    table = ws.WINDOW_TABLES[source]
    changes = src.changes(ctx, scope)
    if changes is None and not rerouted_spans(rerouted_days, source, np.iinfo(np.int64).max):
        return None
    changes = changes or Changes.none()
    grace = us(ws.GRACE[source])
    before = read_latest(ctx, source)
    latest = update_latest(ctx, src, before, changes)
    end_of_time = max([*latest.values(), *changes.ts.tolist(), 0]) + US_PER_DAY
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
    if computed is not None and (computed.alerts.num_rows or _late_alerts_exist(ctx, source)):
        owners = pa.concat_arrays([computed.judged(), changes.ident.cast(pa.large_string())]).to_pylist()
        written = commit_alert_changes(
            ctx, scope, STEP, source, computed.alerts, source=ALERT_SOURCE[source], texts=(LATE,), owners=owners
        )
        if written:
            out[wh.DI_MESSAGES.name] = written
    log.info("AG micro-batch %s: %s windows: %s", scope.batch_id, source, out)
    return out, latest, sorted(set(before) - set(latest))


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


def _spread(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A mask over `mask`'s positions: `values` at the positions where `mask` is set, False elsewhere."""
    out = np.zeros(len(mask), dtype=bool)
    out[np.flatnonzero(mask)] = values
    return out


def horizon(window: ws.Window, latest: Mapping[int, int]) -> int:
    """The end of time before which `window`'s rows are not kept: its `keep` before the source's latest record."""
    return max(latest.values()) - us(window.keep) if latest else NO_TIME


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
    windows = ws.windows_of(source)
    spans = list(spans)
    aged = []
    for w in windows:
        old, new = horizon(w, before), horizon(w, latest)
        if new < old:  # a latest record went away: rows behind the old horizon may come back
            spans.append((max(new, 0), old))
        elif new > old and ctx.lake.exists(table):
            cond = (pc.field("window_name") == w.name) & (pc.field("window_end") <= _stamp(new))
            aged.append(_stored(ctx, table, cond).select(list(table.key)))
    span = _hull(spans)
    rows = table.arrow_schema().empty_table()
    gone = table.arrow_schema().empty_table().select(list(table.key))
    if span is not None:
        rows, gone = _recompute(ctx, src, windows, span, latest)
    judged_span = _hull(moves)
    mine = changes.after
    ts, batch = changes.ts[mine], changes.batch[mine]
    late = late_mask(ts, batch, latest, grace)
    stamps = pa.table({"ident": changes.counted(mine & _spread(mine, late)), "ts": ts[late], "batch": batch[late]})
    judged = [lambda: changes.counted(mine)]
    if judged_span is not None:  # the records whose batch's watermark moved
        more_ts, more_batch, more_ident = src.stamps(ctx, judged_span)
        more_late = late_mask(more_ts, more_batch, latest, grace)
        more = pa.table(
            {"ident": more_ident.filter(pa.array(more_late)), "ts": more_ts[more_late], "batch": more_batch[more_late]}
        )
        stamps = ao.first_of_groups(ao.sort(pa.concat_tables([stamps, more.cast(stamps.schema)]), ["ident"]), ["ident"])
        judged.append(lambda: more_ident)
    alerts = late_alerts(source, stamps, latest)
    if not aged and span is None and not len(ts) and judged_span is None:
        return None
    gone = pa.concat_tables([gone, *aged]) if aged else gone
    return Computed(rows, gone, alerts, lambda: pa.concat_arrays([j().cast(pa.large_string()) for j in judged]))


def _recompute(ctx: JobContext, src, windows: tuple[ws.Window, ...], span: tuple[int, int], latest: dict[int, int]):
    """(rows to upsert, keys to delete) of the windows that overlap `span` and end after their
    horizon. Sessions may chain back past their horizon: the read starts a day before it and goes further back
    while a kept session begins within its gap of the read's start."""
    source = src.name
    table = ws.WINDOW_TABLES[source]
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
    if not needs:
        return table.arrow_schema().empty_table(), table.arrow_schema().empty_table().select(list(table.key))
    read = (min(n[0] for n in needs), max(n[1] for n in needs))
    earliest = min([read[0], *(lo for _, lo in sessions)])
    while True:
        records = src.read(ctx, read)
        late = late_mask(records.ts, records.batch, latest, us(ws.GRACE[source]))
        new = kept(results(source, records.filter(~late), windows, span, table), windows, latest)
        starts = new["window_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        names = new["window_name"].to_pylist() if sessions and read[0] > earliest else []
        cut = any(
            read[0] > lo and any(n == w.name and t < read[0] + us(w.size) for n, t in zip(names, starts, strict=True))
            for w, lo in sessions
        )
        if not cut:
            break
        read = (max(earliest, read[0] - 2 * (read[1] - read[0])), read[1])
    return ao.changes_against(new, pa.concat_tables(stored), table.key)


def kept(rows: pa.Table, windows: tuple[ws.Window, ...], latest: Mapping[int, int]) -> pa.Table:
    """The rows of windows that end after their window's horizon."""
    if not latest or rows.num_rows == 0:
        return rows
    limits = {w.name: horizon(w, latest) for w in windows}
    limit = pa.array([limits[n] for n in rows["window_name"].to_pylist()], pa.int64())
    return rows.filter(pc.greater(rows["window_end"].cast(pa.int64()), limit))


def _stamp(ts_us: int) -> pa.Scalar:
    return pa.scalar(int(ts_us), pa.timestamp("us", tz="UTC"))


def _stored(ctx: JobContext, table: Table, cond: pc.Expression) -> pa.Table:
    return ctx.lake.read_if_exists(table, condition=cond).cast(table.arrow_schema())


def late_alerts(source: str, late: pa.Table | Records, latest: Mapping[int, int]) -> pa.Table:
    """One "Late record past grace" Alert per late record (`ident`, `ts`, `batch`), in its TPC-DI batch."""
    if isinstance(late, Records):
        late = pa.table({"ident": late.ident, "ts": late.ts, "batch": late.batch})
    ts = ao.column(late, "ts").to_numpy(zero_copy_only=False).astype(np.int64)
    batch = ao.column(late, "batch").to_numpy(zero_copy_only=False).astype(np.int64)
    marks = watermarks(latest)(batch)
    grace = ws.GRACE[source]
    data = [
        f"event time {_iso(t)} is before the watermark of batch {b} ({_iso(m)}) minus the grace ({grace})"
        for t, b, m in zip(ts.tolist(), batch.tolist(), marks.tolist(), strict=True)
    ]
    return alert_rows(
        pa.array(batch, pa.int64()), source=ALERT_SOURCE[source], text=LATE, data=data, key=late["ident"].to_pylist()
    )
