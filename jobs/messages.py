"""DImessages rows (TPC-DI 1.1.0, 3.2.18 and 4.5.x): alerts raised by the steps, validation and status rows.

Every message belongs to a TPC-DI batch (`batchid`) and is identified within its batch, source and type by
`messagekey`, a deterministic text naming what the message is about (for an alert: the source record, e.g.
`T_ID=123`). Messages are upserted on that identity, so a message raised again by a rerun or by a later
micro-batch of the same TPC-DI batch replaces itself instead of duplicating, and the table ends the same
whatever the micro-batch split. `messagedateandtime` is the BatchDate of the message's batch (midnight), not
the wall clock, so the table is reproducible; it is NULL while that BatchDate has not arrived.

A step raises its alerts as rows in `ALERT_COLUMNS` (`alert_rows`, `alert_table`) and commits them with
`commit_messages(ctx, scope, step, rows)` (app transaction `<step>/dimessages`), or with `commit_alert_changes` when
a recomputation also withdraws alerts it raised before.

Step DM (`run`, the last step of every micro-batch) writes the batch validation rows and the phase complete
record of the TPC-DI validation query (TPC-DI 1.1.0, Appendix B, `tpcdi_validation.sql`), for every TPC-DI batch
the micro-batch carries, 24 `Validation` rows per batch (`VALIDATION_MESSAGES`):
- `messagetext` "Row count", `messagedata` = the table's row count once this micro-batch's commits are done, for
  the 18 tables of the query (`VALIDATED_TABLES`: the reference tables, the dimensions, Prospect, Financial and
  the four fact tables); a table that does not exist yet counts 0 rows;
- "Row count joined" for the four fact tables (`JOINED`): the rows whose every dimension key names a row of that
  dimension (FactCashBalances and FactHoldings also through their account's broker), i.e. the row count of the
  query's inner joins, since every joined key is unique in its dimension;
- "Inactive customers" (DimCustomer: current versions with status Inactive) and "Inactive watches"
  (FactWatches: watches with a removal date);
- one `PCR` row: source "Phase Complete Record", text "Batch Complete", no data.
`messagekey` is the message text, so each (batch, source, type, text) exists once. The counts are made in the
driver from Delta metadata and narrow delta-rs reads of the key columns (`validation_counts`), without a Spark job;
the joined counts data file by data file, each file's figure kept while no dimension key has gone
(`joined_count`), so a warm process counts the files a micro-batch wrote, not every fact row again; the keys and
figures are also left under the lake's `_streamdi_kept/validation_counts/` for the next process (`jobs.messages_kept`).

Decisions where the spec is silent (it runs the query once after a whole batch):
- A dripped TPC-DI batch spans many micro-batches: each one upserts the rows of its TPC-DI batch with the
  counts as they stand after it, so the last micro-batch of the batch leaves exactly what a whole-batch run
  leaves (the collector never mixes TPC-DI batches in one micro-batch, and the transform runs micro-batches
  in order, so "as they stand" is "at the end of the batch so far").
- Batch 0 (the spec's run of the query on the empty warehouse before Batch1) is written with the micro-batches
  of TPC-DI batch 1: every count 0, plus its PCR; it has no BatchDate, so its `messagedateandtime` is NULL.

Step DM also writes one `Quality` row per data-quality check that failed in the micro-batch (staging suites in
the stage step, warehouse suites after each transform step; `quality.results` has the figures):
`messagesource` = the validated table (`staging.trade`, `warehouse.dimtrade`), `messagetext` = "Quality check
failed: <check id>", `messagedata` = the expectation, its column and the check's policy, `messagekey` =
`<table>/<check id>`. The row names no micro-batch and no count, so a check failing in any micro-batch of a
TPC-DI batch gives the same single row whatever the split (the counts per micro-batch are in
`streamdi.quality_results`). It goes to the newest TPC-DI batch the micro-batch carries. The type is not
`Alert`: TPC-DI's alert counts stay those of the spec.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from jobs.messages_kept import Kept
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.model import Table
from schemas.quality import QUALITY_RESULTS
from schemas.warehouse import DI_MESSAGES
from streamdi.context import JobContext
from streamdi.lake import Lake

ALERT = "Alert"
STATUS = "Status"
VALIDATION = "Validation"
PCR = "PCR"
QUALITY = "Quality"
QUALITY_TEXT = "Quality check failed: "
PHASE_COMPLETE_SOURCE = "Phase Complete Record"
PHASE_COMPLETE_TEXT = "Batch Complete"
ROW_COUNT = "Row count"
ROW_COUNT_JOINED = "Row count joined"
INACTIVE_CUSTOMERS = "Inactive customers"
INACTIVE_WATCHES = "Inactive watches"
INITIAL_BATCH = 0  # the spec's batch 0: the warehouse before Batch1

# the columns of alert rows (`alert_rows`, `alert_table`): DImessages without the time, which `commit_messages` adds
ALERT_COLUMNS = pa.schema([f for f in DI_MESSAGES.arrow_schema() if f.name != "messagedateandtime"])

# MessageSource -> table, for the tables of the validation query (in the query's order).
VALIDATED_TABLES: tuple[tuple[str, Table], ...] = (
    ("DimAccount", wh.DIM_ACCOUNT),
    ("DimBroker", wh.DIM_BROKER),
    ("DimCompany", wh.DIM_COMPANY),
    ("DimCustomer", wh.DIM_CUSTOMER),
    ("DimDate", wh.DIM_DATE),
    ("DimSecurity", wh.DIM_SECURITY),
    ("DimTime", wh.DIM_TIME),
    ("DimTrade", wh.DIM_TRADE),
    ("FactCashBalances", wh.FACT_CASH_BALANCES),
    ("FactHoldings", wh.FACT_HOLDINGS),
    ("FactMarketHistory", wh.FACT_MARKET_HISTORY),
    ("FactWatches", wh.FACT_WATCHES),
    ("Financial", wh.FINANCIAL),
    ("Industry", wh.INDUSTRY),
    ("Prospect", wh.PROSPECT),
    ("StatusType", wh.STATUS_TYPE),
    ("TaxRate", wh.TAX_RATE),
    ("TradeType", wh.TRADE_TYPE),
)


@dataclass(frozen=True)
class Lookup:
    """A fact column that the validation query joins to a dimension's key column."""

    column: str
    dimension: Table
    key: str


