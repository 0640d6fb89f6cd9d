"""FactMarketHistory (step T4): daily market data per security with its 52-week high and low, P/E and yield.

Implements TPC-DI 1.1.0 clause 4.5 for FactMarketHistory, historical (Batch1 DailyMarket.txt) and incremental
(DailyMarket.txt with CDC_FLAG/CDC_DSN). One row per DailyMarket record (DM_DATE, DM_S_SYMB, DM_CLOSE, DM_HIGH,
DM_LOW, DM_VOL):
- `closeprice`, `dayhigh`, `daylow`, `volume`: the record's values; `sk_dateid`: DM_DATE's DimDate id;
- `sk_securityid`, `sk_companyid`: the DimSecurity version (by symbol) valid on DM_DATE and its company version;
- `fiftytwoweekhigh` / `sk_fiftytwoweekhighdate`: the highest DM_HIGH of the security over the 52 weeks ending on
  DM_DATE (the 364 days DM_DATE - 363 .. DM_DATE), and the first of those days with it; `fiftytwoweeklow` /
  `sk_fiftytwoweeklowdate` likewise with DM_LOW. Days without a record count for nothing; the first year of a
  security has a shorter history, so its window holds what there is;
- `peratio`: DM_CLOSE divided by the sum of the company's FI_BASIC_EPS (Financial) over the four calendar
  quarters before DM_DATE's quarter, rounded half up to cents; with fewer than four of those quarters in Financial,
  the sum of those there are. No quarter (or a zero sum): NULL, and an Alert "No earnings for company" (data
  `DM_S_SYMB = <symbol>`, key `SYMB=<symbol> DATE=<DM_DATE>`); the company is the security version's CIK
  (Financial rows of any version of it);
- `yield`: the security version's dividend / DM_CLOSE, in percent, rounded half up to cents (NULL when DM_CLOSE
  is 0);
- `batchid`: the TPC-DI batch of the record; `symbol`: with `sk_dateid` the row's identity.
Decisions where the spec is silent: of the records of one (symbol, DM_DATE), the latest in declared order (TPC-DI
batch, then CDC_DSN, then the values) counts (a record delivered again replaces itself); a record whose security
has no DimSecurity version on DM_DATE is not written and raises an Alert "Market history not loaded" (deleted when
a later micro-batch brings the version), but its prices still count in the windows of later days.

**The 52-week window from shared slices** (`jobs.market_slices`): per security, the highest DM_HIGH and lowest
DM_LOW of aligned blocks of 2, 4, .., 256 days are kept in `staging.market_slices` between micro-batches, and each
day's window is combined from about 18 of them; a micro-batch that brings a day rebuilds the 8 blocks containing
it. The records that count and the rows made from them (keys, P/E, yield, alerts) are `jobs.market_rows`; this
module is the step: what a micro-batch recomputes, read from and committed to the lake.

Incrementality (recompute per touched key): a micro-batch recomputes (a) the rows of the (symbol, day) pairs with a
record staged by it, and the later days of those symbols whose 52-week window contains one of them (none when days
arrive in order), and (b) every row of the symbols whose DimSecurity versions, or whose company's DimCompany
versions or Financial rows, it changed (their keys, dividend or P/E may change). Rows are upserted, rows of (b)
that no longer exist deleted. Computed in the driver on Arrow data, vectorized with numpy (pure `effective_records`,
`rebuild_slices`, `window_extremes`, `market_rows`; inputs read with delta-rs; a micro-batch of more than
`RECORDS_PER_PIECE` new records a piece of symbols at a time, `pieces`): Spark's bounded window frames
recompute every frame's maximum, 6.8-15.7 s for SF 3's 1.27 M records against 1.5 s here (bench/README.md).

Commits (app transactions `T4/factmarkethistory`, `T4/dimessages/factmarkethistory`, `T4/market_slices`): the
rows, the alerts, then the slices, which are state the next micro-batch reads and therefore go last (a rerun after
a crash before them recomputes exactly the same rows).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, fields, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.market_rows import (
    NO_EARNINGS,
    NOT_LOADED,
    RECORD_COLUMNS,
    SOURCE,
    TABLE,
    earnings,
    effective_records,
    market_alerts,
    market_rows,
    valid_index,
)
from jobs.market_slices import (
    WINDOW_DAYS,
    Slices,
    affected_blocks,
    day_slices,
    rebuild_needs,
    rebuild_slices,
    slices_from_table,
    slices_table,
    window_extremes,
    window_needs,
)
from jobs.messages import commit_alert_changes
from jobs.scope import BatchScope, record_columns
from jobs.slicing import key_parts
from jobs.valid_at import take
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import MARKET_SLICES
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import PieceFiles

log = logging.getLogger(__name__)

STEP = "T4"
# Above this many new records a micro-batch is computed a piece of symbols at a time (`pieces`)
RECORDS_PER_PIECE = 1_000_000
RECORD_TABLES = (src.DAILY_MARKET.staging, src.DAILY_MARKET_CDC.staging)


@dataclass(frozen=True)
class Touched:
    """What a micro-batch recomputes: the (symbol, day) pairs of its records, and whole symbols."""

    new: pa.Table  # dm_s_symb, dm_date of the records staged by this micro-batch
    symbols: pa.Array  # symbols recomputed whole (their security, company or earnings changed)


def touched(ctx: JobContext, scope: BatchScope) -> Touched:
    """The records this micro-batch staged, and the symbols whose DimSecurity versions, or whose company's
    DimCompany versions or Financial rows, this micro-batch changed."""
    pairs = ["dm_s_symb", "dm_date"]
    new = [scope.staged_where(ctx, t, pc.field("batch_id") == scope.batch_id, pairs) for t in RECORD_TABLES]
    symbols = []
    changed = scope.changed(ctx, wh.DIM_SECURITY, ["symbol"])
    if changed is not None:
        symbols.append(changed["symbol"].combine_chunks())
    sks = [
        rows["sk_companyid"].combine_chunks()
        for rows in (scope.changed(ctx, t, ["sk_companyid"]) for t in (wh.DIM_COMPANY, wh.FINANCIAL))
        if rows is not None
    ]
    if sks and ctx.lake.exists(wh.DIM_COMPANY) and ctx.lake.exists(wh.DIM_SECURITY):
        companies = ctx.lake.read_columns(wh.DIM_COMPANY, ["sk_companyid", "companyid"])
        ciks = companies.filter(pc.is_in(companies["sk_companyid"], value_set=pc.unique(pa.concat_arrays(sks))))
        versions = companies.filter(pc.is_in(companies["companyid"], value_set=ciks["companyid"].combine_chunks()))
        of_companies = ctx.lake.read_where(
            wh.DIM_SECURITY, pc.field("sk_companyid").isin(versions["sk_companyid"].combine_chunks()), ["symbol"]
        )
        symbols.append(of_companies["symbol"].combine_chunks())
    whole = [s.cast(pa.large_string()) for s in symbols]
    return Touched(
        new=pa.concat_tables(new),
        symbols=pc.unique(pa.concat_arrays(whole)) if whole else pa.array([], pa.large_string()),
    )


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the touched rows of FactMarketHistory; commit them, their alerts, then the slices."""
    if not any(ctx.lake.exists(t) for t in RECORD_TABLES):
        return {}
    if scope.committed(ctx, STEP, MARKET_SLICES):  # the last of the step's commits
        return {}
    what = touched(ctx, scope)
    if what.new.num_rows == 0 and len(what.symbols) == 0:
        return {}
    whole, parts = what.symbols, pieces(what)
    del what  # a first load's pieces stand for its records without holding them (`pieces`)
    # A first load in several pieces writes each piece's rows and slices as files of their own as it goes, and
    # commits each table's files at once: neither table is ever whole in memory (SF 30: 12.7 M rows each).
    in_files = {
        t: ctx.lake.pieces(t, app_id=scope.app_id(STEP, t), version=scope.batch_id)
        for t in (TABLE, MARKET_SLICES)
        if len(parts) > 1 and not scope.committed(ctx, STEP, t) and ctx.lake.is_empty(t)
    }
    kept = []
    for piece in parts:
        part = compute(ctx, scope, piece)
        # (a piece written is let go: an empty table of its schema, not a slice of it, which would hold its buffers)
        if TABLE in in_files:
            in_files[TABLE].add(part.rows)
            part = replace(part, rows=part.rows.schema.empty_table())
        if MARKET_SLICES in in_files:
            in_files[MARKET_SLICES].add(part.slices)
            part = replace(part, slices=part.slices.schema.empty_table())
        kept.append(part)
    computed = Computed(*(pa.concat_tables([getattr(p, f.name) for p in kept]) for f in fields(Computed)))
    out: dict[str, int] = {}
    if not scope.committed(ctx, STEP, TABLE):
        out[TABLE.name] = _commit(ctx, scope, TABLE, computed, in_files)
    owners = [f"SYMB={s}" for s in whole.to_pylist()]
    written = commit_alert_changes(
        ctx, scope, STEP, TABLE.name, computed.alerts, source=SOURCE, texts=(NO_EARNINGS, NOT_LOADED), owners=owners
    )
    if written:
        out[wh.DI_MESSAGES.name] = written
    # committed even when empty: the slices commit is the step's last, so its app transaction marks it done
    out[MARKET_SLICES.name] = _commit(ctx, scope, MARKET_SLICES, computed, in_files)
    log.info("T4 micro-batch %s: factmarkethistory: %s", scope.batch_id, out)
    return out


