"""DImessages rows (TPC-DI 1.1.0, 3.2.18 and 4.5.x): alerts raised by the steps, validation and status rows.

Every message belongs to a TPC-DI batch (`batchid`) and is identified within its batch, source and type by
`messagekey`, a deterministic text naming what the message is about (for an alert: the source record, e.g.
`T_ID=123`). Messages are upserted on that identity, so a message raised again by a rerun or by a later
micro-batch of the same TPC-DI batch replaces itself instead of duplicating, and the table ends the same
whatever the micro-batch split. `messagedateandtime` is the BatchDate of the message's batch (midnight), not
the wall clock, so the table is reproducible; it is NULL while that BatchDate has not arrived.

A step raises its alerts with `alerts(...)` and commits them with `commit_messages(ctx, scope, step, rows)`
(app transaction `<step>/dimessages`).

Step DM (`run`, the last step of every micro-batch) writes the batch validation rows and the phase complete
record of the TPC-DI validation query (TPC-DI 1.1.0, Appendix B, `tpcdi_validation.sql`), for every TPC-DI batch
the micro-batch carries:
- `Validation` rows, `messagesource` = the table, `messagetext` = "Row count", `messagedata` = the table's row
  count once this micro-batch's commits are done, for every table of the validation query that streamdi builds
  (`VALIDATED_TABLES`: the reference tables, DimBroker, DimCompany, DimSecurity, Financial, DimCustomer,
  DimAccount, DimTrade); "Inactive customers" for DimCustomer (current versions with status Inactive). The
  query's "Row count joined" rows and "Inactive watches" concern only FactCashBalances, FactHoldings,
  FactMarketHistory and FactWatches, which streamdi does not build yet (add them to `VALIDATED_TABLES` /
  `validation_counts` with those tables). A declared table that does not exist yet counts 0 rows.
- one `PCR` row: source "Phase Complete Record", text "Batch Complete", no data.
`messagekey` is the message text, so each (batch, source, type, text) exists once.

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
from collections.abc import Mapping, Sequence
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.model import Table
from schemas.quality import QUALITY_RESULTS
from schemas.warehouse import DI_MESSAGES
from streamdi.context import JobContext
from streamdi.spark import literal_frame

ALERT = "Alert"
STATUS = "Status"
VALIDATION = "Validation"
PCR = "PCR"
QUALITY = "Quality"
QUALITY_TEXT = "Quality check failed: "
PHASE_COMPLETE_SOURCE = "Phase Complete Record"
PHASE_COMPLETE_TEXT = "Batch Complete"
ROW_COUNT = "Row count"
INACTIVE_CUSTOMERS = "Inactive customers"
INITIAL_BATCH = 0  # the spec's batch 0: the warehouse before Batch1

# the columns of the rows `alerts` builds: DImessages without the time, which `commit_messages` adds
ALERT_COLUMNS = pa.schema([f for f in DI_MESSAGES.arrow_schema() if f.name != "messagedateandtime"])

# MessageSource -> table, for the tables of the validation query that streamdi builds (in the query's order).
VALIDATED_TABLES: tuple[tuple[str, Table], ...] = (
    ("DimAccount", wh.DIM_ACCOUNT),
    ("DimBroker", wh.DIM_BROKER),
    ("DimCompany", wh.DIM_COMPANY),
    ("DimCustomer", wh.DIM_CUSTOMER),
    ("DimDate", wh.DIM_DATE),
    ("DimSecurity", wh.DIM_SECURITY),
    ("DimTime", wh.DIM_TIME),
    ("DimTrade", wh.DIM_TRADE),
    ("Financial", wh.FINANCIAL),
    ("Industry", wh.INDUSTRY),
    ("StatusType", wh.STATUS_TYPE),
    ("TaxRate", wh.TAX_RATE),
    ("TradeType", wh.TRADE_TYPE),
)
# (MessageSource, MessageText) of every validation row a batch gets.
VALIDATION_MESSAGES: tuple[tuple[str, str], ...] = (
    *((source, ROW_COUNT) for source, _ in VALIDATED_TABLES),
    ("DimCustomer", INACTIVE_CUSTOMERS),
)


def alerts(
    records: DataFrame,
    *,
    source: str,
    text: str,
    when: Column,
    data: Column,
    key: Column,
    batchid: Column,
) -> DataFrame:
    """One Alert message per row of `records` where `when` holds.

    `source` is the table the alert is about (e.g. "DimTrade"), `text` the spec's message text (e.g.
    "Invalid trade commission"), `data` the message data (e.g. `T_ID = 1, T_COMM = 12.00`), `key` the
    record's identity within the batch, `batchid` the TPC-DI batch of the record. Returns rows with the
    columns of DImessages except `messagedateandtime` (see `commit_messages`).
    """
    return records.where(when).select(
        batchid.cast("int").alias("batchid"),
        F.lit(source).alias("messagesource"),
        F.lit(text).alias("messagetext"),
        F.lit(ALERT).alias("messagetype"),
        data.cast("string").alias("messagedata"),
        key.cast("string").alias("messagekey"),
    )


def commit_messages(ctx: JobContext, scope: BatchScope, step: str, rows: DataFrame | pa.Table | None) -> int:
    """Upsert message rows (as built by `alerts`, or the same columns collected as Arrow) with the BatchDate of
    their batch as their time (`dated_messages`)."""
    if rows is None or scope.committed(ctx, step, DI_MESSAGES):
        return 0
    if isinstance(rows, DataFrame):
        rows = rows.select(*ALERT_COLUMNS.names).toArrow()
    data = ctx.lake.to_arrow(DI_MESSAGES, dated_messages(scope, rows))
    if data.num_rows == 0:
        return 0
    ctx.lake.upsert(DI_MESSAGES, data, app_id=scope.app_id(step, DI_MESSAGES), version=scope.batch_id)
    return data.num_rows


def dated_messages(scope: BatchScope, rows: pa.Table) -> pa.Table:
    """Arrow message rows (the columns of `alerts`) with `messagedateandtime`: midnight of their batch's BatchDate,
    NULL while it is unknown."""
    midnight = {b: dt.datetime.combine(d, dt.time()) for b, d in scope.batch_dates.items()}
    stamps = pa.array([midnight.get(b) for b in rows["batchid"].to_pylist()], pa.timestamp("us"))
    return rows.append_column("messagedateandtime", stamps).select(DI_MESSAGES.column_names)


def validation_counts(spark: SparkSession, tables: Mapping[str, DataFrame | None]) -> DataFrame:
    """`messagesource, messagetext, messagedata` (text) of every row of `VALIDATION_MESSAGES`.

    `tables` maps a MessageSource of `VALIDATED_TABLES` to the table's rows (None or absent: the table does
    not exist, count 0). All counts are computed by one Spark job when the result is read.
    """

    def count(source: str, text: str, df: DataFrame | None, where: Column | None = None) -> DataFrame:
        if df is None:
            return literal_frame(
                spark, [(source, text, "0")], "messagesource string, messagetext string, messagedata string"
            )
        rows = df if where is None else df.where(where)
        return rows.agg(F.count(F.lit(1)).cast("string").alias("messagedata")).select(
            F.lit(source).alias("messagesource"), F.lit(text).alias("messagetext"), "messagedata"
        )

    parts = [count(source, ROW_COUNT, tables.get(source)) for source, _ in VALIDATED_TABLES]
    inactive = F.col("iscurrent") & (F.col("status") == "Inactive")
    parts.append(count("DimCustomer", INACTIVE_CUSTOMERS, tables.get("DimCustomer"), inactive))
    return reduce(DataFrame.unionByName, parts)


def validation_rows(counts: DataFrame, batchids: Sequence[int]) -> DataFrame:
    """Validation messages (DImessages columns without `messagedateandtime`) of `counts` for every batch."""
    spark = counts.sparkSession
    batches = literal_frame(spark, [(b,) for b in sorted(batchids)], "batchid int")
    return batches.crossJoin(counts).select(
        F.col("batchid"),
        F.col("messagesource"),
        F.col("messagetext"),
        F.lit(VALIDATION).alias("messagetype"),
        F.col("messagedata"),
        F.col("messagetext").alias("messagekey"),
    )


def phase_complete_rows(spark: SparkSession, batchids: Sequence[int]) -> DataFrame:
    """One phase complete record per batch (DImessages columns without `messagedateandtime`)."""
    rows = [(b, PHASE_COMPLETE_SOURCE, PHASE_COMPLETE_TEXT, PCR, None, PHASE_COMPLETE_TEXT) for b in sorted(batchids)]
    return literal_frame(
        spark,
        rows,
        "batchid int, messagesource string, messagetext string, messagetype string, messagedata string, "
        "messagekey string",
    )


def batch_messages(
    spark: SparkSession, tables: Mapping[str, DataFrame | None], source_batches: Sequence[int]
) -> DataFrame | None:
    """Validation and phase complete rows of `source_batches` (plus batch 0 with batch 1); None if none."""
    batches = sorted(set(source_batches))
    if not batches:
        return None
    parts = [validation_rows(validation_counts(spark, tables), batches), phase_complete_rows(spark, batches)]
    if 1 in batches:
        parts.append(validation_rows(validation_counts(spark, {}), [INITIAL_BATCH]))
        parts.append(phase_complete_rows(spark, [INITIAL_BATCH]))
    return reduce(DataFrame.unionByName, parts)


def _counts(ctx: JobContext) -> dict[tuple[str, str], int]:
    """The figures of `VALIDATION_MESSAGES` from Delta metadata and narrow delta-rs scans (no Spark job)."""
    counts = {}
    for source, table in VALIDATED_TABLES:
        counts[(source, ROW_COUNT)] = ctx.lake.row_count(table) if ctx.lake.exists(table) else 0
    inactive = 0
    if ctx.lake.exists(wh.DIM_CUSTOMER):
        c = ctx.lake.read_columns(wh.DIM_CUSTOMER, ["iscurrent", "status"])
        inactive = pc.sum(pc.and_(c["iscurrent"], pc.equal(c["status"], "Inactive")).cast("int64")).as_py() or 0
    counts[("DimCustomer", INACTIVE_CUSTOMERS)] = inactive
    return counts


def batch_messages_counted(
    spark: SparkSession, counts: Mapping[tuple[str, str], int], source_batches: Sequence[int]
) -> DataFrame | None:
    """`batch_messages` from counts already made (`(source, text) -> count`, as `_counts` gives them)."""
    batches = sorted(set(source_batches))
    if not batches:
        return None
    rows = [(source, text, str(counts[(source, text)])) for source, text in VALIDATION_MESSAGES]
    figures = literal_frame(spark, rows, "messagesource string, messagetext string, messagedata string")
    parts = [validation_rows(figures, batches), phase_complete_rows(spark, batches)]
    if 1 in batches:
        parts.append(validation_rows(validation_counts(spark, {}), [INITIAL_BATCH]))
        parts.append(phase_complete_rows(spark, [INITIAL_BATCH]))
    return reduce(DataFrame.unionByName, parts)


def quality_messages(ctx: JobContext, scope: BatchScope) -> DataFrame | None:
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
        data = f"{r['expectation']}{on}, policy {r['policy']}"
        rows.append((batchid, table, QUALITY_TEXT + check, QUALITY, data, f"{table}/{check}"))
    return literal_frame(
        ctx.spark,
        rows,
        "batchid int, messagesource string, messagetext string, messagetype string, messagedata string, "
        "messagekey string",
    )


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Step DM: upsert the validation rows and phase complete record of the micro-batch's TPC-DI batches, and a
    row per failed data-quality check."""
    if not scope.source_batches or scope.committed(ctx, "DM", DI_MESSAGES):
        return {}
    rows = batch_messages_counted(ctx.spark, _counts(ctx), scope.source_batches)
    quality = quality_messages(ctx, scope)
    if quality is not None:
        rows = rows.unionByName(quality)
    written = commit_messages(ctx, scope, "DM", rows)
    return {DI_MESSAGES.name: written} if written else {}