# "Row count joined": per fact table, the joins of the validation query. `through_account` adds the query's join
# of the account's broker (DimAccount.sk_brokerid -> DimBroker).
JOINED: tuple[tuple[str, Table, tuple[Lookup, ...], bool], ...] = (
    (
        "FactCashBalances",
        wh.FACT_CASH_BALANCES,
        (
            Lookup("sk_accountid", wh.DIM_ACCOUNT, "sk_accountid"),
            Lookup("sk_customerid", wh.DIM_CUSTOMER, "sk_customerid"),
            Lookup("sk_dateid", wh.DIM_DATE, "sk_dateid"),
        ),
        True,
    ),
    (
        "FactHoldings",
        wh.FACT_HOLDINGS,
        (
            Lookup("sk_accountid", wh.DIM_ACCOUNT, "sk_accountid"),
            Lookup("sk_customerid", wh.DIM_CUSTOMER, "sk_customerid"),
            Lookup("sk_dateid", wh.DIM_DATE, "sk_dateid"),
            Lookup("sk_timeid", wh.DIM_TIME, "sk_timeid"),
            Lookup("sk_companyid", wh.DIM_COMPANY, "sk_companyid"),
            Lookup("sk_securityid", wh.DIM_SECURITY, "sk_securityid"),
        ),
        True,
    ),
    (
        "FactMarketHistory",
        wh.FACT_MARKET_HISTORY,
        (
            Lookup("sk_dateid", wh.DIM_DATE, "sk_dateid"),
            Lookup("sk_companyid", wh.DIM_COMPANY, "sk_companyid"),
            Lookup("sk_securityid", wh.DIM_SECURITY, "sk_securityid"),
        ),
        False,
    ),
    (
        "FactWatches",
        wh.FACT_WATCHES,
        (
            Lookup("sk_customerid", wh.DIM_CUSTOMER, "sk_customerid"),
            Lookup("sk_dateid_dateplaced", wh.DIM_DATE, "sk_dateid"),
            Lookup("sk_securityid", wh.DIM_SECURITY, "sk_securityid"),
        ),
        False,
    ),
)
# (MessageSource, MessageText) of every validation row a batch gets, in the query's order.
VALIDATION_MESSAGES: tuple[tuple[str, str], ...] = (
    *((source, ROW_COUNT) for source, _ in VALIDATED_TABLES),
    *((source, ROW_COUNT_JOINED) for source, _, _, _ in JOINED),
    ("DimCustomer", INACTIVE_CUSTOMERS),
    ("FactWatches", INACTIVE_WATCHES),
)


