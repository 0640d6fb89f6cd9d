"""DimTrade (part of step T3, CreateTrades): one row per trade, with held trades and the trade alerts.

Pure transforms: Spark DataFrames in and out for the trades, Arrow tables in and out for the holds. Nothing
here reads or writes the lake: the candidate trades and the dimension versions they name are read by
`jobs.trade_candidates`, and the T3 step (`jobs.create_trades`) commits.

Implements TPC-DI 1.1.0 clause 4.5.8 (DimTrade from Batch1 Trade.txt + TradeHistory.txt), the incremental
DimTrade rules (Trade.txt with CDC_FLAG/CDC_DSN) and the DimTrade alerts of DImessages (3.2.18):

- a trade's records are its Batch1 Trade.txt row (its last state), its TradeHistory.txt rows (one per status
  change, status only) and its incremental lines (one per status change, CDC_FLAG I new, U update). Declared
  order: TPC-DI batch, then CDC_DSN (incremental), then the timestamp (TradeHistory has no other order), then
  TradeHistory before Trade.txt, then the line number;
- **create** date/time: the first record whose status is PNDG, or SBMT for a market order (TradeType
  `tt_is_mrkt` = 1, i.e. TMB/TMS), or which is a CDC `I` line; **close** date/time: the last record whose
  status is CMPT or CNCL. `sk_*dateid` = `yyyymmdd`, `sk_*timeid` = `hhmmss` of that timestamp (truncated to the
  second), which is how DimDate/DimTime ids are defined in the official and in the generated Date.txt/Time.txt;
  they are derived, not looked up, so DimTrade does not wait for DimDate;
- status, type, cashflag, quantity, bid price, executed by, trade price, fee (T_CHRG), commission, tax, and the
  symbol and account used for the keys: from the trade's latest record that carries them (Trade.txt row or CDC
  line); names from the warehouse `statustype`/`tradetype`;
- **keys fixed when the trade is first seen**: sk_securityid/sk_companyid from the DimSecurity version (by
  symbol) and sk_accountid/sk_customerid/sk_brokerid from the DimAccount version (by account id) valid on the
  creation day (`jobs.scd2.valid_at`). The spec asks for the version current when the trade is first
  encountered; with whole batches that is the one valid on the creation day, and the day rule does not depend
  on how a batch is cut into micro-batches. Later versions never move a trade's keys;
- `batchid`: the TPC-DI batch of the trade's latest record (the brief's rule; a trade created in Batch1 and
  completed in Batch2 has batchid 2);
- alerts, one per offending source record (Trade.txt row or CDC line; TradeHistory carries no amounts):
  "Invalid trade commission" when T_COMM is not NULL and T_COMM > T_TRADE_PRICE * T_QTY, "Invalid trade fee"
  likewise for T_CHRG (both are only set on completed trades). Message data `T_ID = 1, T_COMM = 12.00`
  (`T_CHRG` for fees); message key `commission T_ID=1` in Batch1, `commission T_ID=1 CDC_DSN=7` for CDC lines
  (split-invariant identities: no file names or line numbers). They are raised when the record is staged,
  whether or not its trade can be built yet.

Held trades (`schemas.holds.TRADE_HOLDS`): a touched trade that cannot be built -- no DimAccount/DimSecurity
version on its creation day, no creation record yet (an incremental U line ahead of its I line), no Trade
record yet (TradeHistory ahead of Trade.txt), unknown status/type code -- is not written (and is removed from
DimTrade if it was there) but held, with `first_batch` = this micro-batch, its TPC-DI batch (`source_batch`, the
batch of its latest record) and the reason. It is retried in every later micro-batch of its TPC-DI batch; when it
resolves its hold row is deleted. A hold expires with its TPC-DI batch: the first micro-batch of a later TPC-DI
batch rejects every trade still held from an earlier one, before anything of the new batch is applied -- the
hold row turns `rejected` and an Alert "Trade rejected" gives the reason -- and a trade that becomes unresolvable
after its batch ended (say, a later batch recomputes its account) is rejected at once. The expiry is a property
of the data: a whole batch and the same batch cut into any number of micro-batches reject the same trades (a
count of micro-batches, as this step once used, made a fine drip reject trades that a whole load kept). The
last TPC-DI batch loaded has no later one, so its unresolved trades stay held. Decision (spec silent): rejection
is final -- a rejected trade is not retried, even if the missing part arrives later, so a published rejection is
never silently undone; the trade stays in the holds table with its reason.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.messages import ALERT, ALERT_COLUMNS, alerts
from jobs.scd2 import valid_at
from schemas.holds import HELD, REJECTED, TRADE_HOLDS

SOURCE = "DimTrade"
CLOSE_STATUSES = ("CMPT", "CNCL")
# the declared order of a trade's records (see the module docstring)
ORDER = ("source_batch", "_seq", "_ts", "_kind", "line_no")
HISTORY, TRADE = 0, 1
# fields of a Trade record (Trade.txt row or CDC line) that DimTrade takes from the latest one
VALUES = (
    "t_st_id",
    "t_tt_id",
    "t_is_cash",
    "t_s_symb",
    "t_qty",
    "t_bid_price",
    "t_ca_id",
    "t_exec_name",
    "t_trade_price",
    "t_chrg",
    "t_comm",
    "t_tax",
)
REJECT_TEXT = "Trade rejected"


# ----------------------------------------------------------------------------------------------- records
def trade_records(trade: DataFrame, history: DataFrame, cdc: DataFrame) -> DataFrame:
    """Every staged record of the trades as one stream.

    Columns: `tradeid`, `status`, `cdc_flag` (NULL in Batch1), `_values` (the record carries the Trade
    fields), the Trade fields `VALUES` (NULL on TradeHistory rows), the order columns `ORDER` (`_seq` = CDC_DSN,
    0 in Batch1; `_kind` 0 TradeHistory, 1 Trade) and `batch_id` (micro-batch).
    """
    common = ["batch_id", "source_batch", "line_no"]
    batch1 = trade.select(
        F.col("t_id").alias("tradeid"),
        F.col("t_dts").alias("_ts"),
        F.col("t_st_id").alias("status"),
        F.lit(None).cast("string").alias("cdc_flag"),
        F.lit(True).alias("_values"),
        *VALUES,
        F.lit(0).cast("bigint").alias("_seq"),
        F.lit(TRADE).alias("_kind"),
        *common,
    )
    hist = history.select(
        F.col("th_t_id").alias("tradeid"),
        F.col("th_dts").alias("_ts"),
        F.col("th_st_id").alias("status"),
        F.lit(None).cast("string").alias("cdc_flag"),
        F.lit(False).alias("_values"),
        *[F.lit(None).cast(trade.schema[v].dataType).alias(v) for v in VALUES],
        F.lit(0).cast("bigint").alias("_seq"),
        F.lit(HISTORY).alias("_kind"),
        *common,
    )
    incr = cdc.select(
        F.col("t_id").alias("tradeid"),
        F.col("t_dts").alias("_ts"),
        F.col("t_st_id").alias("status"),
        F.col("cdc_flag"),
        F.lit(True).alias("_values"),
        *VALUES,
        F.col("cdc_dsn").alias("_seq"),
        F.lit(TRADE).alias("_kind"),
        *common,
    )
    return batch1.unionByName(hist).unionByName(incr)


def _ordered(*fields: str) -> Column:
    """A struct that sorts like the declared order and carries `fields` (for min/max over records)."""
    return F.struct(*[F.col(c) for c in ORDER], *[F.col(f) for f in fields])


def trade_states(records: DataFrame, trade_types: DataFrame) -> DataFrame:
    """One row per trade: the latest Trade fields, `batchid` (their TPC-DI batch), `create_ts`, `close_ts`, and
    `_micro` (the last micro-batch that staged a record of the trade), `_seen` (the last TPC-DI batch of any of
    its records).

    `trade_types` is the warehouse `tradetype` table (`tt_is_mrkt` tells market orders, whose SBMT creates
    them). A trade without any Trade record has NULL fields; one without a creation record a NULL `create_ts`.
    """
    status = F.col("status")
    states = records.groupBy("tradeid").agg(
        F.max("batch_id").alias("_micro"),
        F.max("source_batch").alias("_seen"),
        F.max(F.when(F.col("_values"), _ordered(*VALUES))).alias("_last"),
        F.min(F.when(status == "PNDG", _ordered())).alias("_pndg"),
        F.min(F.when(status == "SBMT", _ordered())).alias("_sbmt"),
        F.min(F.when(F.col("cdc_flag") == "I", _ordered())).alias("_insert"),
        F.max(F.when(status.isin(*CLOSE_STATUSES), _ordered())).alias("_close"),
    )
    market = trade_types.select(F.col("tt_id").alias("_tt"), (F.col("tt_is_mrkt") == 1).alias("_market"))
    states = states.join(F.broadcast(market), F.col("_last")["t_tt_id"] == F.col("_tt"), "left")
    # least() skips NULLs: the earliest of the records that can create the trade
    create = F.least(F.col("_pndg"), F.col("_insert"), F.when(F.col("_market"), F.col("_sbmt")))
    return states.select(
        "tradeid",
        "_micro",
        "_seen",
        *[F.col("_last")[v].alias(v) for v in VALUES],
        F.col("_last")["source_batch"].alias("batchid"),
        create["_ts"].alias("create_ts"),
        F.col("_close")["_ts"].alias("close_ts"),
    )


# ------------------------------------------------------------------------------------------------- rows
def date_id(ts: Column) -> Column:
    """DimDate's SK_DateID of a timestamp: yyyymmdd."""
    return F.date_format(ts, "yyyyMMdd").cast("int")


