"""The reads of step T3 (CreateTrades): which trades to recompute, their staged records, the holds, and the
DimAccount/DimSecurity versions they name.

Everything of T3 that reads the lake is here; DimTrade's rules are pure (`jobs.trades`) and the step that
commits is `jobs.create_trades`.

Incrementality (recompute per touched key, see `jobs.scd2`): a micro-batch recomputes, from every record staged
so far, each trade that (a) has a record in this micro-batch, (b) is held, or (c) trades on an account or a
security whose dimension rows changed in this micro-batch (read from the Delta change feed of the micro-batch's
commits to DimAccount/DimSecurity: a new or re-cut account version that starts on or before a trade's creation
day can change its keys). Rows are upserted; the MERGE leaves equal rows alone. The result equals a load of
everything at once whatever the split.

Only the records of candidate trades are aggregated once earlier micro-batches staged trades: the candidates
(trades with a record in this micro-batch, held ones, ones naming a changed account or symbol) and their
records are read with delta-rs, filtered on the trade ids, and handed to Spark as Arrow (`candidate_ids`,
`candidate_tables`), with only the DimAccount and DimSecurity versions their records name
(`versions_named`), so a small micro-batch runs no Spark job over every staged trade or a whole dimension. Above
`DRIVER_CANDIDATES` candidate trades Spark selects them instead (`jobs.trades.candidate_records`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.scope import BatchScope
from jobs.trades import candidate_records, trade_records
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import HELD, TRADE_HOLDS
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import within_range
from streamdi.spark import arrow_frame

# the staged trade tables: Batch1 Trade.txt, TradeHistory.txt, incremental Trade.txt (the order `trade_records` takes)
SOURCES = (src.TRADE.staging, src.TRADE_HISTORY.staging, src.TRADE_CDC.staging)
# the staged trade tables and the column that holds the trade id in each
TRADE_ID = {
    src.TRADE.staging.name: "t_id",
    src.TRADE_HISTORY.staging.name: "th_t_id",
    src.TRADE_CDC.staging.name: "t_id",
}
# Above this many candidate trades the records are selected in Spark (`candidate_records`) instead of read into
# the driver (`candidate_tables`), e.g. when a reference change gives every account a new version.
DRIVER_CANDIDATES = 100_000


def candidate_ids(
    ctx: JobContext,
    scope: BatchScope,
    tables: tuple[Table, ...],
    held: pa.Array,
    changed_accounts: pa.Array | None,
    changed_symbols: pa.Array | None,
) -> pa.Array:
    """The trade ids `candidate_records` selects, read with delta-rs (no Spark job): trades with a record in this
    micro-batch, the held ones (`held`), and those with a record naming a changed account or symbol."""
    parts = [held.cast(pa.int64())]
    for table in tables:
        cond = pc.field("batch_id") == scope.batch_id
        if changed_accounts is not None and "t_ca_id" in table.column_names:
            cond = cond | pc.field("t_ca_id").isin(changed_accounts.cast(pa.int64()))
        if changed_symbols is not None and "t_s_symb" in table.column_names:
            cond = cond | pc.field("t_s_symb").isin(changed_symbols.cast(pa.string()))
        column = TRADE_ID[table.name]
        parts.append(scope.staged_where(ctx, table, cond, [column])[column].combine_chunks())
    return pc.unique(pa.concat_arrays(parts))


def candidate_tables(ctx: JobContext, scope: BatchScope, tables: tuple[Table, ...], ids: pa.Array) -> list[pa.Table]:
    """Every staged record (up to this micro-batch) of the trades `ids`, per table, read with delta-rs: the same
    rows `candidate_records` keeps, without scanning every staged trade in Spark."""
    found = []
    for table in tables:
        column = TRADE_ID[table.name]
        wanted = pc.field(column).isin(ids)
        if len(ids):  # the id range lets the read skip the row groups of other trades
            wanted = wanted & within_range(column, ids)
        found.append(scope.staged_where(ctx, table, wanted))
    return found


def versions_named(ctx: JobContext, dim: Table, key: str, records: list[pa.Table], column: str) -> DataFrame:
    """The versions of `dim` (DimAccount, DimSecurity) whose natural key `key` some record names in `column`,
    read with delta-rs: a trade's keys come from its latest Trade record, one of its records, so these are all
    the versions `assign_trade_keys` can pick for the candidate trades (and Spark scans no whole dimension)."""
    if not ctx.lake.exists(dim):
        return ctx.lake.empty(dim)
    named = [t[column] for t in records if column in t.column_names]
    values = pc.unique(pa.chunked_array([c for col in named for c in col.chunks], named[0].type))
    return ctx.lake.to_frame(dim, ctx.lake.read_where(dim, pc.field(key).isin(values)))


def read(ctx: JobContext, table: Table, *, scope: BatchScope | None = None) -> DataFrame:
    """A warehouse table (or, with `scope`, a staging table's rows up to this micro-batch); empty if absent."""
    if not ctx.lake.exists(table):
        return ctx.lake.empty(table)
    return scope.staged(ctx, table, upto=True) if scope else ctx.lake.read(table)


def read_holds(ctx: JobContext) -> pa.Table:
    if not ctx.lake.exists(TRADE_HOLDS):
        return TRADE_HOLDS.arrow_schema().empty_table()
    return ctx.lake.read_arrow(TRADE_HOLDS).cast(TRADE_HOLDS.arrow_schema())


def changed_keys(ctx: JobContext, scope: BatchScope, table: Table, column: str) -> pa.Array | None:
    """Distinct `column` values of the rows this micro-batch's commits changed in `table`, from the table's
    change feed; None when nothing changed."""
    rows = scope.changed(ctx, table, [column])
    if rows is None:
        return None
    keys = pc.unique(rows[column].combine_chunks())
    return keys if len(keys) else None


def key_frame(ctx: JobContext, keys: pa.Array | None, alias: str) -> DataFrame | None:
    return None if keys is None else arrow_frame(ctx.spark, pa.table({alias: keys}))


@dataclass(frozen=True)
class Candidates:
    """What T3 reads in a micro-batch to recompute its touched trades."""

    records: DataFrame  # the staged records read (this micro-batch's among them: its alerts come from them)
    candidates: DataFrame  # every record of the candidate trades (a superset of the touched ones)
    securities: DataFrame  # the DimSecurity versions the candidates can take their keys from
    accounts: DataFrame  # the DimAccount versions likewise
    changed_accounts: DataFrame | None  # `t_ca_id` of the accounts this micro-batch changed in DimAccount
    changed_symbols: DataFrame | None  # `t_s_symb` of the symbols this micro-batch changed in DimSecurity


def read_candidates(ctx: JobContext, scope: BatchScope, holds: DataFrame, held_before: pa.Table) -> Candidates:
    """The records of the trades micro-batch `scope` may recompute, and the dimension versions they need.

    `holds` is the holds table before this micro-batch (expired holds already rejected), `held_before` its rows
    in state `held`. Only the candidate trades' records are aggregated when earlier micro-batches staged trades
    (else every record is a candidate). Few candidates: their records are read with delta-rs, so no Spark job
    scans every staged trade; many: Spark selects them."""
    keys = (
        changed_keys(ctx, scope, wh.DIM_ACCOUNT, "accountid"),
        changed_keys(ctx, scope, wh.DIM_SECURITY, "symbol"),
    )
    changed = (key_frame(ctx, keys[0], "t_ca_id"), key_frame(ctx, keys[1], "t_s_symb"))
    ids = None
    if scope.staged_before(ctx, SOURCES):
        ids = candidate_ids(ctx, scope, SOURCES, held_before["tradeid"].combine_chunks(), *keys)
    if ids is not None and len(ids) <= DRIVER_CANDIDATES:
        found = candidate_tables(ctx, scope, SOURCES, ids)
        records = trade_records(*[ctx.lake.to_frame(t, rows) for t, rows in zip(SOURCES, found, strict=True)])
        candidates = records
        securities = versions_named(ctx, wh.DIM_SECURITY, "symbol", found, "t_s_symb")
        accounts = versions_named(ctx, wh.DIM_ACCOUNT, "accountid", found, "t_ca_id")
    else:
        records = trade_records(*[read(ctx, t, scope=scope) for t in SOURCES])
        held = holds.where(F.col("state") == HELD)
        candidates = records if ids is None else candidate_records(records, scope.batch_id, held, *changed)
        securities, accounts = read(ctx, wh.DIM_SECURITY), read(ctx, wh.DIM_ACCOUNT)
    return Candidates(records, candidates, securities, accounts, *changed)