def alert_table(source: str, text: str, rows: Sequence[tuple[int, str, str]]) -> pa.Table:
    """Alert rows built in Python: one Alert per `(batchid, messagedata, messagekey)`, in `ALERT_COLUMNS`."""
    batch, data, key = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [])
    n = len(batch)
    return pa.table(
        {
            "batchid": pa.array(batch, pa.int32()),
            "messagesource": pa.array([source] * n, pa.large_string()),
            "messagetext": pa.array([text] * n, pa.large_string()),
            "messagetype": pa.array([ALERT] * n, pa.large_string()),
            "messagedata": pa.array(data, pa.large_string()),
            "messagekey": pa.array(key, pa.large_string()),
        },
        schema=ALERT_COLUMNS,
    )


def commit_messages(ctx: JobContext, scope: BatchScope, step: str, rows: pa.Table | None) -> int:
    """Upsert message rows (in `ALERT_COLUMNS`) with the BatchDate of
    their batch as their time (`dated_messages`)."""
    if rows is None or scope.committed(ctx, step, DI_MESSAGES):
        return 0
    data = ctx.lake.to_arrow(DI_MESSAGES, dated_messages(scope, rows))
    if data.num_rows == 0:
        return 0
    ctx.lake.upsert(DI_MESSAGES, data, app_id=scope.app_id(step, DI_MESSAGES), version=scope.batch_id)
    return data.num_rows


def commit_alert_changes(
    ctx: JobContext,
    scope: BatchScope,
    step: str,
    part: str,
    raised: pa.Table,
    *,
    source: str,
    texts: Sequence[str],
    owners: Sequence[str],
) -> int:
    """Upsert the alerts `raised` (in `ALERT_COLUMNS`) of a step's `part` and delete, in the same commit, the
    existing alerts of `source` with one of `texts` that belong to one of `owners` and are not raised again: a
    record that now loads (or whose alert moved to another batch) leaves no trace of its wait, so a split batch
    ends with the alerts of a whole one. An alert's owner is the first word of its message key (e.g. `CA_ID=5` in
    `CA_ID=5 DAY=2017-07-08`): the unit the step recomputed. App transaction `<step>/dimessages/<part>`; nothing
    is committed when there is nothing to upsert or delete. Returns the rows upserted."""
    if scope.committed(ctx, step, DI_MESSAGES, part):
        return 0
    key = list(DI_MESSAGES.key)
    doomed = pa.table({k: pa.array([], DI_MESSAGES.arrow_schema().field(k).type) for k in key})
    if owners and ctx.lake.exists(DI_MESSAGES):
        mine = (
            (pc.field("messagesource") == source)
            & (pc.field("messagetype") == ALERT)
            & pc.field("messagetext").isin(pa.array(list(texts), pa.string()))
        )
        existing = ctx.lake.read_where(DI_MESSAGES, mine, key)
        if existing.num_rows:
            owner = pc.list_element(pc.split_pattern(existing["messagekey"], " ", max_splits=1), 0)
            existing = existing.filter(pc.is_in(owner, value_set=pa.array(list(owners), owner.type)))
            again = raised.select(key).cast(existing.select(key).schema)
            doomed = existing.join(again, keys=key, join_type="left anti").select(key)
    if raised.num_rows == 0 and doomed.num_rows == 0:
        return 0
    data = ctx.lake.to_arrow(DI_MESSAGES, dated_messages(scope, raised.select(ALERT_COLUMNS.names).cast(ALERT_COLUMNS)))
    app_id = scope.app_id(step, DI_MESSAGES, part)
    ctx.lake.upsert(DI_MESSAGES, data, app_id=app_id, version=scope.batch_id, deletes=doomed)
    return data.num_rows


