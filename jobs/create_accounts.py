"""T2 (CreateAccounts): the step that rebuilds DimCustomer and DimAccount, commits them with the customer alerts,
then runs Prospect.

The rules of the tables are elsewhere: DimCustomer and its alerts in `jobs.customers`, DimAccount in
`jobs.accounts`, Prospect and the demographics in `jobs.prospect`. This module decides what a micro-batch
touches, reads the staged records of the keys to rebuild, keeps out the keys that cannot be loaded (with their
"not loaded" alerts, deleted again when they resolve) and makes the commits.

Decisions where the spec is silent:
- a customer whose status code is unknown or that lacks a required field (tax id, names, DOB, address line 1,
  postal code, city, state) in some version is kept out of DimCustomer; an account with a version whose
  customer, broker or status cannot be resolved (no customer version on that day, no DimBroker row, unknown
  code) is kept out of DimAccount. Either raises an Alert ("Customer not loaded" / "Account not loaded", key
  `C_ID=..` / `CA_ID=..`, data with the reason) and is retried when touched again. The whole key is kept out,
  not just the bad version, so that no gap or stale version is ever written. When a retry succeeds (or the
  reason moves to another batch) the old "not loaded" alert is deleted in the same DImessages commit, so a
  wait that resolves leaves the tables as a load of everything at once would. `jobs.messages.commit_messages`
  has no deletes, so T2 builds its message rows the same way (time = BatchDate of the batch) in
  `_message_changes` and commits them itself;
- alerts need the BatchDate; the alerts of a record whose TPC-DI batch is not dated yet are raised when the
  date arrives (`scope.newly_dated`). CustomerMgmt versions do not wait (their dates are their ActionTS);
- DimBroker has one version per broker (TPC-DI 4.5.4), so account versions are not cut at broker versions.

Incrementality (recompute per touched key, `jobs.scd2`): touched customers are the customers with change
records in this micro-batch (Customer.txt lines only once their batch is dated; all lines of newly dated
batches); touched accounts are the accounts with records in this micro-batch (likewise) plus every account
whose records name a touched customer. When the micro-batch brings StatusType or TaxRate lines every customer
and account is touched, when it brings HR or Date lines (DimBroker) every account. Each touched key's history
is recomputed from all its records staged so far and replaces the key's rows, so any split of the input into
micro-batches, in any order within a day, ends in the same tables. A micro-batch that brings none of these
files and dates no batch costs nothing (no Spark job).

Commits: DimCustomer, DimAccount, DImessages, one MERGE each with app transaction `T2/<table>`, version =
micro-batch, skipped when already recorded, and made even when empty so that a rerun of a committed
micro-batch returns at once. Spark work: the touched accounts' records, the customer versions and the account
versions are materialized with `localCheckpoint` (this cuts the plans: planning and code generation of the
shared parts, not the data, dominate at TPC-DI sizes), then one action collects all three tables' changes.
A lost executor loses local checkpoints and fails the step, which is then rerun. Once earlier micro-batches
staged records, and unless a reference file touches every key, only the records of the keys to rebuild are read
(`rebuilt_keys` finds the keys with delta-rs; `_records` hands their records to Spark as Arrow): a small
micro-batch then runs no Spark job over every staged action.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs import prospect
from jobs.accounts import ACCOUNT_ACTIONS, account_changes, account_versions
from jobs.collect import collect_parts
from jobs.customers import CUSTOMER_ACTIONS, MICRO, customer_alerts, customer_changes, customer_versions
from jobs.landing import CUSTOMER_MGMT_SOURCE, nondelimited_source_for_file, source_for_file
from jobs.messages import ALERT, alerts
from jobs.scd2 import BATCH, version_changes
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import Table
from schemas.staging import CUSTOMER_MGMT
from streamdi.context import JobContext
from streamdi.spark import literal_frame

log = logging.getLogger(__name__)

STEP = "T2"
NOT_LOADED = {"DimCustomer": "Customer not loaded", "DimAccount": "Account not loaded"}


# ------------------------------------------------------------------------------------------ keys kept out
def loadable(versions: DataFrame, natural: str) -> DataFrame:
    """The versions of the keys none of whose versions has a `_problem`."""
    bad = F.max(F.col("_problem").isNotNull()).over(Window.partitionBy(natural))
    return versions.withColumn("_bad", bad).where(~F.col("_bad")).drop("_bad")


def _not_loaded_key(natural: str, label: str) -> Column:
    return F.concat(F.lit(f"{label}="), F.col(natural).cast("string"))


def not_loaded_alerts(versions: DataFrame, *, source: str, natural: str, label: str) -> DataFrame:
    """One Alert per key with a version that cannot be loaded: the earliest such version's reason."""
    first = (
        versions.where(F.col("_problem").isNotNull())
        .groupBy(natural)
        .agg(F.min_by(F.struct("batchid", "_problem"), F.col("effectivedate")).alias("_first"))
    )
    return alerts(
        first,
        source=source,
        text=NOT_LOADED[source],
        when=F.lit(True),
        data=F.concat(F.lit(f"{label} = "), F.col(natural).cast("string"), F.lit(": "), F.col("_first._problem")),
        key=_not_loaded_key(natural, label),
        batchid=F.col("_first.batchid"),
    )