def _commit(
    ctx: JobContext, scope: BatchScope, table: Table, computed: Computed, in_files: dict[Table, PieceFiles]
) -> int:
    """Commit the pieces `run` wrote as files for `table`, or upsert its computed rows (FactMarketHistory's with its
    gone keys deleted); the rows committed."""
    if table in in_files:
        return in_files[table].commit().rows
    rows, gone = (computed.rows, computed.gone) if table is TABLE else (computed.slices, None)
    ctx.lake.upsert(table, rows, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=gone)
    return rows.num_rows


@dataclass(frozen=True)
class Computed:
    rows: pa.Table
    gone: pa.Table
    alerts: pa.Table
    slices: pa.Table


def pieces(what: Touched) -> list[Touched]:
    """`what` cut by symbol into pieces of about `RECORDS_PER_PIECE` new records (one piece, most often): a
    security's rows depend on its own records, its versions and its company's, so the pieces give the rows one
    piece would, and a historical load (SF 10: 4.2 M records) holds one piece's records and windows at a time.
    A piece's `new` holds each of its symbols' first and last new day only, all `compute` asks of the records
    (SF 100's first load: 42 M (symbol, day) pairs, ~2 GiB with their copies, not held through the step)."""
    if what.new.num_rows <= RECORDS_PER_PIECE:
        return [what]
    spans = what.new.group_by("dm_s_symb", use_threads=False).aggregate([("dm_date", "min"), ("dm_date", "max")])
    names = spans["dm_s_symb"].combine_chunks().cast(pa.large_string())
    symbols = pc.unique(pa.concat_arrays([names, what.symbols.cast(pa.large_string())]))
    symbols = pc.take(symbols, pc.array_sort_indices(symbols))
    size = -(-len(symbols) // -(-what.new.num_rows // RECORDS_PER_PIECE))  # symbols a piece, rounded up
    out = []
    for start in range(0, len(symbols), size):
        group = symbols[start : start + size]
        mine = spans.filter(pc.is_in(names, value_set=group))
        new = pa.table(
            {
                "dm_s_symb": pa.concat_arrays([mine["dm_s_symb"].combine_chunks()] * 2),
                "dm_date": pa.concat_arrays(
                    [mine["dm_date_min"].combine_chunks(), mine["dm_date_max"].combine_chunks()]
                ),
            }
        ).cast(what.new.schema)
        out.append(Touched(new=new, symbols=what.symbols.filter(pc.is_in(what.symbols, value_set=group))))
    return out


def compute(ctx: JobContext, scope: BatchScope, what: Touched) -> Computed:
    """Everything `run` commits, from the staged records, the slices and the dimensions (reads only)."""
    new_symbols = pc.unique(what.new["dm_s_symb"].combine_chunks().cast(pa.large_string()))
    whole = what.symbols
    # The records of the whole symbols, and of the new symbols from their first new day to a window after their
    # last (the new days, their earlier deliveries, and later days whose windows hold a new day).
    cond = pc.field("dm_s_symb").isin(whole.cast(pa.string()))
    if what.new.num_rows:
        first, last = pc.min_max(what.new["dm_date"]).values()
        cond = cond | (
            pc.field("dm_s_symb").isin(new_symbols.cast(pa.string()))
            & (pc.field("dm_date") >= first.as_py())
            & (pc.field("dm_date") <= last.as_py() + dt.timedelta(days=WINDOW_DAYS - 1))
        )
    records = _read_records(ctx, scope, cond)
    symbols = pc.unique(pa.concat_arrays([records["dm_s_symb"].combine_chunks(), new_symbols, whole]))
    codes = _codes(records, symbols)
    days = ao.days(records["dm_date"])
    is_new = ao.column(records, "_new").to_numpy(zero_copy_only=False)
    in_whole = np.asarray(pc.is_in(records["dm_s_symb"], value_set=whole), dtype=bool)
    query = in_whole | is_new | _in_a_new_window(codes, days, is_new)
    # Every day of a whole symbol is in memory: its blocks are rebuilt from them. A symbol with new days only
    # rebuilds the blocks of those days and reads what else its windows and blocks need.
    partial = is_new & ~in_whole
    partial_blocks = affected_blocks(codes[partial], days[partial])
    whole_blocks = affected_blocks(codes[in_whole], days[in_whole])
    changed = [ao.union(a, b) for a, b in zip(whole_blocks, partial_blocks, strict=True)]
    partial_query = query & ~in_whole
    wanted = ao.union(rebuild_needs(partial_blocks), window_needs(codes[partial_query], days[partial_query]))
    wanted = wanted[~ao.member(wanted, ao.distinct(np.concatenate(changed)))]
    level = key_parts(wanted)[1]
    in_memory = day_slices(codes, records)
    day_keys = wanted[level == 0]
    read_days = _read_days(ctx, scope, day_keys[~ao.member(day_keys, in_memory.keys)], symbols)
    read_slices = _read_slices(ctx, wanted[level >= 1], symbols)
    fresh = rebuild_slices(changed, [in_memory, read_days, read_slices])
    high, low = window_extremes(codes[query], days[query], [fresh, in_memory, read_days, read_slices])

    securities = _dimension(
        ctx,
        wh.DIM_SECURITY,
        "symbol",
        symbols.cast(pa.string()),
        ["symbol", "sk_securityid", "sk_companyid", "dividend", "effectivedate", "enddate"],
    )
    companies = ctx.lake.read_if_exists(wh.DIM_COMPANY, ["sk_companyid", "companyid"])
    eps = earnings(_financials(ctx, securities, companies), companies)
    rows, unresolved, without = market_rows(records.filter(pa.array(query)), high, low, securities, companies, eps)
    rows, gone = ao.changes_against(rows, _stored(ctx, whole, rows), TABLE.key)
    # Most rebuilt blocks keep their extremes (a new day seldom beats a block's): only the others are committed.
    fresh = fresh.differing_from(_read_slices(ctx, fresh.keys, symbols))
    return Computed(rows, gone, market_alerts(unresolved, without), slices_table(fresh, symbols))


def _financials(ctx: JobContext, securities: pa.Table, companies: pa.Table) -> pa.Table:
    """The Financial rows of every version of the companies of `securities`."""
    columns = ["sk_companyid", "fi_year", "fi_qtr", "fi_basic_eps"]
    if not ctx.lake.exists(wh.FINANCIAL) or securities.num_rows == 0:
        return pa.table({c: pa.array([], wh.FINANCIAL.arrow_schema().field(c).type) for c in columns})
    ciks = take(companies["companyid"], valid_index(securities["sk_companyid"], companies["sk_companyid"]))
    versions = companies.filter(pc.is_in(companies["companyid"], value_set=pc.unique(ciks.drop_null())))
    sks = versions["sk_companyid"].combine_chunks()
    return ctx.lake.read_where(wh.FINANCIAL, pc.field("sk_companyid").isin(sks), columns)


def _read_records(ctx: JobContext, scope: BatchScope, cond: pc.Expression) -> pa.Table:
    read = (*RECORD_COLUMNS, "cdc_dsn", "batch_id")
    staged = [scope.staged_where(ctx, t, cond, record_columns(t, read)) for t in RECORD_TABLES]
    return effective_records(*staged, batch_id=scope.batch_id)


def _codes(records: pa.Table, symbols: pa.Array) -> np.ndarray:
    return pc.index_in(records["dm_s_symb"], value_set=symbols).to_numpy(zero_copy_only=False).astype(np.int64)


def _in_a_new_window(codes: np.ndarray, days: np.ndarray, is_new: np.ndarray) -> np.ndarray:
    """Whether each (code, day)'s 52-week window holds a new day of its security (records sorted by code, day)."""
    keys = (codes << 32) | (days + (1 << 31))
    new_keys = keys[is_new]  # sorted, as the records are
    if len(new_keys) == 0:
        return np.zeros(len(keys), dtype=bool)
    latest = np.searchsorted(new_keys, keys, side="right") - 1  # the latest new day on or before each day
    found = latest >= 0
    prior = new_keys[np.maximum(latest, 0)]
    same = (prior >> 32) == codes
    gap = days - ((prior & 0xFFFFFFFF) - (1 << 31))
    return found & same & (gap <= WINDOW_DAYS - 1)


def _read_days(ctx: JobContext, scope: BatchScope, keys: np.ndarray, symbols: pa.Array) -> Slices:
    """The level-0 slices (days) `keys` from the staged DailyMarket records."""
    if len(keys) == 0:
        return Slices.empty()
    code, _, day = key_parts(keys)
    names = symbols.take(pa.array(np.unique(code)))
    dates = pa.array(np.unique(day).astype(np.int32), pa.int32()).cast(pa.date32())
    cond = pc.field("dm_s_symb").isin(names.cast(pa.string())) & _any_equal("dm_date", dates.to_pylist())
    records = _read_records(ctx, scope, cond)
    return day_slices(_codes(records, symbols), records).only(keys)


def _read_slices(ctx: JobContext, keys: np.ndarray, symbols: pa.Array) -> Slices:
    """The stored slices (levels 1..) `keys`."""
    if len(keys) == 0 or not ctx.lake.exists(MARKET_SLICES):
        return Slices.empty()
    code, level, block = key_parts(keys)
    pairs = sorted(set(zip(level.tolist(), block.tolist(), strict=True)))
    if len(pairs) <= _EQUALITIES:
        cond = _any_of([(pc.field("level") == k) & (pc.field("block") == b) for k, b in pairs])
    else:
        levels = pa.array(sorted({k for k, _ in pairs}), pa.int32())
        blocks = pa.array(sorted({b for _, b in pairs}), pa.int32())
        cond = pc.field("level").isin(levels) & pc.field("block").isin(blocks)
    names = symbols.take(pa.array(np.unique(code)))
    rows = ctx.lake.read_where(MARKET_SLICES, cond & pc.field("symbol").isin(names.cast(pa.string())))
    return slices_from_table(rows, symbols).only(keys)


# Below this many values a filter is an OR of equalities, with which a scan prunes row groups by their
# statistics; above, an `isin`.
_EQUALITIES = 64


def _any_equal(column: str, values: list) -> pc.Expression:
    if len(values) <= _EQUALITIES:
        return _any_of([pc.field(column) == v for v in values])
    return pc.field(column).isin(values)


def _any_of(terms: list[pc.Expression]) -> pc.Expression:
    out = terms[0]
    for term in terms[1:]:
        out = out | term
    return out


def _dimension(ctx: JobContext, table: Table, natural: str, values: pa.Array, columns: list[str]) -> pa.Table:
    if len(values) == 0:
        return table.arrow_schema().empty_table().select(columns)
    return ctx.lake.read_if_exists(table, columns, pc.field(natural).isin(values))


def _stored(ctx: JobContext, symbols: pa.Array, rows: pa.Table) -> pa.Table:
    """The whole symbols' rows in the table (the rows of the other symbols are only added to or replaced)."""
    if len(symbols) == 0 or not ctx.lake.exists(TABLE):
        return rows.schema.empty_table()
    return ctx.lake.read_where(TABLE, pc.field("symbol").isin(symbols.cast(pa.string())))
