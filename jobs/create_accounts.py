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
micro-batch, skipped when already recorded, and made even when empty so that a rerun of a committed micro-batch
returns at once. Prospect (`jobs.prospect`, which needs this micro-batch's DimCustomer) is computed and committed on
a kept thread from the DimCustomer commit on, beside DimAccount and DImessages. The work runs on Arrow tables in the
driver, with no Spark job: T2's inputs are customers and accounts (thousands per scale factor, against millions of
trades), and Spark's fixed cost of planning the SCD2 plans (3-5 s per micro-batch whatever its size) was most of a
small micro-batch's time. Once earlier micro-batches staged records, and unless a reference file touches every key,
only the records of the keys to rebuild are read (`rebuilt_keys` finds the keys from the staged key columns);
otherwise every staged record is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from jobs import prospect
from jobs.accounts import ACCOUNT_ACTIONS, account_changes, account_versions
from jobs.arrow_ops import sort
from jobs.customers import CUSTOMER_ACTIONS, MICRO, STRING, customer_alerts, customer_changes, customer_versions
from jobs.landing import CUSTOMER_MGMT_SOURCE, nondelimited_source_for_file, source_for_file
from jobs.messages import ALERT, ALERT_COLUMNS, alert_table, dated_messages
from jobs.scd2 import BATCH
from jobs.scd2_arrow import has_problem, loadable, version_changes
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.staging import CUSTOMER_MGMT
from streamdi.context import JobContext
from streamdi.pools import kept_pool

log = logging.getLogger(__name__)

STEP = "T2"
NOT_LOADED = {"DimCustomer": "Customer not loaded", "DimAccount": "Account not loaded"}


# ------------------------------------------------------------------------------------------ keys kept out
def not_loaded_alerts(versions: pa.Table, *, source: str, natural: str, label: str) -> pa.Table:
    """One Alert per key with a version that cannot be loaded: the earliest such version's reason."""
    bad = sort(
        versions.filter(has_problem(versions)).select([natural, "effectivedate", "batchid", "_problem"]),
        [natural, "effectivedate"],
    )
    rows = []
    seen = None
    for r in bad.to_pylist():
        if r[natural] != seen:
            seen = r[natural]
            rows.append((r["batchid"], f"{label} = {seen}: {r['_problem']}", f"{label}={seen}"))
    return alert_table(source, NOT_LOADED[source], rows)


def resolved_alerts(
    existing: pa.Table, raised: pa.Table, touched: pa.Array, *, source: str, natural: str, label: str
) -> pa.Table:
    """Keys of the "not loaded" alerts of touched keys that are not raised again (the key loads now, or its
    alert moved to another batch): they are deleted, so a retry that succeeds leaves no trace of the wait."""
    keys = pa.array([f"{label}={k}" for k in touched.to_pylist()], STRING)
    mine = pc.and_(
        pc.and_(pc.equal(existing["messagesource"], source), pc.equal(existing["messagetype"], ALERT)),
        pc.and_(
            pc.equal(existing["messagetext"], NOT_LOADED[source]), pc.is_in(existing["messagekey"], value_set=keys)
        ),
    )
    key = list(wh.DI_MESSAGES.key)
    old = existing.filter(mine).select(key)
    again = raised.select(key)
    return old.join(again, key, join_type="left anti").select(key)


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


RECORD_TABLES = (CUSTOMER_MGMT, src.CUSTOMER.staging, src.ACCOUNT.staging)


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


def _records(ctx: JobContext, scope: BatchScope, why: Triggers, matched: pa.Array) -> tuple[pa.Table, ...]:
    """The staged CustomerMgmt actions, Customer.txt lines and Account.txt lines `run` reads (up to this
    micro-batch), with delta-rs. When earlier micro-batches staged records and no reference file touches every key,
    only the records of the keys to rebuild (`rebuilt_keys`): `run` finds the same keys in them (each record it
    uses names a kept customer or account), and a small micro-batch does not read every staged record."""
    everything = why.statuses or why.tax_rates or why.brokers
    kept = dict.fromkeys(RECORD_TABLES, pc.scalar(True))
    if not everything and scope.staged_before(ctx, RECORD_TABLES):
        customers, accounts = rebuilt_keys(ctx, scope, matched)
        kept = {
            CUSTOMER_MGMT: pc.field("c_id").isin(customers) | pc.field("ca_id").isin(accounts),
            src.CUSTOMER.staging: pc.field("c_id").isin(customers),
            src.ACCOUNT.staging: pc.field("ca_id").isin(accounts),
        }
    return tuple(scope.staged_where(ctx, t, c) for t, c in kept.items())