def time_id(ts: Column) -> Column:
    """DimTime's SK_TimeID of a timestamp, truncated to the second: hhmmss."""
    return F.date_format(ts, "HHmmss").cast("int")


def assign_trade_keys(states: DataFrame, securities: DataFrame, accounts: DataFrame) -> DataFrame:
    """Add the security/company and account/customer/broker keys of the versions valid on the creation day."""
    day = F.to_date(F.col("create_ts"))
    keyed = valid_at(
        states,
        "t_s_symb",
        day,
        securities,
        "symbol",
        {"sk_securityid": "sk_securityid", "sk_companyid": "sk_companyid"},
    )
    take = {"sk_accountid": "sk_accountid", "sk_customerid": "sk_customerid", "sk_brokerid": "sk_brokerid"}
    return valid_at(keyed, "t_ca_id", day, accounts, "accountid", take)


def hold_reason(row_cols: dict[str, Column]) -> Column:
    """Why a trade cannot be built yet ('; '-joined), or NULL when it can."""
    c = row_cols
    day = F.date_format(F.to_date(c["create_ts"]), "yyyy-MM-dd")
    have = c["t_tt_id"].isNotNull() & c["create_ts"].isNotNull()
    reasons = F.concat_ws(
        "; ",
        F.when(c["t_tt_id"].isNull(), F.lit("no Trade record yet")),
        F.when(c["t_tt_id"].isNotNull() & c["create_ts"].isNull(), F.lit("no creation record (PNDG, SBMT or I) yet")),
        F.when(
            have & c["sk_accountid"].isNull(),
            F.concat(F.lit("account "), c["t_ca_id"].cast("string"), F.lit(" has no DimAccount version on "), day),
        ),
        F.when(
            have & c["sk_securityid"].isNull(),
            F.concat(F.lit("security "), c["t_s_symb"], F.lit(" has no DimSecurity version on "), day),
        ),
        F.when(c["t_tt_id"].isNotNull() & c["status"].isNull(), F.concat(F.lit("unknown status "), c["t_st_id"])),
        F.when(c["t_tt_id"].isNotNull() & c["type"].isNull(), F.concat(F.lit("unknown trade type "), c["t_tt_id"])),
    )
    return F.when(reasons != "", reasons)