def resolved_alerts(
    existing: DataFrame, raised: DataFrame, touched: DataFrame, *, source: str, natural: str, label: str
) -> DataFrame:
    """Keys of the "not loaded" alerts of touched keys that are not raised again (the key loads now, or its
    alert moved to another batch): they are deleted, so a retry that succeeds leaves no trace of the wait."""
    keys = touched.select(_not_loaded_key(natural, label).alias("messagekey"))
    mine = (
        (F.col("messagesource") == source)
        & (F.col("messagetype") == ALERT)
        & (F.col("messagetext") == NOT_LOADED[source])
    )
    old = existing.where(mine).join(keys, "messagekey", "left_semi").select(*wh.DI_MESSAGES.key)
    return old.join(raised.select(*wh.DI_MESSAGES.key), list(wh.DI_MESSAGES.key), "left_anti")


# ------------------------------------------------------------------------------------------ run
@dataclass(frozen=True)
class Triggers:
    """What this micro-batch brings that T2 depends on (from its landing files and newly dated batches)."""

    records: bool  # CustomerMgmt.xml, Customer.txt or Account.txt
    prospects: bool  # Prospect.csv: the Prospect table, and the demographics of the customers it matches
    statuses: bool  # StatusType.txt: every status name may change
    tax_rates: bool  # TaxRate.txt: every customer's tax rates may change
    brokers: bool  # HR.csv or Date.txt: DimBroker may change
    dated: bool  # a TPC-DI batch got its BatchDate

    @property
    def any(self) -> bool:
        return self.records or self.prospects or self.statuses or self.tax_rates or self.brokers or self.dated


def triggers(scope: BatchScope) -> Triggers:
    """Which T2 inputs this micro-batch's files carry, by the declared file patterns."""
    names: set[str] = set()
    watched = (src.CUSTOMER, src.ACCOUNT, src.PROSPECT, src.STATUS_TYPE, src.TAX_RATE, src.HR, src.DATE_FILE)
    for file in scope.file_seq:
        source = source_for_file(file, sources=watched)
        if source is not None:
            names.add(source.name)
        elif nondelimited_source_for_file(file) == CUSTOMER_MGMT_SOURCE:
            names.add(CUSTOMER_MGMT_SOURCE)
    return Triggers(
        records=bool(names & {CUSTOMER_MGMT_SOURCE, src.CUSTOMER.name, src.ACCOUNT.name}),
        prospects=src.PROSPECT.name in names,
        statuses=src.STATUS_TYPE.name in names,
        tax_rates=src.TAX_RATE.name in names,
        brokers=bool(names & {src.HR.name, src.DATE_FILE.name}),
        dated=bool(scope.newly_dated),
    )


def _table(ctx: JobContext, table: Table) -> DataFrame:
    return ctx.lake.read_or_empty(table)


RECORD_TABLES = (CUSTOMER_MGMT, src.CUSTOMER.staging, src.ACCOUNT.staging)
# Above this many customers plus accounts to rebuild, Spark selects their records instead of the driver.
DRIVER_KEYS = 100_000


