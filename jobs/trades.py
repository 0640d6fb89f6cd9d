"""DimTrade (part of step T3, CreateTrades): one row per trade, with held trades and the trade alerts.

Pure transforms on Arrow tables in the driver (numpy and Arrow compute; a micro-batch touches a few thousand
trades, and Spark's fixed cost of planning them was most of a small micro-batch's T3). Nothing here reads or
writes the lake: the candidate trades and the dimension versions they name are read by
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
  creation day (`valid_on`). The spec asks for the version current when the trade is first
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.arrow_ops import column, date_ids, lookup, sort
from jobs.messages import ALERT, ALERT_COLUMNS, alert_table
from jobs.valid_at import take as take_valid
from jobs.valid_at import valid_versions
from schemas import sources as src
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
STRING = pa.large_string()
NONE = -1  # "no such record" in the per-trade row indices


# ----------------------------------------------------------------------------------------------- records
def trade_records(trade: pa.Table, history: pa.Table, cdc: pa.Table) -> pa.Table:
    """Every staged record of the trades as one table.

    Columns: `tradeid`, `_ts`, `status`, `cdc_flag` (NULL in Batch1), `_values` (the record carries the Trade
    fields), the Trade fields `VALUES` (NULL on TradeHistory rows), the order columns `ORDER` (`_seq` = CDC_DSN,
    0 in Batch1; `_kind` 0 TradeHistory, 1 Trade) and `batch_id` (micro-batch).
    """
    declared = src.TRADE.staging.arrow_schema()
    types = {v: declared.field(v).type for v in VALUES}

    def part(table: pa.Table, tid: str, ts: str, status: str, values: bool, seq: pa.Array | None, kind: int):
        n = table.num_rows
        return pa.table(
            {
                "tradeid": column(table, tid),
                "_ts": column(table, ts),
                "status": column(table, status),
                "cdc_flag": column(table, "cdc_flag") if "cdc_flag" in table.column_names else pa.nulls(n, STRING),
                "_values": pa.array(np.full(n, values), pa.bool_()),
                **{v: column(table, v) if values else pa.nulls(n, types[v]) for v in VALUES},
                "_seq": seq if seq is not None else pa.array(np.zeros(n, np.int64), pa.int64()),
                "_kind": pa.array(np.full(n, kind, np.int32), pa.int32()),
                "batch_id": column(table, "batch_id"),
                "source_batch": column(table, "source_batch"),
                "line_no": column(table, "line_no"),
            }
        )

    parts = [
        part(trade, "t_id", "t_dts", "t_st_id", True, None, TRADE),
        part(history, "th_t_id", "th_dts", "th_st_id", False, None, HISTORY),
        part(cdc, "t_id", "t_dts", "t_st_id", True, column(cdc, "cdc_dsn"), TRADE),
    ]
    # delta-rs reads strings as it stored them (string, large_string or string_view): one type for all
    schema = pa.schema([f.with_type(STRING) if _is_text(f.type) else f for f in parts[0].schema])
    return pa.concat_tables([p.cast(schema) for p in parts])


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _mask(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow result as numpy, NULL as False."""
    return np.asarray(pc.fill_null(values, False), dtype=bool)