def build_trades(
    states: DataFrame, securities: DataFrame, accounts: DataFrame, status_types: DataFrame, trade_types: DataFrame
) -> DataFrame:
    """DimTrade rows of the trades in `states`, plus `_reason` (NULL when the row is complete; otherwise the
    row must be held) and `_source_batch` (TPC-DI batch of the latest Trade record, else of any record)."""
    keyed = assign_trade_keys(states, securities, accounts)
    st = status_types.select(F.col("st_id").alias("_st"), F.col("st_name").alias("status"))
    tt = trade_types.select(F.col("tt_id").alias("_tt"), F.col("tt_name").alias("type"))
    named = keyed.join(F.broadcast(st), F.col("t_st_id") == F.col("_st"), "left").join(
        F.broadcast(tt), F.col("t_tt_id") == F.col("_tt"), "left"
    )
    cols = {c: F.col(c) for c in named.columns}
    return named.select(
        F.col("tradeid"),
        F.col("sk_brokerid"),
        date_id(F.col("create_ts")).alias("sk_createdateid"),
        time_id(F.col("create_ts")).alias("sk_createtimeid"),
        date_id(F.col("close_ts")).alias("sk_closedateid"),
        time_id(F.col("close_ts")).alias("sk_closetimeid"),
        F.col("status"),
        F.col("type"),
        F.col("t_is_cash").alias("cashflag"),
        F.col("sk_securityid"),
        F.col("sk_companyid"),
        F.col("t_qty").alias("quantity"),
        F.col("t_bid_price").alias("bidprice"),
        F.col("sk_customerid"),
        F.col("sk_accountid"),
        F.col("t_exec_name").alias("executedby"),
        F.col("t_trade_price").alias("tradeprice"),
        F.col("t_chrg").alias("fee"),
        F.col("t_comm").alias("commission"),
        F.col("t_tax").alias("tax"),
        F.col("batchid"),
        hold_reason(cols).alias("_reason"),
        F.coalesce(F.col("batchid"), F.col("_seen")).alias("_source_batch"),
    )