def rebuilt_keys(ctx: JobContext, scope: BatchScope, matched: pa.Array | None = None) -> tuple[pa.Array, pa.Array]:
    """The customers and the accounts `run` rebuilds when no reference file touches every key: the customers
    with a record new to the warehouse (and the customers `matched` by new prospect lines), the accounts with one
    or whose records name such a customer, and the customers of those accounts. Read with delta-rs (no Spark
    job) from the key columns of the staged records; Customer.txt and Account.txt lines count once their TPC-DI
    batch is dated, as in `run`."""
    dated = pc.field("source_batch").isin(pa.array(sorted(scope.batch_dates), pa.int32()))
    newly = pa.array(scope.newly_dated, pa.int32())

    def in_scope(t: pa.Table) -> pa.Table:
        return t.filter(pc.or_(pc.equal(t["batch_id"], scope.batch_id), pc.is_in(t["source_batch"], newly)))

    lineage = ["batch_id", "source_batch"]
    xml = scope.staged_where(ctx, CUSTOMER_MGMT, pc.scalar(True), ["action_type", "c_id", "ca_id", *lineage])
    lines = scope.staged_where(ctx, src.CUSTOMER.staging, dated, ["c_id", *lineage])
    xml_customers = xml.filter(pc.is_in(xml["action_type"], pa.array(CUSTOMER_ACTIONS)))
    customers = _unique(
        in_scope(xml_customers)["c_id"], in_scope(lines)["c_id"], *([] if matched is None else [matched])
    )

    account_kind = pc.is_in(xml["action_type"], pa.array(ACCOUNT_ACTIONS))
    xml_accounts = xml.filter(pc.and_(account_kind, pc.is_valid(xml["ca_id"])))
    account_lines = scope.staged_where(ctx, src.ACCOUNT.staging, dated, ["ca_id", "ca_c_id", *lineage])
    records = pa.table(
        {
            name: pa.chunked_array([*xml_accounts[x].chunks, *account_lines[line].chunks], xml_accounts[x].type)
            for name, x, line in (
                ("accountid", "ca_id", "ca_id"),
                ("customerid", "c_id", "ca_c_id"),
                *((c, c, c) for c in lineage),
            )
        }
    )
    of_customers = records.filter(pc.is_in(records["customerid"], customers))["accountid"]
    accounts = _unique(in_scope(records)["accountid"], of_customers)
    needed = _unique(customers, records.filter(pc.is_in(records["accountid"], accounts))["customerid"])
    return needed, accounts