def alert_rows(
    batchid: pa.Array, *, source: str, text: str, data: pa.Array | list[str], key: pa.Array | list[str]
) -> pa.Table:
    """Alert messages in `ALERT_COLUMNS`, built in the driver: one per element of `batchid`."""
    n = len(batchid)
    return pa.table(
        {
            "batchid": pa.array(batchid, pa.int32()) if not isinstance(batchid, pa.Array) else batchid.cast(pa.int32()),
            "messagesource": pa.array([source] * n, pa.large_string()),
            "messagetext": pa.array([text] * n, pa.large_string()),
            "messagetype": pa.array([ALERT] * n, pa.large_string()),
            "messagedata": pa.array(data, pa.large_string()),
            "messagekey": pa.array(key, pa.large_string()),
        }
    ).cast(ALERT_COLUMNS)


def dated_messages(scope: BatchScope, rows: pa.Table) -> pa.Table:
    """Arrow message rows (in `ALERT_COLUMNS`) with `messagedateandtime`: midnight of their batch's BatchDate,
    NULL while it is unknown."""
    midnight = {b: dt.datetime.combine(d, dt.time()) for b, d in scope.batch_dates.items()}
    stamps = pa.array([midnight.get(b) for b in rows["batchid"].to_pylist()], pa.timestamp("us"))
    return rows.append_column("messagedateandtime", stamps).select(DI_MESSAGES.column_names)


def joined_rows(facts: pa.Table, lookups: Sequence[Lookup], keys: Mapping[tuple[str, str], pa.Array]) -> int:
    """How many rows of `facts` (holding the `lookups` columns) the validation query's inner joins keep: rows whose
    every lookup column holds a key of `keys[(dimension name, key column)]` (the dimension's keys; for a join
    through the account's broker, the accounts whose broker exists). NULL never joins."""
    kept = _joined(facts, lookups, keys)
    if kept is None:
        return facts.num_rows
    return int(pc.sum(kept.cast(pa.int64())).as_py() or 0)


def _joined(facts: pa.Table, lookups: Sequence[Lookup], keys: Mapping[tuple[str, str], pa.Array]) -> pa.Array | None:
    """Per row of `facts`, whether every lookup joins (`joined_rows`); None without lookups."""
    kept = None
    for lookup in lookups:
        found = pc.is_in(facts[lookup.column], value_set=keys[(lookup.dimension.name, lookup.key)])
        found = pc.fill_null(found, False)
        kept = found if kept is None else pc.and_(kept, found)
    return kept


# Per lake: the dimension keys the joined counts last saw, and how many times one of them has gone since.
_SEEN: dict[Path, tuple[int, dict[tuple[str, str], pa.Array]]] = {}
_SEEN_LOCK = threading.Lock()


def _keys_epoch(root: Path, keys: Mapping[tuple[str, str], pa.Array]) -> int:
    """A number that changes whenever a key of `keys` is gone since the last call for the lake at `root` (a
    dimension's keys only grow unless a recomputation drops a version): while it holds, a fact row that joined
    still does, so a data file's count can be kept (`joined_count`). A new process starts from the keys and number
    the last one left (`jobs.messages_kept`), and leaves them in turn whenever the keys changed, before any count
    made under them: so a count on disk was made under keys that are all in the ones on disk."""
    with _SEEN_LOCK:
        epoch, before = _SEEN[root] if root in _SEEN else Kept(root).keys()
        lost = any(
            ident not in keys
            or (len(old) > 0 and not pc.all(pc.is_in(old.cast(keys[ident].type), value_set=keys[ident])).as_py())
            for ident, old in before.items()
        )
        epoch += int(lost)
        _SEEN[root] = (epoch, dict(keys))
        if lost or keys.keys() != before.keys() or any(len(keys[i]) != len(before[i]) for i in keys):
            Kept(root).keep_keys(epoch, keys)  # kept whole and none lost: the same keys (they only grow)
        return epoch


