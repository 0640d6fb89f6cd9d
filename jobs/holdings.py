"""FactHoldings (step T3, after DimTrade): one row per change of a customer's holding.

Implements TPC-DI 1.1.0 clause 4.5 for FactHoldings, historical (Batch1 HoldingHistory.txt) and incremental
(HoldingHistory.txt with CDC_FLAG/CDC_DSN). Each HoldingHistory record says that trade HH_T_ID changed the holding
opened by trade HH_H_T_ID from HH_BEFORE_QTY to HH_AFTER_QTY:
- `tradeid` = HH_H_T_ID, `currenttradeid` = HH_T_ID (together the row's identity), `currentholding` = HH_AFTER_QTY;
- `sk_customerid`, `sk_accountid`, `sk_securityid`, `sk_companyid`, `currentprice` (its trade price): those of the
  current trade's DimTrade row; `sk_dateid`, `sk_timeid`: its close date and time (the holding changes when the
  trade completes);
- `batchid`: the TPC-DI batch of the HoldingHistory record.
Decisions where the spec is silent:
- a record delivered again replaces itself: of the records of one (HH_H_T_ID, HH_T_ID) the latest in declared
  order (TPC-DI batch, then CDC_DSN, then the values) makes the row;
- a record whose current trade has no DimTrade row yet (it arrives in a later micro-batch, or is held), or whose
  trade has no close date, is not written; an Alert "Holding not loaded" (key `T_ID=<HH_T_ID> H_T_ID=<HH_H_T_ID>`)
  says why, and is deleted when the row loads (`jobs.messages.commit_alert_changes`).

Incrementality (recompute per touched key): a micro-batch recomputes the rows of every touched current trade --
one with a HoldingHistory record staged by this micro-batch, or whose DimTrade row this micro-batch changed (the
change feed of T3's DimTrade commit) -- from all their staged records, upserts them and deletes the trade's rows
that no longer exist, so the rows do not depend on the cut into micro-batches. Computed in the driver on Arrow
data (pure `holding_records` and `holding_rows`; inputs read with delta-rs, only the touched trades' records).

Commits (app transactions `T3/factholdings`, `T3/dimessages/factholdings`): the rows, then the alerts.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.messages import alert_rows
from jobs.pieces import Alerts, Piece, recompute_in_pieces
from jobs.scope import BatchScope, record_columns
from schemas import sources as src
from schemas import warehouse as wh
from streamdi.context import JobContext
from streamdi.lake import within_range

log = logging.getLogger(__name__)

STEP = "T3"
SOURCE = "FactHoldings"
NOT_LOADED = "Holding not loaded"
TABLE = wh.FACT_HOLDINGS
RECORD_TABLES = (src.HOLDING_HISTORY.staging, src.HOLDING_HISTORY_CDC.staging)
# current trades recomputed at once (one HoldingHistory record each in a first load: SF 10 1,197,794 of as many
# trades): SF 10 in one piece, SF 100 (~12 M records) in four
TRADES_PER_PIECE = 3_000_000
FIELDS = ("hh_h_t_id", "hh_t_id", "hh_before_qty", "hh_after_qty")
TRADE_COLUMNS = (
    "tradeid",
    "sk_customerid",
    "sk_accountid",
    "sk_securityid",
    "sk_companyid",
    "tradeprice",
    "sk_closedateid",
    "sk_closetimeid",
)


# ------------------------------------------------------------------------------------------------ transforms
def holding_records(*staged: pa.Table) -> pa.Table:
    """The effective HoldingHistory record of every (HH_H_T_ID, HH_T_ID) in the staged tables (Batch1 and CDC rows
    alike): the latest in declared order (TPC-DI batch, CDC_DSN, then the values); columns `FIELDS` and
    `source_batch`."""
    parts = []
    for t in staged:
        dsn = t["cdc_dsn"] if "cdc_dsn" in t.column_names else pa.nulls(t.num_rows, pa.int64())
        parts.append(t.select([*FIELDS, "source_batch"]).append_column("cdc_dsn", dsn.cast(pa.int64())))
    records = pa.concat_tables(parts)
    order = ["hh_h_t_id", "hh_t_id", "source_batch", "cdc_dsn", "hh_before_qty", "hh_after_qty"]
    latest = ao.last_of_groups(ao.sort(records, order), ["hh_h_t_id", "hh_t_id"])
    return latest.select([*FIELDS, "source_batch"])


def holding_rows(records: pa.Table, trades: pa.Table) -> tuple[pa.Table, pa.Table]:
    """FactHoldings rows of `records` (`holding_records`) with the keys, price and close of each current trade's
    DimTrade row (`trades`: `TRADE_COLUMNS`), and the records that cannot be built yet (`hh_h_t_id, hh_t_id,
    source_batch, reason`)."""
    joined = records.join(
        trades.select(list(TRADE_COLUMNS)), keys="hh_t_id", right_keys="tradeid", join_type="left outer"
    )
    joined = ao.sort(joined, ["hh_t_id", "hh_h_t_id"])
    has_trade = pc.is_valid(joined["sk_accountid"])
    closed = pc.is_valid(joined["sk_closedateid"])
    ok = np.asarray(pc.and_(has_trade, closed), dtype=bool)
    good = joined.filter(pa.array(ok))
    rows = pa.table(
        {
            "tradeid": good["hh_h_t_id"],
            "currenttradeid": good["hh_t_id"],
            "sk_customerid": good["sk_customerid"],
            "sk_accountid": good["sk_accountid"],
            "sk_securityid": good["sk_securityid"],
            "sk_companyid": good["sk_companyid"],
            "currentprice": good["tradeprice"],
            "currentholding": good["hh_after_qty"],
            "sk_dateid": good["sk_closedateid"],
            "sk_timeid": good["sk_closetimeid"],
            "batchid": good["source_batch"],
        }
    ).cast(TABLE.arrow_schema())
    bad = joined.filter(pa.array(~ok))
    reason = pc.if_else(
        pc.is_valid(bad["sk_accountid"]),
        pa.scalar("its current trade has no close date", pa.large_string()),
        pa.scalar("its current trade has no DimTrade row", pa.large_string()),
    )
    missing = bad.select(["hh_h_t_id", "hh_t_id", "source_batch"]).append_column("reason", reason)
    return rows, missing


def not_loaded_alerts(missing: pa.Table) -> pa.Table:
    """One "Holding not loaded" Alert per HoldingHistory record that cannot be built."""
    current = missing["hh_t_id"].to_pylist()
    opened = missing["hh_h_t_id"].to_pylist()
    reasons = missing["reason"].to_pylist()
    return alert_rows(
        ao.column(missing, "source_batch"),
        source=SOURCE,
        text=NOT_LOADED,
        data=[f"HH_T_ID = {t}, HH_H_T_ID = {h}: {r}" for t, h, r in zip(current, opened, reasons, strict=True)],
        key=[f"T_ID={t} H_T_ID={h}" for t, h in zip(current, opened, strict=True)],
    )


# ------------------------------------------------------------------------------------------------ run
def touched_trades(ctx: JobContext, scope: BatchScope) -> pa.Array:
    """Current trades with a HoldingHistory record staged by this micro-batch, and trades whose DimTrade row this
    micro-batch changed."""
    return scope.touched(ctx, RECORD_TABLES, "hh_t_id", wh.DIM_TRADE, "tradeid")


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the rows of the touched current trades, `TRADES_PER_PIECE` at a time (`jobs.pieces`: a first load
    of several pieces is never whole in memory); commit FactHoldings, then its alerts."""
    if not any(ctx.lake.exists(t) for t in RECORD_TABLES):
        return {}
    if scope.committed(ctx, STEP, TABLE) and scope.committed(ctx, STEP, wh.DI_MESSAGES, TABLE.name):
        return {}
    trades = touched_trades(ctx, scope)
    if len(trades) == 0:
        return {}

    def recompute(piece: pa.Array, compare: bool) -> Piece[pa.Table]:
        rows, missing = _recomputed(ctx, scope, piece)
        return Piece(rows, _rows_gone(ctx, piece, rows) if compare else None, missing)

    out, found = recompute_in_pieces(
        ctx, scope, STEP, TABLE, trades, TRADES_PER_PIECE, recompute, Alerts(SOURCE, (NOT_LOADED,), "T_ID", _alerts)
    )
    missing = sum(f.num_rows for f in found)
    log.info(
        "T3 micro-batch %s: factholdings: %s rows written, %s not loaded", scope.batch_id, out.get(TABLE.name), missing
    )
    return out