# ----------------------------------------------------------------------------------------------- alerts
def trade_alerts(records: DataFrame) -> DataFrame:
    """The invalid commission and invalid fee alerts of the Trade records in `records` (one per record)."""
    rec = records.where(F.col("_values"))
    value = F.col("t_trade_price") * F.col("t_qty")
    ident = F.concat(
        F.lit("T_ID="),
        F.col("tradeid").cast("string"),
        F.when(F.col("cdc_flag").isNotNull(), F.concat(F.lit(" CDC_DSN="), F.col("_seq").cast("string"))).otherwise(
            F.lit("")
        ),
    )
    tid = F.concat(F.lit("T_ID = "), F.col("tradeid").cast("string"))
    commission = alerts(
        rec,
        source=SOURCE,
        text="Invalid trade commission",
        when=F.col("t_comm").isNotNull() & (F.col("t_comm") > value),
        data=F.concat(tid, F.lit(", T_COMM = "), F.col("t_comm").cast("string")),
        key=F.concat(F.lit("commission "), ident),
        batchid=F.col("source_batch"),
    )
    fee = alerts(
        rec,
        source=SOURCE,
        text="Invalid trade fee",
        when=F.col("t_chrg").isNotNull() & (F.col("t_chrg") > value),
        data=F.concat(tid, F.lit(", T_CHRG = "), F.col("t_chrg").cast("string")),
        key=F.concat(F.lit("fee "), ident),
        batchid=F.col("source_batch"),
    )
    return commission.unionByName(fee)


def rejection_alerts(rejected: pa.Table) -> pa.Table:
    """One "Trade rejected" Alert per rejected hold row (`tradeid`, `source_batch`, `reason`), in the columns of
    `alerts`."""
    rows = rejected.to_pylist()
    return pa.table(
        {
            "batchid": pa.array([r["source_batch"] for r in rows], pa.int32()),
            "messagesource": [SOURCE] * len(rows),
            "messagetext": [REJECT_TEXT] * len(rows),
            "messagetype": [ALERT] * len(rows),
            "messagedata": [
                f"T_ID = {r['tradeid']}, still unresolved at the end of TPC-DI batch {r['source_batch']}: {r['reason']}"
                for r in rows
            ],
            "messagekey": [f"rejected T_ID={r['tradeid']}" for r in rows],
        },
    ).cast(ALERT_COLUMNS)


