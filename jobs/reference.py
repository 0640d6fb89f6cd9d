"""T0 (reference data): DimDate, DimTime, StatusType, TradeType, Industry and TaxRate from staging.

These tables come from Batch1 files that are loaded as they are (TPC-DI 1.1.0, clause 4.5.1-4.5.3): each
warehouse row is the staged row of its natural key. If one micro-batch carries the same key more than once
(two deliveries of the file), the row that arrived last wins: the last file in the batch's arrival order,
then the last line of that file. The result is upserted by key, one app-transaction commit per table
(`T0/<table>`, batch id), so a rerun of a committed batch changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import SourceFile, Table
from streamdi.context import JobContext

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


def run(ctx: JobContext, batch_id: int, arrival: DataFrame) -> TransformReport:
    """Upsert the batch's staged reference rows into the warehouse tables (one commit per table)."""
    rows: dict[str, int] = {}
    committed: dict[str, bool] = {}
    for source, target in REFERENCE_FEEDS:
        staging = source.staging
        if not ctx.lake.exists(staging):
            continue
        staged = ctx.lake.read(staging).where(F.col("batch_id") == batch_id)
        result = build_reference_table(staged, target, arrival)
        data = ctx.lake.to_arrow(target, result)
        if data.num_rows == 0:
            continue
        commit = ctx.lake.upsert(target, data, app_id=f"T0/{target.name}", version=batch_id)
        rows[target.name] = data.num_rows
        committed[target.name] = commit.committed
    return TransformReport(batch_id, rows, committed)