def _alerts(found: list[pa.Table]) -> pa.Table:
    return not_loaded_alerts(pa.concat_tables(found))


def _recomputed(ctx: JobContext, scope: BatchScope, trades: pa.Array) -> tuple[pa.Table, pa.Table]:
    """`holding_rows` of every staged record of the current trades `trades` (ascending), read by their range."""
    wanted = pc.field("hh_t_id").isin(trades) & within_range("hh_t_id", trades)
    read = (*FIELDS, "source_batch", "cdc_dsn")
    staged = [scope.staged_where(ctx, t, wanted, record_columns(t, read)) for t in RECORD_TABLES if ctx.lake.exists(t)]
    records = holding_records(*staged)
    current = records["hh_t_id"].combine_chunks()
    dim = pa.table({c: pa.array([], wh.DIM_TRADE.arrow_schema().field(c).type) for c in TRADE_COLUMNS})
    if ctx.lake.exists(wh.DIM_TRADE) and len(current):
        named = pc.field("tradeid").isin(current) & within_range("tradeid", current)
        dim = ctx.lake.read_where(wh.DIM_TRADE, named, list(TRADE_COLUMNS))
    return holding_rows(records, dim)


def _rows_gone(ctx: JobContext, trades: pa.Array, rows: pa.Table) -> pa.Table:
    """Keys of the touched trades' rows in the table that the recomputation no longer gives."""
    if not ctx.lake.exists(TABLE):
        return rows.select(list(TABLE.key)).schema.empty_table()
    named = pc.field("currenttradeid").isin(trades) & within_range("currenttradeid", trades)
    existing = ctx.lake.read_where(TABLE, named, list(TABLE.key))
    return existing.join(rows.select(list(TABLE.key)), keys=list(TABLE.key), join_type="left anti")