# ------------------------------------------------------------------------------------------------ holds
def expired_holds(holds: pa.Table, current_batch: int | None) -> pa.Table:
    """The `held` rows of `holds` whose TPC-DI batch ended before `current_batch` (the TPC-DI batch being
    transformed), turned `rejected`; none when `current_batch` is None."""
    held = holds.filter(pc.equal(holds["state"], HELD))
    if current_batch is None or held.num_rows == 0:
        return held.slice(0, 0)
    ended = held.filter(pc.less(held["source_batch"], current_batch))
    state = pa.array([REJECTED] * ended.num_rows, holds.schema.field("state").type)
    return ended.set_column(ended.schema.get_field_index("state"), "state", state).cast(TRADE_HOLDS.arrow_schema())


def next_holds(unresolved: pa.Table, held_before: pa.Table, batch_id: int, current_batch: int | None) -> pa.Table:
    """The hold rows of the trades that are still unresolved in micro-batch `batch_id`.

    `unresolved` has `tradeid`, `source_batch`, `reason`; `held_before` the hold rows in state `held` before
    this micro-batch. A trade keeps the `first_batch` of its hold (this micro-batch when new); it is rejected when
    its TPC-DI batch (`source_batch`) ended before `current_batch`, the TPC-DI batch being transformed."""
    first = dict(zip(held_before["tradeid"].to_pylist(), held_before["first_batch"].to_pylist(), strict=True))
    trade_ids = unresolved["tradeid"].to_pylist()
    first_batch = [first.get(t, batch_id) for t in trade_ids]
    ended = [current_batch is not None and b < current_batch for b in unresolved["source_batch"].to_pylist()]
    return pa.table(
        {
            "tradeid": pa.array(trade_ids, pa.int64()),
            "first_batch": pa.array(first_batch, pa.int64()),
            "source_batch": unresolved["source_batch"],
            "reason": unresolved["reason"],
            "state": [REJECTED if e else HELD for e in ended],
        }
    ).cast(TRADE_HOLDS.arrow_schema())


# ----------------------------------------------------------------------------------------- which trades
def touched_trades(
    states: DataFrame,
    batch_id: int,
    holds: DataFrame,
    changed_accounts: DataFrame | None,
    changed_symbols: DataFrame | None,
) -> DataFrame:
    """The states of the trades to recompute in micro-batch `batch_id`: those with a record in it, the held
    ones, and those on the changed accounts/securities (one-column DataFrames `t_ca_id` / `t_s_symb`); never the
    rejected ones. `holds` is the holds table before this micro-batch."""
    flagged = states.join(F.broadcast(holds.select("tradeid", F.col("state").alias("_hold"))), "tradeid", "left")
    touched = (F.col("_micro") == batch_id) | (F.col("_hold") == HELD)
    for changed, column in ((changed_accounts, "t_ca_id"), (changed_symbols, "t_s_symb")):
        if changed is not None:
            marker = f"_changed_{column}"
            flagged = flagged.join(F.broadcast(changed.withColumn(marker, F.lit(True))), column, "left")
            touched = touched | F.col(marker).isNotNull()
    keep = touched & F.coalesce(F.col("_hold") != REJECTED, F.lit(True))
    return flagged.where(keep).select(*states.columns)


def candidate_records(
    records: DataFrame,
    batch_id: int,
    held: DataFrame,
    changed_accounts: DataFrame | None,
    changed_symbols: DataFrame | None,
) -> DataFrame:
    """All records of the trades `touched_trades` may keep, found before the per-trade aggregation so that a
    small micro-batch does not aggregate every trade ever staged: trades with a record in `batch_id`, held
    ones, and those with a record naming a changed account or symbol. A superset of the touched trades (a
    trade's latest account is one its records name), with every record of each, so their states are exact."""
    ids = records.where(F.col("batch_id") == batch_id).select("tradeid").unionByName(held.select("tradeid"))
    for changed, column in ((changed_accounts, "t_ca_id"), (changed_symbols, "t_s_symb")):
        if changed is not None:
            ids = ids.unionByName(records.join(F.broadcast(changed), column, "left_semi").select("tradeid"))
    return records.join(ids.distinct(), "tradeid", "left_semi")