def _first(where: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per group (rows sorted by group, `starts` its first rows): the first row index where `where` holds, or
    NONE."""
    n = len(where)
    at = np.where(where, np.arange(n), n)
    first = np.minimum.reduceat(at, starts) if n else at
    return np.where(first == n, NONE, first)


def _last(where: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per group: the last row index where `where` holds, or NONE."""
    at = np.where(where, np.arange(len(where)), NONE)
    return np.maximum.reduceat(at, starts) if len(where) else at


def trade_states(records: pa.Table, trade_types: pa.Table) -> pa.Table:
    """One row per trade (sorted by trade id): the latest Trade fields, `batchid` (their TPC-DI batch),
    `create_ts`, `close_ts`, and `_micro` (the last micro-batch that staged a record of the trade), `_seen` (the last
    TPC-DI batch of any of its records).

    `trade_types` is the warehouse `tradetype` table (`tt_is_mrkt` tells market orders, whose SBMT creates
    them). A trade without any Trade record has NULL fields; one without a creation record a NULL `create_ts`.
    """
    data = sort(records, ["tradeid", *ORDER])
    ids = np.asarray(column(data, "tradeid"), dtype=np.int64)
    starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 1)) if len(ids) else np.zeros(0, np.int64)
    status = column(data, "status")
    last = _last(_mask(data["_values"]), starts)
    pndg = _first(_mask(pc.equal(status, "PNDG")), starts)
    sbmt = _first(_mask(pc.equal(status, "SBMT")), starts)
    insert = _first(_mask(pc.equal(data["cdc_flag"], "I")), starts)
    close = _last(_mask(pc.is_in(status, value_set=pa.array(CLOSE_STATUSES, STRING))), starts)
    trade_type = take_valid(column(data, "t_tt_id"), last)
    markets = column(trade_types, "tt_id").filter(pc.equal(trade_types["tt_is_mrkt"], 1))
    market = _mask(pc.is_in(trade_type, value_set=markets))
    # the earliest of the records that can create the trade (rows are in the declared order)
    candidates = np.stack([pndg, insert, np.where(market, sbmt, NONE)]) if len(starts) else np.zeros((3, 0), int)
    create = np.where(candidates == NONE, np.iinfo(np.int64).max, candidates).min(axis=0)
    create = np.where(create == np.iinfo(np.int64).max, NONE, create)
    micro = np.asarray(column(data, "batch_id"), dtype=np.int64)
    seen = np.asarray(column(data, "source_batch"), dtype=np.int64)
    ts = column(data, "_ts")
    return pa.table(
        {
            "tradeid": pa.array(ids[starts], pa.int64()),
            "_micro": pa.array(np.maximum.reduceat(micro, starts) if len(ids) else micro, pa.int64()),
            "_seen": pa.array(np.maximum.reduceat(seen, starts) if len(ids) else seen, pa.int32()),
            **{v: take_valid(column(data, v), last) for v in VALUES},
            "batchid": take_valid(column(data, "source_batch"), last),
            "create_ts": take_valid(ts, create),
            "close_ts": take_valid(ts, close),
        }
    )