def joined_count(
    lake: Lake, table: Table, lookups: Sequence[Lookup], keys: Mapping[tuple[str, str], pa.Array], epoch: int
) -> int:
    """`joined_rows` of the whole table, file by file (`Lake.fold_files`): each data file's count of rows that join
    and its rows that do not are kept while no dimension key has gone (`epoch`, from `_keys_epoch`), so a micro-batch
    counts only the files it wrote (and looks again at the few rows that did not join: their keys may have come).
    At SF 6 the four fact tables hold ~4.4 M rows, which the whole count read and probed at every micro-batch. The
    counts are also left on disk for the next process (`jobs.messages_kept`), which takes those of the files it
    finds."""
    columns = [lookup.column for lookup in lookups]

    folded = []  # files counted here (not taken from memory or from disk)

    def fold(rows: pa.Table) -> tuple[int, pa.Table]:
        folded.append(rows.num_rows)
        kept = _joined(rows, lookups, keys)
        if kept is None:  # (kept per file: an empty table, as a slice would hold the file's rows)
            return rows.num_rows, rows.schema.empty_table()
        return int(pc.sum(kept.cast(pa.int64())).as_py() or 0), rows.filter(pc.invert(kept))

    stored = Kept(lake.root)
    # read from disk only when this process lacks a file's count (a warm process reads nothing)
    parts = lake.fold_files(table, columns, f"messages/joined/{epoch}", fold, known=lambda: stored.counts(table, epoch))
    if folded:  # whatever is on disk lacks these: keep the whole set
        stored.keep_counts(table, epoch, parts)
    left = [rows for _, rows in parts.values() if rows.num_rows]
    again = joined_rows(pa.concat_tables(left), lookups, keys) if left else 0
    return sum(n for n, _ in parts.values()) + again


def validation_counts(ctx: JobContext) -> dict[tuple[str, str], int]:
    """The figures of `VALIDATION_MESSAGES` as the warehouse stands: row counts from Delta metadata, the joined
    counts and the inactive customers and watches from narrow delta-rs reads (no Spark job). A table that does not
    exist counts 0 rows."""
    lake = ctx.lake

    def column(table: Table, name: str) -> pa.Array:
        if not lake.exists(table):
            return pa.array([], table.arrow_schema().field(name).type)
        return lake.read_columns(table, [name])[name].combine_chunks()

    counts: dict[tuple[str, str], int] = {}
    for source, table in VALIDATED_TABLES:
        counts[(source, ROW_COUNT)] = lake.row_count(table) if lake.exists(table) else 0
    keys: dict[tuple[str, str], pa.Array] = {}
    for _, _, lookups, _ in JOINED:
        for lookup in lookups:
            ident = (lookup.dimension.name, lookup.key)
            if ident not in keys:
                keys[ident] = column(lookup.dimension, lookup.key)
    with_broker = dict(keys)
    if lake.exists(wh.DIM_ACCOUNT):
        accounts = lake.read_columns(wh.DIM_ACCOUNT, ["sk_accountid", "sk_brokerid"])
        brokered = pc.is_in(accounts["sk_brokerid"], value_set=column(wh.DIM_BROKER, "sk_brokerid"))
        with_broker[(wh.DIM_ACCOUNT.name, "sk_accountid")] = accounts.filter(brokered)["sk_accountid"].combine_chunks()
    through_broker = (f"{wh.DIM_ACCOUNT.name} with a broker", "sk_accountid")
    epoch = _keys_epoch(lake.root, {**keys, through_broker: with_broker[(wh.DIM_ACCOUNT.name, "sk_accountid")]})
    for source, table, lookups, through_account in JOINED:
        joined = 0
        if counts[(source, ROW_COUNT)]:
            joined = joined_count(lake, table, lookups, with_broker if through_account else keys, epoch)
        counts[(source, ROW_COUNT_JOINED)] = joined
    inactive = 0
    if lake.exists(wh.DIM_CUSTOMER):
        c = lake.read_columns(wh.DIM_CUSTOMER, ["iscurrent", "status"])
        inactive = pc.sum(pc.and_(c["iscurrent"], pc.equal(c["status"], "Inactive")).cast("int64")).as_py() or 0
    counts[("DimCustomer", INACTIVE_CUSTOMERS)] = inactive
    removed = column(wh.FACT_WATCHES, "sk_dateid_dateremoved")
    counts[("FactWatches", INACTIVE_WATCHES)] = len(removed) - removed.null_count
    return counts