def with_dates(scope: BatchScope, records: pa.Table) -> pa.Table:
    """The records of the TPC-DI batches whose BatchDate is known, with it as `batchdate`."""
    batches = sorted(scope.batch_dates)
    known = pa.array(batches, pa.int32())
    dated = records.filter(pc.is_in(records["source_batch"], value_set=known))
    dates = pa.array([scope.batch_dates[b] for b in batches], pa.date32())
    return dated.append_column("batchdate", dates.take(pc.index_in(dated["source_batch"], value_set=known)))


def _new(scope: BatchScope, micro: pa.ChunkedArray, batch: pa.ChunkedArray) -> pa.ChunkedArray:
    """Records that are new to the warehouse in this micro-batch: staged by it, or of a newly dated batch."""
    this = pc.equal(micro, scope.batch_id)
    return pc.or_(this, pc.is_in(batch, value_set=pa.array(scope.newly_dated, pa.int32())))


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the touched customers and accounts from all their staged records and commit DimCustomer,
    DimAccount and the alerts (one commit each, skipped when already recorded for this micro-batch), then the
    Prospect table (`jobs.prospect.run`, which needs this micro-batch's DimCustomer)."""
    why = triggers(scope)
    if not why.any:
        return {}
    prospects: list[Future[dict[str, int]]] = []

    def customers_committed() -> None:
        # Prospect needs only this micro-batch's DimCustomer: it is computed and committed on a kept thread while
        # DimAccount and the alerts are (its MERGE and theirs run in delta-rs, beside each other)
        prospects.append(kept_pool("prospect", 1).submit(prospect.run, ctx, scope))

    try:
        rows = _customers_and_accounts(ctx, scope, why, customers_committed)
    finally:
        if prospects:
            wait(prospects)  # a failure of either side is raised once both have ended
    if not prospects:  # DimCustomer was committed by an earlier run of this micro-batch, or needed no commit
        rows.update(prospect.run(ctx, scope))
    else:
        rows.update(prospects[0].result())
    return rows


def _ids(*columns: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct non-NULL ids of the (int64) columns together."""
    return pc.drop_null(_unique(*columns))


def _customers_and_accounts(
    ctx: JobContext, scope: BatchScope, why: Triggers, customers_committed: Callable[[], None]
) -> dict[str, int]:
    """Commit DimCustomer, DimAccount and the alerts (those not yet committed for this micro-batch), calling
    `customers_committed` right after the DimCustomer commit."""
    todo = [t for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES) if not scope.committed(ctx, STEP, t)]
    if not todo:
        return {}
    matched = prospect.customers_matching_new_lines(ctx, scope)
    actions, customer_staged, account_staged = _records(ctx, scope, why, matched)
    customer_lines = with_dates(scope, customer_staged)
    cust_changes = customer_changes(actions, customer_lines)
    acct_changes = account_changes(actions, with_dates(scope, account_staged))

    # Touched keys. Incremental lines are in play once dated (`with_dates` drops the others).
    if why.statuses or why.tax_rates:
        touched_customers = _ids(cust_changes["customerid"])
    else:
        new = _new(scope, cust_changes[MICRO], cust_changes[BATCH])
        touched_customers = _ids(cust_changes.filter(new)["customerid"], matched)
    if why.statuses or why.brokers:
        touched_accounts = _ids(acct_changes["accountid"])
    else:
        own = acct_changes.filter(_new(scope, acct_changes[MICRO], acct_changes[BATCH]))["accountid"]
        of_customers = acct_changes.filter(pc.is_in(acct_changes["customerid"], value_set=touched_customers))
        touched_accounts = _ids(own, of_customers["accountid"])
    account_records = acct_changes.filter(pc.is_in(acct_changes["accountid"], value_set=touched_accounts))
    # the customers to rebuild: the touched ones and those the touched accounts need (equal rows stay alone)
    customers_needed = _ids(touched_customers, account_records["customerid"])

    status_types = ctx.lake.read_if_exists(wh.STATUS_TYPE)
    cv = customer_versions(
        cust_changes.filter(pc.is_in(cust_changes["customerid"], value_set=customers_needed)),
        status_types,
        ctx.lake.read_if_exists(wh.TAX_RATE),
    )
    av = account_versions(
        account_records, loadable(cv, "customerid"), ctx.lake.read_if_exists(wh.DIM_BROKER), status_types
    )
    # every rebuilt key has change records, hence versions: the rebuilt keys are the keys of the versions
    customer_keys = _ids(cv["customerid"])
    account_keys = _ids(av["accountid"])

    alerted = with_dates(scope, actions)
    raised = pa.concat_tables(
        [
            customer_alerts(
                alerted.filter(_new(scope, alerted["batch_id"], alerted["source_batch"])),
                customer_lines.filter(_new(scope, customer_lines["batch_id"], customer_lines["source_batch"])),
            ),
            not_loaded_alerts(cv, source="DimCustomer", natural="customerid", label="C_ID"),
            not_loaded_alerts(av, source="DimAccount", natural="accountid", label="CA_ID"),
        ]
    )
    rows: dict[str, int] = {}
    for table in todo:
        if table is wh.DI_MESSAGES:
            new, gone = _message_changes(ctx, scope, raised, customer_keys, account_keys)
        else:
            natural, keys, versions = (
                ("customerid", customer_keys, cv) if table is wh.DIM_CUSTOMER else ("accountid", account_keys, av)
            )
            current = ctx.lake.read_if_exists(table, [*table.key, natural], pc.field(natural).isin(keys))
            new, sk = version_changes(
                current, loadable(versions, natural), table.column_names, natural, table.key[0], keys
            )
            gone = pa.table({table.key[0]: sk})
            if table is wh.DIM_CUSTOMER:
                new = prospect.rebuilt_demographics(ctx, scope, ctx.lake.to_arrow(table, new))
        # committed even when empty, so that the app transaction records the micro-batch as done
        data = ctx.lake.to_arrow(table, new)
        ctx.lake.upsert(table, data, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=gone)
        if table is wh.DIM_CUSTOMER:
            customers_committed()
        rows[table.name] = data.num_rows
        log.info(
            "T2 micro-batch %s: %s: %s upserted, %s deleted", scope.batch_id, table.name, data.num_rows, gone.num_rows
        )
    return rows


def _message_changes(
    ctx: JobContext, scope: BatchScope, raised: pa.Table, customer_keys: pa.Array, account_keys: pa.Array
) -> tuple[pa.Table, pa.Table]:
    """As `jobs.messages.commit_messages` (the message time is the BatchDate of its batch), plus the keys of the
    "not loaded" alerts of rebuilt keys that are not raised again, to delete in the same commit."""
    key = list(wh.DI_MESSAGES.key)
    texts = pa.array(sorted(NOT_LOADED.values()), STRING)
    existing = ctx.lake.read_if_exists(
        wh.DI_MESSAGES, [*key, "messagetext"], pc.field("messagetext").isin(texts) & (pc.field("messagetype") == ALERT)
    )
    resolved = pa.concat_tables(
        [
            resolved_alerts(existing, raised, customer_keys, source="DimCustomer", natural="customerid", label="C_ID"),
            resolved_alerts(existing, raised, account_keys, source="DimAccount", natural="accountid", label="CA_ID"),
        ]
    )
    # a record delivered twice raises its alert twice: one row per message key (the rows are equal)
    values = [c for c in ALERT_COLUMNS.names if c not in key]
    unique = raised.group_by(key, use_threads=False).aggregate([(c, "min") for c in values])
    unique = unique.rename_columns([c.removesuffix("_min") for c in unique.column_names]).select(ALERT_COLUMNS.names)
    return dated_messages(scope, unique.cast(ALERT_COLUMNS)), resolved
