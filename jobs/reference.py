"""T0 (reference data): DimDate, DimTime, StatusType, TradeType, Industry, TaxRate and DimBroker.

These tables come from Batch1 files that are loaded as they are (TPC-DI 1.1.0, clause 4.5.1-4.5.3): each
warehouse row is the staged row of its natural key. If one micro-batch carries the same key more than once
(two deliveries of the file), the row that arrived last wins: the last file in the batch's arrival order,
then the last line of that file. The result is upserted by key, one app-transaction commit per table
(`T0/<table>`, batch id), so a rerun of a committed batch changes nothing.

DimBroker (4.5.4): one row per HR.csv employee with job code 314, current, effective from the first day of
DimDate, TPC-DI batch 1. Its surrogate key is derived from the employee id and that day (`jobs.scd2`). It is
rebuilt whenever HR.csv or Date.txt rows arrive; until DimDate has rows, brokers wait.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from jobs.scd2 import END_OF_TIME, surrogate_key
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import SourceFile, Table
from streamdi.context import JobContext
from streamdi.spark import literal_frame

log = logging.getLogger(__name__)

# Which staged source feeds which warehouse table (column names are the same on both sides).
REFERENCE_FEEDS: tuple[tuple[SourceFile, Table], ...] = (
    (src.DATE_FILE, wh.DIM_DATE),
    (src.TIME_FILE, wh.DIM_TIME),
    (src.STATUS_TYPE, wh.STATUS_TYPE),
    (src.TRADE_TYPE, wh.TRADE_TYPE),
    (src.INDUSTRY, wh.INDUSTRY),
    (src.TAX_RATE, wh.TAX_RATE),
)


def latest_per_key(staged: DataFrame, key: tuple[str, ...], arrival: DataFrame) -> DataFrame:
    """One row per key: the one that arrived last (file arrival position, then line number).

    `arrival` maps `source_file` to its `file_seq` within the batch.
    """
    ranked = staged.join(arrival, "source_file", "left").withColumn(
        "_rank",
        F.row_number().over(
            Window.partitionBy(*key).orderBy(F.col("file_seq").desc_nulls_last(), F.col("line_no").desc())
        ),
    )
    return ranked.where(F.col("_rank") == 1).drop("_rank", "file_seq")


def build_reference_table(staged: DataFrame, target: Table, arrival: DataFrame) -> DataFrame:
    """Warehouse rows of a reference table from its staged rows of one batch."""
    return latest_per_key(staged, target.key, arrival).select(*target.column_names)


@dataclass
class TransformReport:
    batch_id: int
    rows: dict[str, int]
    committed: dict[str, bool]


BROKER_JOB_CODE = 314


def build_brokers(hr: DataFrame, first_day: DataFrame) -> DataFrame:
    """DimBroker rows from HR employees (one row per employee id, the last delivered line winning) and the
    one-row, one-column DataFrame `first_day` (the earliest DimDate day)."""
    day = first_day.select(F.col(first_day.columns[0]).cast("date").alias("effectivedate"))
    brokers = hr.where(F.col("employeejobcode") == BROKER_JOB_CODE).crossJoin(day)
    return brokers.select(
        surrogate_key("employeeid", "effectivedate").alias("sk_brokerid"),
        F.col("employeeid").alias("brokerid"),
        F.col("managerid"),
        F.col("employeefirstname").alias("firstname"),
        F.col("employeelastname").alias("lastname"),
        F.col("employeemi").alias("middleinitial"),
        F.col("employeebranch").alias("branch"),
        F.col("employeeoffice").alias("office"),
        F.col("employeephone").alias("phone"),
        F.lit(True).alias("iscurrent"),
        F.lit(1).alias("batchid"),
        F.col("effectivedate"),
        F.lit(END_OF_TIME).alias("enddate"),
    )


def run(ctx: JobContext, scope: BatchScope) -> TransformReport:
    """Upsert the batch's staged reference rows into the warehouse tables (one commit per table)."""
    batch_id = scope.batch_id
    # built on first use: a micro-batch without reference files should not pay for it
    arrival = functools.cache(
        lambda: literal_frame(ctx.spark, sorted(scope.file_seq.items()), "source_file string, file_seq int")
    )
    rows: dict[str, int] = {}
    committed: dict[str, bool] = {}
    for source, target in REFERENCE_FEEDS:
        if not scope.carries(source.name):
            continue
        staged = scope.staged(ctx, source.staging)
        if staged is None or scope.committed(ctx, "T0", target):
            continue
        result = build_reference_table(staged, target, arrival())
        data = ctx.lake.to_arrow(target, result)
        if data.num_rows == 0:
            continue
        commit = ctx.lake.upsert(target, data, app_id=scope.app_id("T0", target), version=batch_id)
        rows[target.name] = data.num_rows
        committed[target.name] = commit.committed
    _run_brokers(ctx, scope, arrival, rows, committed)
    return TransformReport(batch_id, rows, committed)


def _run_brokers(
    ctx: JobContext,
    scope: BatchScope,
    arrival: Callable[[], DataFrame],
    rows: dict[str, int],
    committed: dict[str, bool],
) -> None:
    if not scope.carries(src.HR.name, src.DATE_FILE.name):
        return
    hr_new = scope.staged(ctx, src.HR.staging)
    date_new = scope.staged(ctx, src.DATE_FILE.staging)
    arrived = any(df is not None and not df.isEmpty() for df in (hr_new, date_new))
    if not arrived or not ctx.lake.exists(wh.DIM_DATE) or scope.committed(ctx, "T0", wh.DIM_BROKER):
        return
    first_day = ctx.lake.read(wh.DIM_DATE).agg(F.min("datevalue"))
    if first_day.first()[0] is None:
        return
    hr_all = scope.staged(ctx, src.HR.staging, upto=True)
    if hr_all is None:
        return
    # every HR line so far, the last delivered one per employee winning (micro-batch, then file, then line)
    order = Window.partitionBy("employeeid").orderBy(
        F.col("batch_id").desc(),
        F.col("file_seq").desc_nulls_last(),
        F.col("source_file").desc(),
        F.col("line_no").desc(),
    )
    ranked = hr_all.join(arrival(), "source_file", "left").withColumn("_n", F.row_number().over(order))
    latest = ranked.where(F.col("_n") == 1)
    data = ctx.lake.to_arrow(wh.DIM_BROKER, build_brokers(latest, first_day))
    commit = ctx.lake.upsert(wh.DIM_BROKER, data, app_id=scope.app_id("T0", wh.DIM_BROKER), version=scope.batch_id)
    rows[wh.DIM_BROKER.name] = data.num_rows
    committed[wh.DIM_BROKER.name] = commit.committed