def _unique(*columns: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct ids of the (int64) columns together."""
    chunks = [c for col in columns for c in (col.chunks if isinstance(col, pa.ChunkedArray) else [col])]
    return pc.unique(pa.chunked_array(chunks, pa.int64()))


def _records(
    ctx: JobContext, scope: BatchScope, why: Triggers, matched: pa.Array
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The staged CustomerMgmt actions, Customer.txt lines and Account.txt lines `run` reads (up to this
    micro-batch). When earlier micro-batches staged records and no reference file touches every key, only the
    records of the keys to rebuild (`rebuilt_keys`) are read, with delta-rs, and handed to Spark as Arrow: `run`
    finds the same keys in them (each record it uses names a kept customer or account), and a small micro-batch
    runs no Spark job over every staged record."""
    everything = why.statuses or why.tax_rates or why.brokers
    if not everything and scope.staged_before(ctx, RECORD_TABLES):
        customers, accounts = rebuilt_keys(ctx, scope, matched)
        if len(customers) + len(accounts) <= DRIVER_KEYS:
            kept = {
                CUSTOMER_MGMT: pc.field("c_id").isin(customers) | pc.field("ca_id").isin(accounts),
                src.CUSTOMER.staging: pc.field("c_id").isin(customers),
                src.ACCOUNT.staging: pc.field("ca_id").isin(accounts),
            }
            return tuple(ctx.lake.to_frame(t, scope.staged_where(ctx, t, c)) for t, c in kept.items())
    return tuple(_staged(ctx, scope, t) for t in RECORD_TABLES)


def _staged(ctx: JobContext, scope: BatchScope, table: Table) -> DataFrame:
    staged = scope.staged(ctx, table, upto=True)
    return staged if staged is not None else ctx.lake.empty(table)


def _in_scope(scope: BatchScope, micro: str = "batch_id", batch: str = "source_batch") -> Column:
    """Records that are new to the warehouse in this micro-batch: staged by it, or of a newly dated batch."""
    this = F.col(micro) == F.lit(scope.batch_id)
    if scope.newly_dated:
        return this | F.col(batch).isin(*scope.newly_dated)
    return this


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the touched customers and accounts from all their staged records and commit DimCustomer,
    DimAccount and the alerts (one commit each, skipped when already recorded for this micro-batch), then the
    Prospect table (`jobs.prospect.run`, which needs this micro-batch's DimCustomer).

    Spark actions: one per version set (customers, accounts) and one that collects the three tables' changes
    (`collect_changes`)."""
    why = triggers(scope)
    if not why.any:
        return {}
    rows = _customers_and_accounts(ctx, scope, why)
    rows.update(prospect.run(ctx, scope))
    return rows


def _customers_and_accounts(ctx: JobContext, scope: BatchScope, why: Triggers) -> dict[str, int]:
    todo = [t for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES) if not scope.committed(ctx, STEP, t)]
    if not todo:
        return {}
    matched = prospect.customers_matching_new_lines(ctx, scope)
    if why == Triggers(False, True, False, False, False, False) and len(matched) == 0:
        # only Prospect lines that match no customer version: no customer or account is touched, hence no version,
        # alert or resolution (the Spark plans below would all be empty); the commits record the micro-batch
        for table in todo:
            empty = table.arrow_schema().empty_table()
            ctx.lake.upsert(table, empty, app_id=scope.app_id(STEP, table), version=scope.batch_id)
        return {table.name: 0 for table in todo}
    dates = F.broadcast(scope.dates_frame(ctx))
    actions, customer_staged, account_staged = _records(ctx, scope, why, matched)
    customer_lines = customer_staged.join(dates, "source_batch")
    account_lines = account_staged.join(dates, "source_batch")
    cust_changes = customer_changes(actions, customer_lines)
    acct_changes = account_changes(actions, account_lines)

    # Touched keys. Incremental lines are in play once dated (the joins above drop the others).
    in_scope = _in_scope(scope, MICRO, BATCH)
    if why.statuses or why.tax_rates:
        touched_customers = cust_changes.select("customerid").distinct()
    else:
        touched_customers = cust_changes.where(in_scope).select("customerid")
        if len(matched):  # customers whose demographics may change: a new prospect line matches them
            ids = literal_frame(ctx.spark, [(i,) for i in matched.to_pylist()], "customerid bigint")
            touched_customers = touched_customers.unionByName(ids)
        touched_customers = touched_customers.distinct()
    if why.statuses or why.brokers:
        touched_accounts = acct_changes.select("accountid").distinct()
    else:
        own = acct_changes.where(in_scope).select("accountid")
        of_customers = acct_changes.join(touched_customers, "customerid", "left_semi").select("accountid")
        touched_accounts = own.unionByName(of_customers).distinct()
    account_records = acct_changes.join(touched_accounts, "accountid", "left_semi").localCheckpoint()
    # the customers to rebuild: the touched ones and those the touched accounts need (equal rows stay alone)
    customers_needed = touched_customers.unionByName(account_records.select("customerid")).distinct()

    # Versions are materialized (local checkpoints): the plans that use them stay small, so Spark plans and
    # generates code for each part once instead of once per use.
    status_types = _table(ctx, wh.STATUS_TYPE)
    cv = customer_versions(
        cust_changes.join(customers_needed, "customerid", "left_semi"), status_types, _table(ctx, wh.TAX_RATE)
    ).localCheckpoint()
    customers = loadable(cv, "customerid")
    av = account_versions(account_records, customers, _table(ctx, wh.DIM_BROKER), status_types).localCheckpoint()
    accounts = loadable(av, "accountid")
    # every rebuilt key has change records, hence versions: the rebuilt keys are the keys of the versions
    customer_keys = cv.select("customerid").distinct()
    account_keys = av.select("accountid").distinct()

    raised = reduce(
        DataFrame.unionByName,
        (
            customer_alerts(
                actions.join(dates, "source_batch").where(_in_scope(scope)), customer_lines.where(_in_scope(scope))
            ),
            not_loaded_alerts(cv, source="DimCustomer", natural="customerid", label="C_ID"),
            not_loaded_alerts(av, source="DimAccount", natural="accountid", label="CA_ID"),
        ),
    )
    existing = _table(ctx, wh.DI_MESSAGES)
    resolved = resolved_alerts(
        existing, raised, customer_keys, source="DimCustomer", natural="customerid", label="C_ID"
    ).unionByName(
        resolved_alerts(existing, raised, account_keys, source="DimAccount", natural="accountid", label="CA_ID")
    )
    changes = {
        wh.DIM_CUSTOMER: lambda: _table_changes(ctx, wh.DIM_CUSTOMER, customers, "customerid", customer_keys),
        wh.DIM_ACCOUNT: lambda: _table_changes(ctx, wh.DIM_ACCOUNT, accounts, "accountid", account_keys),
        wh.DI_MESSAGES: lambda: _message_changes(ctx, scope, raised, resolved),
    }
    collected = collect_changes({t: changes[t]() for t in todo})
    rows: dict[str, int] = {}
    for table, (new, gone) in collected.items():
        if table is wh.DIM_CUSTOMER:
            new = prospect.rebuilt_demographics(ctx, scope, new)
        # committed even when empty, so that the app transaction records the micro-batch as done
        data = ctx.lake.to_arrow(table, new)
        ctx.lake.upsert(table, data, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=gone)
        rows[table.name] = data.num_rows
        log.info(
            "T2 micro-batch %s: %s: %s upserted, %s deleted", scope.batch_id, table.name, data.num_rows, gone.num_rows
        )
    return rows


DELETE = "_delete"  # marks the key-only rows to delete


def _table_changes(ctx: JobContext, table: Table, versions: DataFrame, natural: str, touched: DataFrame) -> DataFrame:
    """The rows to upsert into `table` and (flagged `_delete`, key only) the keys to delete."""
    upserts, deletes = version_changes(_table(ctx, table), versions, table, [natural], touched)
    return upserts.withColumn(DELETE, F.lit(False)).unionByName(
        deletes.withColumn(DELETE, F.lit(True)), allowMissingColumns=True
    )


def _message_changes(ctx: JobContext, scope: BatchScope, raised: DataFrame, resolved: DataFrame) -> DataFrame:
    """As `jobs.messages.commit_messages` (the message time is the BatchDate of its batch), plus the keys of
    the resolved alerts to delete in the same commit."""
    dates = scope.dates_frame(ctx).select(
        F.col("source_batch").alias("batchid"), F.col("batchdate").cast("timestamp").alias("messagedateandtime")
    )
    key = list(wh.DI_MESSAGES.key)
    values = [c for c in wh.DI_MESSAGES.column_names if c not in key]
    # a record delivered twice raises its alert twice: one row per message key (the rows are equal)
    dated = (
        raised.join(F.broadcast(dates), "batchid", "left")
        .groupBy(*key)
        .agg(*[F.min(c).alias(c) for c in values])
        .select(*wh.DI_MESSAGES.column_names)
    )
    return dated.withColumn(DELETE, F.lit(False)).unionByName(
        resolved.withColumn(DELETE, F.lit(True)), allowMissingColumns=True
    )


def collect_changes(parts: dict[Table, DataFrame]) -> dict[Table, tuple[pa.Table, pa.Table]]:
    """Collect every table's changes with one Spark action; per table: (rows to upsert, keys to delete)."""
    data = collect_parts({t.name: df for t, df in parts.items()})
    out = {}
    for table in parts:
        mine = data[table.name]
        gone = mine[DELETE].combine_chunks() if mine.num_rows else pa.array([], pa.bool_())
        out[table] = (mine.filter(pc.invert(gone)), mine.filter(gone).select(list(table.key)))
    return out