# ------------------------------------------------------------------------------------------------- rows
def _microseconds(timestamps: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(microseconds since 1970 as int64 with NULL as 0, validity) of a UTC timestamp column."""
    valid = np.asarray(pc.is_valid(timestamps), dtype=bool)
    micros = np.asarray(pc.fill_null(timestamps.cast(pa.int64()), 0), dtype=np.int64)
    return micros, valid


def date_time_ids(timestamps: pa.Array) -> tuple[pa.Array, pa.Array]:
    """DimDate's SK_DateID (yyyymmdd) and DimTime's SK_TimeID (hhmmss, truncated to the second) of timestamps."""
    micros, valid = _microseconds(timestamps)
    seconds = np.floor_divide(micros, 1_000_000)
    of_day = np.mod(seconds, 86_400)
    times = (of_day // 3600) * 10_000 + (of_day // 60 % 60) * 100 + of_day % 60
    days = np.floor_divide(seconds, 86_400)
    return (
        pa.array(date_ids(days), pa.int32(), mask=~valid),
        pa.array(times, pa.int32(), mask=~valid),
    )


def valid_on(keys: pa.Array, days: pa.Array, dim: pa.Table, dim_key: str, take: list[str]) -> dict[str, pa.Array]:
    """Per (key, day): the `take` columns of the `dim` version of that key valid on the day (`jobs.valid_at`),
    NULL when there is none or the day is NULL."""
    known = _mask(pc.is_valid(days))
    day_numbers = np.where(known, np.asarray(pc.fill_null(days.cast(pa.int32()), 0), dtype=np.int64), 0)
    rows = valid_versions(keys, day_numbers, dim[dim_key], dim["effectivedate"], dim["enddate"])
    rows = np.where(known, rows, NONE)
    return {c: take_valid(dim[c], rows) for c in take}


def hold_reasons(states: pa.Table, keys: dict[str, pa.Array], status: pa.Array, kind: pa.Array) -> pa.Array:
    """Why each trade cannot be built yet ('; '-joined), or NULL when it can."""

    def valid(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return _mask(pc.is_valid(values))

    tt, created = valid(states["t_tt_id"]), valid(states["create_ts"])
    have = tt & created
    checks = [
        (~tt, lambda r: "no Trade record yet"),
        (tt & ~created, lambda r: "no creation record (PNDG, SBMT or I) yet"),
        (
            have & ~valid(keys["sk_accountid"]) & valid(states["t_ca_id"]),
            lambda r: f"account {r['t_ca_id']} has no DimAccount version on {r['_day']}",
        ),
        (
            have & ~valid(keys["sk_securityid"]) & valid(states["t_s_symb"]),
            lambda r: f"security {r['t_s_symb']} has no DimSecurity version on {r['_day']}",
        ),
        (tt & ~valid(status) & valid(states["t_st_id"]), lambda r: f"unknown status {r['t_st_id']}"),
        (tt & ~valid(kind), lambda r: f"unknown trade type {r['t_tt_id']}"),
    ]
    failing = np.flatnonzero(np.logical_or.reduce([failed for failed, _ in checks]))
    rows = states.select(["t_ca_id", "t_s_symb", "t_st_id", "t_tt_id", "create_ts"]).take(pa.array(failing, pa.int64()))
    rows = rows.append_column("_day", pc.cast(rows["create_ts"], pa.date32()).cast(STRING)).to_pylist()
    reasons: list[str | None] = [None] * states.num_rows
    for i, row in zip(failing, rows, strict=True):
        reasons[i] = "; ".join(text(row) for failed, text in checks if failed[i])
    return pa.array(reasons, STRING)


def build_trades(
    states: pa.Table, securities: pa.Table, accounts: pa.Table, status_types: pa.Table, trade_types: pa.Table
) -> pa.Table:
    """DimTrade rows of the trades in `states`, plus `_reason` (NULL when the row is complete; otherwise the
    row must be held) and `_source_batch` (TPC-DI batch of the latest Trade record, else of any record).

    Keys fixed at creation: the DimSecurity version (by symbol) and the DimAccount version (by account id) valid
    on the creation day."""
    day = pc.cast(states["create_ts"], pa.date32())
    keys = valid_on(states["t_s_symb"], day, securities, "symbol", ["sk_securityid", "sk_companyid"])
    keys |= valid_on(states["t_ca_id"], day, accounts, "accountid", ["sk_accountid", "sk_customerid", "sk_brokerid"])
    status = lookup(column(states, "t_st_id"), status_types, "st_id", "st_name")
    kind = lookup(column(states, "t_tt_id"), trade_types, "tt_id", "tt_name")
    created, created_at = date_time_ids(column(states, "create_ts"))
    closed, closed_at = date_time_ids(column(states, "close_ts"))
    return pa.table(
        {
            "tradeid": states["tradeid"],
            "sk_brokerid": keys["sk_brokerid"],
            "sk_createdateid": created,
            "sk_createtimeid": created_at,
            "sk_closedateid": closed,
            "sk_closetimeid": closed_at,
            "status": status,
            "type": kind,
            "cashflag": states["t_is_cash"],
            "sk_securityid": keys["sk_securityid"],
            "sk_companyid": keys["sk_companyid"],
            "quantity": states["t_qty"],
            "bidprice": states["t_bid_price"],
            "sk_customerid": keys["sk_customerid"],
            "sk_accountid": keys["sk_accountid"],
            "executedby": states["t_exec_name"],
            "tradeprice": states["t_trade_price"],
            "fee": states["t_chrg"],
            "commission": states["t_comm"],
            "tax": states["t_tax"],
            "batchid": states["batchid"],
            "_reason": hold_reasons(states, keys, status, kind),
            "_source_batch": pc.coalesce(states["batchid"], states["_seen"]),
        }
    )


# ----------------------------------------------------------------------------------------------- alerts
def trade_alerts(records: pa.Table) -> pa.Table:
    """The invalid commission and invalid fee alerts of the Trade records in `records` (one per record)."""
    rec = records.filter(records["_values"])
    value = pc.multiply(rec["t_trade_price"], rec["t_qty"].cast(pa.int64()))
    out = []
    for text, label, field, name in (
        ("Invalid trade commission", "commission", "t_comm", "T_COMM"),
        ("Invalid trade fee", "fee", "t_chrg", "T_CHRG"),
    ):
        bad = rec.filter(_mask(pc.greater(rec[field], value))).select(
            ["tradeid", "cdc_flag", "_seq", "source_batch", field]
        )
        rows = [
            (
                r["source_batch"],
                f"T_ID = {r['tradeid']}, {name} = {r[field]}",
                f"{label} T_ID={r['tradeid']}" + ("" if r["cdc_flag"] is None else f" CDC_DSN={r['_seq']}"),
            )
            for r in bad.to_pylist()
        ]
        out.append(alert_table(SOURCE, text, rows))
    return pa.concat_tables(out)


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
def _naming(data: pa.Table, changed_accounts: pa.Array | None, changed_symbols: pa.Array | None) -> np.ndarray:
    """Rows whose account (`t_ca_id`) or symbol (`t_s_symb`) is among the changed ones."""
    hit = np.zeros(data.num_rows, bool)
    for changed, name in ((changed_accounts, "t_ca_id"), (changed_symbols, "t_s_symb")):
        if changed is not None:
            hit |= _mask(pc.is_in(data[name], value_set=changed.cast(data.schema.field(name).type)))
    return hit


def touched_trades(
    states: pa.Table,
    batch_id: int,
    holds: pa.Table,
    changed_accounts: pa.Array | None,
    changed_symbols: pa.Array | None,
) -> pa.Table:
    """The states of the trades to recompute in micro-batch `batch_id`: those with a record in it, the held
    ones, and those on the changed accounts/securities (`t_ca_id` / `t_s_symb` values); never the rejected
    ones. `holds` is the holds table before this micro-batch."""
    state = take_valid(column(holds, "state"), _positions(states["tradeid"], holds["tradeid"]))
    touched = _mask(pc.equal(states["_micro"], batch_id)) | _mask(pc.equal(state, HELD))
    touched |= _naming(states, changed_accounts, changed_symbols)
    return states.filter(pa.array(touched & ~_mask(pc.equal(state, REJECTED)), pa.bool_()))


def _positions(keys: pa.Array | pa.ChunkedArray, of: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per key: its row in `of`, or NONE."""
    found = pc.index_in(keys, value_set=of.combine_chunks() if isinstance(of, pa.ChunkedArray) else of)
    return np.asarray(pc.fill_null(found, NONE), dtype=np.int64)


def candidate_records(
    records: pa.Table,
    batch_id: int,
    held: pa.Array,
    changed_accounts: pa.Array | None,
    changed_symbols: pa.Array | None,
) -> pa.Table:
    """All records of the trades `touched_trades` may keep, found before the per-trade states so that a micro-batch
    does not build every trade ever staged: trades with a record in `batch_id`, `held` ones, and those with a
    record naming a changed account or symbol. A superset of the touched trades (a trade's latest account is one
    its records name), with every record of each, so their states are exact."""
    wanted = _mask(pc.equal(records["batch_id"], batch_id)) | _naming(records, changed_accounts, changed_symbols)
    ids = pc.unique(pa.concat_arrays([column(records, "tradeid").filter(pa.array(wanted)), held.cast(pa.int64())]))
    return records.filter(pc.is_in(records["tradeid"], value_set=ids))