def batch_message_rows(counts: Mapping[tuple[str, str], int], source_batches: Sequence[int]) -> pa.Table:
    """The validation rows (`counts`: `(source, text) -> figure` for every row of `VALIDATION_MESSAGES`) and the
    phase complete record of every batch of `source_batches`, plus batch 0 (every figure 0) with batch 1, in the
    columns of `ALERT_COLUMNS`."""
    rows = []
    for batch in sorted(set(source_batches)):
        rows.extend(_batch_rows(batch, counts))
        if batch == 1:
            rows.extend(_batch_rows(INITIAL_BATCH, dict.fromkeys(VALIDATION_MESSAGES, 0)))
    return pa.Table.from_pylist(rows, schema=ALERT_COLUMNS)


def _batch_rows(batch: int, counts: Mapping[tuple[str, str], int]) -> list[dict]:
    rows = [
        {
            "batchid": batch,
            "messagesource": source,
            "messagetext": text,
            "messagetype": VALIDATION,
            "messagedata": str(counts[(source, text)]),
            "messagekey": text,
        }
        for source, text in VALIDATION_MESSAGES
    ]
    rows.append(
        {
            "batchid": batch,
            "messagesource": PHASE_COMPLETE_SOURCE,
            "messagetext": PHASE_COMPLETE_TEXT,
            "messagetype": PCR,
            "messagedata": None,
            "messagekey": PHASE_COMPLETE_TEXT,
        }
    )
    return rows


def quality_messages(ctx: JobContext, scope: BatchScope) -> pa.Table | None:
    """One `Quality` message per check that failed in this micro-batch (any attempt), or None if none did."""
    if not scope.source_batches or not ctx.lake.exists(QUALITY_RESULTS):
        return None
    results = ctx.lake.read_where(
        QUALITY_RESULTS,
        (pc.field("batch_id") == scope.batch_id) & (pc.field("success") == False),  # noqa: E712
    )
    failed = {(r["table_name"], r["check_id"]): r for r in results.to_pylist()}
    if not failed:
        return None
    batchid = max(scope.source_batches)
    rows = []
    for (table, check), r in sorted(failed.items()):
        on = f" on {r['column_name']}" if r["column_name"] else ""
        rows.append(
            {
                "batchid": batchid,
                "messagesource": table,
                "messagetext": QUALITY_TEXT + check,
                "messagetype": QUALITY,
                "messagedata": f"{r['expectation']}{on}, policy {r['policy']}",
                "messagekey": f"{table}/{check}",
            }
        )
    return pa.Table.from_pylist(rows, schema=ALERT_COLUMNS)


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Step DM: upsert the validation rows and phase complete record of the micro-batch's TPC-DI batches, and a
    row per failed data-quality check."""
    if not scope.source_batches or scope.committed(ctx, "DM", DI_MESSAGES):
        return {}
    rows = batch_message_rows(validation_counts(ctx), scope.source_batches)
    quality = quality_messages(ctx, scope)
    if quality is not None:
        rows = pa.concat_tables([rows, quality])
    written = commit_messages(ctx, scope, "DM", rows)
    return {DI_MESSAGES.name: written} if written else {}
