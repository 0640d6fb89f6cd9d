"""T3 (CreateTrades): the step that recomputes the touched trades of a micro-batch and commits DimTrade, the trade
alerts and the holds.

DimTrade's rules (records, states, keys, holds, alerts) are pure transforms in `jobs.trades`; the reads (which
trades are candidates, their records, the dimension versions they name, the holds) are in
`jobs.trade_candidates`. This module puts them together: it expires the holds of ended TPC-DI batches, builds
the touched trades, and commits. FactHoldings and FactCashBalances follow in the same step
(`jobs.transform.trades_and_holdings`).

Commits (app transactions `T3/<table>`, version = micro-batch, each skipped when already recorded): DimTrade,
then DImessages, then the holds table -- always, even when empty. The holds are an input of the recomputation,
so they go last: a crash before their commit recomputes exactly the same result on rerun, and their recorded
transaction marks T3 done for the micro-batch.

All of it runs on Arrow tables in the driver, read with delta-rs: no Spark job.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from jobs.messages import ALERT_COLUMNS, commit_messages
from jobs.scope import BatchScope
from jobs.trade_candidates import SOURCES, candidate_pieces, read_holds
from jobs.trades import (
    build_trades,
    expired_holds,
    next_holds,
    rejection_alerts,
    touched_trades,
    trade_alerts,
    trade_states,
)
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import HELD, REJECTED, TRADE_HOLDS
from streamdi.context import JobContext

log = logging.getLogger(__name__)

STEP = "T3"


def _anything_to_do(ctx: JobContext, scope: BatchScope) -> bool:
    """False when no trade can change: no trade file in the micro-batch, no held trade, and neither DimAccount
    nor DimSecurity committed in it (checked on the commit log, without Spark)."""
    if scope.carries(src.TRADE.name, src.TRADE_HISTORY.name, src.TRADE_CDC.name):
        return True
    holds = read_holds(ctx)
    if pc.any(pc.equal(holds["state"], HELD)).as_py():
        return True
    for step, table in (("T2", wh.DIM_ACCOUNT), ("T1", wh.DIM_SECURITY)):
        if any(
            c.txn_version == scope.batch_id and c.app_id == scope.app_id(step, table)
            for c in scope.recent_history(ctx, table)
        ):
            return True
    return False


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the touched trades of this micro-batch; commit DimTrade, then DImessages, then the holds."""
    if not any(ctx.lake.exists(t) for t in SOURCES):
        return {}
    if scope.committed(ctx, STEP, TRADE_HOLDS):  # the last of T3's commits: this micro-batch is done
        return {}
    if not _anything_to_do(ctx, scope):
        return {}
    done = {t.name: scope.committed(ctx, STEP, t) for t in (wh.DIM_TRADE, wh.DI_MESSAGES)}
    current = max(scope.source_batches) if scope.source_batches else None
    holds = read_holds(ctx)
    # holds of TPC-DI batches that have ended are rejected before anything of this batch is looked at
    expired = expired_holds(holds, current)
    if expired.num_rows:
        gone = pc.is_in(holds["tradeid"], value_set=expired["tradeid"])
        holds = pa.concat_tables([holds.filter(pc.invert(gone)), expired])
    held_before = holds.filter(pc.equal(holds["state"], HELD))

    trade_types = ctx.lake.read_if_exists(wh.TRADE_TYPE)
    status_types = ctx.lake.read_if_exists(wh.STATUS_TYPE)
    resolved_parts, unresolved_parts, alert_parts = [], [], []
    # A first load of several pieces writes each piece's DimTrade rows as a file of its own as it goes (the pieces
    # ascend by trade id, so the files are in the declared order too) and commits them at once: DimTrade is never
    # whole in memory. Whether there is a second piece is known when it comes.
    first_load = not done[wh.DIM_TRADE.name] and ctx.lake.is_empty(wh.DIM_TRADE)
    app_id = scope.app_id(STEP, wh.DIM_TRADE)
    in_files = None
    for position, piece in enumerate(candidate_pieces(ctx, scope, held_before)):  # one piece but in big loads
        changed = (piece.changed_accounts, piece.changed_symbols)
        states = touched_trades(trade_states(piece.candidates, trade_types), scope.batch_id, holds, *changed)
        built = build_trades(states, piece.securities, piece.accounts, status_types, trade_types)
        records = piece.records
        alert_parts.append(trade_alerts(records.filter(pc.equal(records["batch_id"], scope.batch_id))))
        complete = pc.is_null(built["_reason"])
        resolved_parts.append(ctx.lake.to_arrow(wh.DIM_TRADE, built.filter(complete)))
        if first_load and position == 1:
            in_files = ctx.lake.pieces(wh.DIM_TRADE, app_id=app_id, version=scope.batch_id)
        if in_files is not None:
            for part in resolved_parts:
                in_files.add(part)
            resolved_parts.clear()
        unresolved_parts.append(
            built.filter(pc.invert(complete))
            .select(["tradeid", "_source_batch", "_reason"])
            .rename_columns(["tradeid", "source_batch", "reason"])
        )
    alerts = pa.concat_tables(alert_parts)
    unresolved = pa.concat_tables(unresolved_parts)
    new_holds = next_holds(unresolved, held_before, scope.batch_id, current)
    rows: dict[str, int] = {}
    if in_files is not None:  # nothing to delete in an empty table
        rows[wh.DIM_TRADE.name] = in_files.commit().rows
    elif not done[wh.DIM_TRADE.name]:
        resolved = pa.concat_tables(resolved_parts)
        gone = new_holds.select(["tradeid"])  # a held trade must not stay in DimTrade with old keys
        if resolved.num_rows or gone.num_rows:
            ctx.lake.upsert(wh.DIM_TRADE, resolved, app_id=app_id, version=scope.batch_id, deletes=gone)
        rows[wh.DIM_TRADE.name] = resolved.num_rows

    messages = alerts.select(ALERT_COLUMNS.names).cast(ALERT_COLUMNS)
    newly_rejected = pa.concat_tables([expired, new_holds.filter(pc.equal(new_holds["state"], REJECTED))])
    if newly_rejected.num_rows:
        messages = pa.concat_tables([messages, rejection_alerts(newly_rejected)])
    rows[wh.DI_MESSAGES.name] = commit_messages(ctx, scope, STEP, messages)

    still = set(new_holds["tradeid"].to_pylist())
    released = sorted(t for t in held_before["tradeid"].to_pylist() if t not in still)
    # committed even when empty: the holds commit is T3's last, so its app transaction marks T3 done
    ctx.lake.upsert(
        TRADE_HOLDS,
        pa.concat_tables([new_holds, expired]),
        app_id=scope.app_id(STEP, TRADE_HOLDS),
        version=scope.batch_id,
        deletes=pa.table({"tradeid": pa.array(released, pa.int64())}),
    )
    rows[TRADE_HOLDS.name] = new_holds.num_rows
    log.info("T3 micro-batch %s: %s", scope.batch_id, rows)
    return rows
