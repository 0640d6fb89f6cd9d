"""FactCashBalances (step T3): the cash balance of every account at the end of every day with cash transactions.

Implements TPC-DI 1.1.0 clause 4.5 for FactCashBalances, historical (Batch1 CashTransaction.txt) and incremental
(CashTransaction.txt with CDC_FLAG/CDC_DSN):
- one row per account (CT_CA_ID) and day (the date of CT_DTS) on which the account has transactions;
- `cash`: the account's balance at the end of the day: the previous row's cash (zero before the first) plus the
  day's CT_AMT, i.e. the sum of every CT_AMT of the account up to and including that day, in exact cents;
- `sk_accountid`, `sk_customerid`: the DimAccount version valid on the day (`effectivedate <= day < enddate`) and
  its customer version; `sk_dateid`: the day's DimDate id (yyyymmdd);
- `batchid`: the TPC-DI batch of the day's transactions (the greatest, should a day's transactions come from
  several batches);
- `accountid`: the account, with `sk_dateid` the row's identity.
Decisions where the spec is silent:
- identical records count once: a file delivered twice must not double the cash (records are never identical
  in the official files: CDC_DSN, or the second and the free text, tell them apart);
- a day whose account has no DimAccount version (the account has not arrived yet) is not written; its cash still
  counts in the later days' balances, which are the account's sums, not a chain of rows. An Alert "Cash balance
  not loaded" (data: account, day and reason; key `CA_ID=<id> DAY=<yyyy-mm-dd>`) says so, and is deleted when
  the row loads (`jobs.messages.commit_alert_changes`).

Incrementality (recompute per touched key, as the dimensions do): a micro-batch recomputes every row of each
touched account -- one with a transaction staged by this micro-batch, or whose DimAccount versions this
micro-batch changed (its change feed) -- from all of the account's staged transactions, upserts the rows and
deletes the account's rows that no longer exist. A row is thereby a function of the account's records and
versions only, the same whatever the cut into micro-batches. The work is done in the driver on Arrow data
(pure functions `cash_records`, `daily_balances`, `cash_balance_rows`; inputs read with delta-rs), which costs a
fraction of a Spark plan at TPC-DI's sizes (SF 3: 362 k transactions).

Commits (app transactions `T3/factcashbalances`, `T3/dimessages/factcashbalances`): the rows, then the alerts;
each skipped when already recorded for the micro-batch.
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
from jobs.valid_at import take, valid_versions
from schemas import sources as src
from schemas import warehouse as wh
from streamdi.context import JobContext
from streamdi.lake import within_range

log = logging.getLogger(__name__)

STEP = "T3"
SOURCE = "FactCashBalances"
NOT_LOADED = "Cash balance not loaded"
TABLE = wh.FACT_CASH_BALANCES
RECORD_TABLES = (src.CASH_TRANSACTION.staging, src.CASH_TRANSACTION_CDC.staging)
RECORD_FIELDS = ("ct_ca_id", "ct_dts", "ct_amt", "ct_name", "source_batch")
# accounts recomputed at once: ~44 cash transactions each (SF 10: 1,197,794 of 27,020 accounts), so a first load at
# SF 10 in one piece, SF 100 (~12 M transactions) in about six
ACCOUNTS_PER_PIECE = 50_000


# ------------------------------------------------------------------------------------------------ transforms
def cash_records(*staged: pa.Table) -> pa.Table:
    """The cash transactions of the staged tables (Batch1 and CDC rows alike) as `accountid, day, amount`
    (cents), `source_batch`, each distinct record once."""
    parts = []
    for t in staged:
        dsn = t["cdc_dsn"] if "cdc_dsn" in t.column_names else pa.nulls(t.num_rows, pa.int64())
        parts.append(t.select(list(RECORD_FIELDS)).append_column("cdc_dsn", dsn.cast(pa.int64())))
    records = pa.concat_tables(parts) if parts else pa.table({f: [] for f in (*RECORD_FIELDS, "cdc_dsn")})
    distinct = ao.distinct_rows(records, [*RECORD_FIELDS, "cdc_dsn"])
    return pa.table(
        {
            "accountid": distinct["ct_ca_id"].cast(pa.int64()),
            "day": pa.array(ao.timestamp_days(distinct["ct_dts"]), pa.int64()),
            "amount": pa.array(ao.cents(distinct["ct_amt"]), pa.int64()),
            "source_batch": distinct["source_batch"].cast(pa.int32()),
        }
    )


def daily_balances(records: pa.Table) -> pa.Table:
    """One row per (account, day) of `records` (`cash_records`): `accountid, day`, `cash` (cents: the account's
    sum up to and including the day) and `batchid` (the greatest TPC-DI batch of the day's records)."""
    ordered = ao.sort(records, ["accountid", "day"])
    if ordered.num_rows == 0:
        return pa.table(
            {
                "accountid": pa.array([], pa.int64()),
                "day": pa.array([], pa.int64()),
                "cash": pa.array([], pa.int64()),
                "batchid": pa.array([], pa.int32()),
            }
        )
    starts = ao.group_starts(ordered, ["accountid", "day"])
    amount = ao.column(ordered, "amount").to_numpy(zero_copy_only=False)
    batch = ao.column(ordered, "source_batch").to_numpy(zero_copy_only=False)
    per_day = np.add.reduceat(amount, starts)
    day_batch = np.maximum.reduceat(batch, starts)
    days = ordered.take(pa.array(starts))
    running = np.cumsum(per_day)
    first_of_account = ~ao.same_as_previous(days, ["accountid"])
    # the running sum restarts at every account: subtract what the accounts before it summed to
    before = np.where(first_of_account, running - per_day, 0)
    offset = np.maximum.accumulate(np.where(first_of_account, np.arange(len(per_day)), 0))
    cash = running - before[offset]
    return pa.table(
        {
            "accountid": days["accountid"],
            "day": days["day"],
            "cash": pa.array(cash, pa.int64()),
            "batchid": pa.array(day_batch, pa.int32()),
        }
    )


def cash_balance_rows(daily: pa.Table, accounts: pa.Table) -> tuple[pa.Table, pa.Table]:
    """FactCashBalances rows of `daily` (`daily_balances`) with the keys of the DimAccount version (`accounts`:
    accountid, sk_accountid, sk_customerid, effectivedate, enddate) valid on each day, and the days whose account
    has no version then (`accountid, day, batchid`)."""
    day = ao.column(daily, "day").to_numpy(zero_copy_only=False)
    index = valid_versions(
        daily["accountid"], day, accounts["accountid"], accounts["effectivedate"], accounts["enddate"]
    )
    found = index >= 0
    kept = daily.filter(pa.array(found))
    hit = index[found]
    rows = pa.table(
        {
            "sk_customerid": take(accounts["sk_customerid"], hit),
            "sk_accountid": take(accounts["sk_accountid"], hit),
            "sk_dateid": pa.array(ao.date_ids(ao.column(kept, "day").to_numpy(zero_copy_only=False)), pa.int32()),
            "cash": ao.decimals(ao.column(kept, "cash").to_numpy(zero_copy_only=False), 15, 2),
            "batchid": kept["batchid"],
            "accountid": kept["accountid"],
        }
    ).cast(TABLE.arrow_schema())
    missing = daily.filter(pa.array(~found)).select(["accountid", "day", "batchid"])
    return rows, missing


def not_loaded_alerts(missing: pa.Table) -> pa.Table:
    """One "Cash balance not loaded" Alert per (account, day) without a DimAccount version."""
    days = np.asarray(ao.column(missing, "day").to_numpy(zero_copy_only=False), dtype="datetime64[D]").astype(str)
    accounts = missing["accountid"].to_pylist()
    return alert_rows(
        ao.column(missing, "batchid"),
        source=SOURCE,
        text=NOT_LOADED,
        data=[f"CT_CA_ID = {a}, {d}: no DimAccount version on that day" for a, d in zip(accounts, days, strict=True)],
        key=[f"CA_ID={a} DAY={d}" for a, d in zip(accounts, days, strict=True)],
    )


# ------------------------------------------------------------------------------------------------ run
def touched_accounts(ctx: JobContext, scope: BatchScope) -> pa.Array:
    """Accounts with a cash transaction staged by this micro-batch, and accounts whose DimAccount versions this
    micro-batch changed."""
    return scope.touched(ctx, RECORD_TABLES, "ct_ca_id", wh.DIM_ACCOUNT, "accountid")


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the rows of the touched accounts, `ACCOUNTS_PER_PIECE` at a time (`jobs.pieces`: a first load of
    several pieces is never whole in memory); commit FactCashBalances, then its alerts."""
    if not any(ctx.lake.exists(t) for t in RECORD_TABLES):
        return {}
    if scope.committed(ctx, STEP, TABLE) and scope.committed(ctx, STEP, wh.DI_MESSAGES, TABLE.name):
        return {}
    accounts = touched_accounts(ctx, scope)
    if len(accounts) == 0:
        return {}

    def recompute(piece: pa.Array, compare: bool) -> Piece[pa.Table]:
        rows, missing = _recomputed(ctx, scope, piece)
        if not compare:
            return Piece(rows, None, missing)
        upserts, gone = ao.changes_against(rows, _stored(ctx, piece, rows), TABLE.key)
        return Piece(upserts, gone, missing)

    out, found = recompute_in_pieces(
        ctx,
        scope,
        STEP,
        TABLE,
        accounts,
        ACCOUNTS_PER_PIECE,
        recompute,
        Alerts(SOURCE, (NOT_LOADED,), "CA_ID", _alerts),
    )
    missing = sum(f.num_rows for f in found)
    log.info(
        "T3 micro-batch %s: factcashbalances: %s rows written, %s not loaded",
        scope.batch_id,
        out.get(TABLE.name),
        missing,
    )
    return out


def _alerts(found: list[pa.Table]) -> pa.Table:
    return not_loaded_alerts(pa.concat_tables(found))


def _recomputed(ctx: JobContext, scope: BatchScope, accounts: pa.Array) -> tuple[pa.Table, pa.Table]:
    """`cash_balance_rows` of every staged cash transaction of `accounts` (ascending), read by their range."""
    wanted = pc.field("ct_ca_id").isin(accounts) & within_range("ct_ca_id", accounts)
    read = (*RECORD_FIELDS, "cdc_dsn")
    staged = [scope.staged_where(ctx, t, wanted, record_columns(t, read)) for t in RECORD_TABLES if ctx.lake.exists(t)]
    versions = pa.table({c: pa.array([], wh.DIM_ACCOUNT.arrow_schema().field(c).type) for c in _VERSION_COLUMNS})
    if ctx.lake.exists(wh.DIM_ACCOUNT):
        versions = ctx.lake.read_where(wh.DIM_ACCOUNT, pc.field("accountid").isin(accounts), list(_VERSION_COLUMNS))
    return cash_balance_rows(daily_balances(cash_records(*staged)), versions)


_VERSION_COLUMNS = ("accountid", "sk_accountid", "sk_customerid", "effectivedate", "enddate")


def _stored(ctx: JobContext, accounts: pa.Array, rows: pa.Table) -> pa.Table:
    """The touched accounts' rows in the table."""
    if not ctx.lake.exists(TABLE):
        return rows.schema.empty_table()
    return ctx.lake.read_where(TABLE, pc.field("accountid").isin(accounts))
