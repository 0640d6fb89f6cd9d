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

Everything is read with delta-rs into Arrow tables (no Spark). Only the records of candidate trades are read once
earlier micro-batches staged trades: the candidates (trades with a record in this micro-batch, held ones, ones
naming a changed account or symbol) and their records, filtered on the trade ids (`candidate_ids`,
`candidate_tables`), with only the DimAccount and DimSecurity versions their records name (`versions_named`), so
a small micro-batch reads no staged trade or dimension row it does not need. Above `DRIVER_CANDIDATES` candidate
trades every staged record is read and the candidates are selected from them (`jobs.trades.candidate_records`).
More candidates than `TRADES_PER_PIECE` (a historical load) are read and recomputed in pieces by trade id
(`candidate_pieces`), which bounds the memory of the step by the piece.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from jobs.scope import BatchScope
from jobs.trades import candidate_records, trade_records
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import TRADE_HOLDS
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import within_range

# the staged trade tables: Batch1 Trade.txt, TradeHistory.txt, incremental Trade.txt (the order `trade_records` takes)
SOURCES = (src.TRADE.staging, src.TRADE_HISTORY.staging, src.TRADE_CDC.staging)
# the staged trade tables and the column that holds the trade id in each
TRADE_ID = {
    src.TRADE.staging.name: "t_id",
    src.TRADE_HISTORY.staging.name: "th_t_id",
    src.TRADE_CDC.staging.name: "t_id",
}
# Above this many candidate trades every staged record is read and the candidates selected from them
# (`candidate_records`) instead of read by id (`candidate_tables`), e.g. when a reference change gives every
# account a new version.
DRIVER_CANDIDATES = 100_000
# Above this many candidate trades T3 reads and recomputes them a piece of this many trades at a time: SF 10's
# Batch1 (1.27 M trades, 4.5 M records) in six pieces instead of all at once.
TRADES_PER_PIECE = 250_000


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


def versions_named(ctx: JobContext, dim: Table, key: str, records: list[pa.Table], column: str) -> pa.Table:
    """The versions of `dim` (DimAccount, DimSecurity) whose natural key `key` some record names in `column`,
    read with delta-rs: a trade's keys come from its latest Trade record, one of its records, so these are all
    the versions `jobs.trades.build_trades` can pick for the candidate trades (and no whole dimension is read)."""
    named = [t[column] for t in records if column in t.column_names]
    values = pc.unique(pa.chunked_array([c for col in named for c in col.chunks], named[0].type))
    return ctx.lake.read_if_exists(dim, condition=pc.field(key).isin(values))


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


@dataclass(frozen=True)
class Candidates:
    """What T3 reads in a micro-batch to recompute its touched trades."""

    records: pa.Table  # the staged records read (this micro-batch's among them: its alerts come from them)
    candidates: pa.Table  # every record of the candidate trades (a superset of the touched ones)
    securities: pa.Table  # the DimSecurity versions the candidates can take their keys from
    accounts: pa.Table  # the DimAccount versions likewise
    changed_accounts: pa.Array | None  # `accountid` of the accounts this micro-batch changed in DimAccount
    changed_symbols: pa.Array | None  # `symbol` of the symbols this micro-batch changed in DimSecurity


def candidate_pieces(ctx: JobContext, scope: BatchScope, held_before: pa.Table) -> Iterator[Candidates]:
    """The records of the trades micro-batch `scope` may recompute, and the dimension versions they need, in
    pieces of at most `TRADES_PER_PIECE` trades in ascending trade id order (one piece, most often).

    `held_before` is the holds table's rows in state `held` before this micro-batch (expired holds already
    rejected). Only the candidate trades' records are read when earlier micro-batches staged trades (else every
    record is a candidate), unless there are more than `DRIVER_CANDIDATES`. A trade's row depends on its own
    records only, so the pieces give the rows one piece would; more candidate trades than `TRADES_PER_PIECE`
    (a historical load) are read and recomputed a piece at a time, each piece's records read by trade id range,
    so the records held in memory are bounded by the piece, not by the load."""
    keys = (
        changed_keys(ctx, scope, wh.DIM_ACCOUNT, "accountid"),
        changed_keys(ctx, scope, wh.DIM_SECURITY, "symbol"),
    )
    held = held_before["tradeid"].combine_chunks()
    ids = candidate_ids(ctx, scope, SOURCES, held, *keys) if scope.staged_before(ctx, SOURCES) else None
    if ids is not None and len(ids) <= DRIVER_CANDIDATES:
        found = candidate_tables(ctx, scope, SOURCES, ids)
        records = trade_records(*found)
        securities = versions_named(ctx, wh.DIM_SECURITY, "symbol", found, "t_s_symb")
        accounts = versions_named(ctx, wh.DIM_ACCOUNT, "accountid", found, "t_ca_id")
        yield Candidates(records, records, securities, accounts, *keys)
        return
    securities, accounts = ctx.lake.read_if_exists(wh.DIM_SECURITY), ctx.lake.read_if_exists(wh.DIM_ACCOUNT)
    wanted = _staged_ids(ctx, scope) if ids is None else ids
    if len(wanted) <= TRADES_PER_PIECE:
        records = trade_records(*[scope.staged_where(ctx, t, pc.scalar(True)) for t in SOURCES])
        candidates = records if ids is None else candidate_records(records, scope.batch_id, held, *keys)
        yield Candidates(records, candidates, securities, accounts, *keys)
        return
    wanted = pc.take(wanted, pc.array_sort_indices(wanted))
    for start in range(0, len(wanted), TRADES_PER_PIECE):
        # every record of the piece's trades: this micro-batch's among them (they are candidates by definition)
        records = trade_records(*candidate_tables(ctx, scope, SOURCES, wanted[start : start + TRADES_PER_PIECE]))
        yield Candidates(records, records, securities, accounts, *keys)


def _staged_ids(ctx: JobContext, scope: BatchScope) -> pa.Array:
    """Every trade id with a staged record up to this micro-batch (distinct)."""
    columns = [
        scope.staged_where(ctx, t, pc.scalar(True), [TRADE_ID[t.name]])[TRADE_ID[t.name]].cast(pa.int64())
        for t in SOURCES
    ]
    return pc.unique(pa.chunked_array([c for column in columns for c in column.chunks], pa.int64()))
