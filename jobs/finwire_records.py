"""The FINWIRE records of step T1 (CreateSecurities), as DimCompany, DimSecurity and Financial all read them.

Shared by `jobs.companies`, `jobs.securities` and `jobs.financials` (pure Spark transforms) and the T1 step
(`jobs.create_securities`): the declared order of the records, which delivery of a line counts, a record's
identity and lineage, why a record cannot be loaded, and the alerts of the records left out.

**Declared order** of FINWIRE records: posting timestamp (PTS), then file name, then line. A file delivered
again (same name) replaces its earlier lines: per (file, line) the latest micro-batch's line counts.

**Records that cannot be loaded** are left out of the warehouse and raise one Alert each (`messagekey` =
`<file>:<line>`, batch = the record's TPC-DI batch), with the reason as message text: "Unknown company"
(no company version with that CIK/name on the PTS date), "Unknown status type", "Unknown industry",
"Missing required field" (a column the warehouse declares NOT NULL would be NULL). Left-out records do not
take part in versioning (the key's history is built from the loadable records only, so its rows still
chain). When a later micro-batch makes such a record loadable (its company arrives), its alert is withdrawn:
the alerts of every recomputed record are replaced by the ones the recomputation raises.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs.messages import ALERT
from schemas import warehouse as wh
from schemas.model import Table

# Declared order of FINWIRE records (after `latest_delivery`, (file, line) is unique).
ORDER = ("_ts", "source_file", "line_no")

INVALID_SP_RATING = "Invalid SPRating"
UNKNOWN_COMPANY = "Unknown company"
UNKNOWN_STATUS = "Unknown status type"
UNKNOWN_INDUSTRY = "Unknown industry"
MISSING_FIELD = "Missing required field"
ALERT_TEXTS = (INVALID_SP_RATING, UNKNOWN_COMPANY, UNKNOWN_STATUS, UNKNOWN_INDUSTRY, MISSING_FIELD)

SOURCE_OF = {wh.DIM_COMPANY.name: "DimCompany", wh.DIM_SECURITY.name: "DimSecurity", wh.FINANCIAL.name: "Financial"}


def latest_delivery(staged: DataFrame) -> DataFrame:
    """One row per (file, line): the one staged by the latest micro-batch (a file delivered again wins)."""
    latest = Window.partitionBy("source_file", "line_no").orderBy(F.col("batch_id").desc())
    return staged.withColumn("_n", F.row_number().over(latest)).where(F.col("_n") == 1).drop("_n")


def record_key() -> Column:
    """A staged record's identity, `<file>:<line>` (the `messagekey` of its alerts)."""
    return F.concat_ws(":", F.col("source_file"), F.col("line_no").cast("string"))


def missing_required(table: Table, columns: tuple[str, ...]) -> Column:
    """Comma list of the `columns` that `table` declares NOT NULL and that are NULL ('' when none)."""
    required = [c for c in columns if not table.column(c).nullable]
    return F.concat_ws(",", *[F.when(F.col(c).isNull(), F.lit(c)) for c in required])


def first_reason(*checks: tuple[Column, str, Column]) -> tuple[Column, Column]:
    """(`_reason`, `_detail`) of the first failing check (condition, reason text, detail); NULLs when none."""
    reason, detail = None, None
    for cond, text, info in checks:
        reason = F.when(cond, F.lit(text)) if reason is None else reason.when(cond, F.lit(text))
        detail = F.when(cond, info) if detail is None else detail.when(cond, info)
    return reason, detail


def rejection_alerts(records: DataFrame, source: str, ident: Column) -> DataFrame:
    """One Alert per record with a `_reason` (rows as `jobs.messages.alerts` builds them, the reason as text):
    data = `ident, detail`, key = the record, batch = the record's TPC-DI batch."""
    return records.where(F.col("_reason").isNotNull()).select(
        F.col("_batch").cast("int").alias("batchid"),
        F.lit(source).alias("messagesource"),
        F.col("_reason").alias("messagetext"),
        F.lit(ALERT).alias("messagetype"),
        F.concat_ws(", ", ident, F.col("_detail")).alias("messagedata"),
        F.col("_rec").alias("messagekey"),
    )


def lineage(pts: str = "pts") -> list[Column]:
    return [
        F.col(pts).alias("_ts"),
        F.to_date(F.col(pts)).alias("_pdate"),
        F.col("source_batch").alias("_batch"),
        F.col("source_file"),
        F.col("line_no"),
        F.col("batch_id"),
        record_key().alias("_rec"),
    ]


def withdrawn_alerts(existing: DataFrame, examined: DataFrame, raised: DataFrame) -> DataFrame:
    """Keys of the T1 alerts in `existing` (DImessages) about records in `examined` (`batchid`,
    `messagesource`, `messagekey`) that the recomputation no longer raises (`raised`)."""
    mine = existing.where((F.col("messagetype") == "Alert") & F.col("messagetext").isin(*ALERT_TEXTS))
    keys = list(wh.DI_MESSAGES.key)
    about = mine.join(examined.distinct(), ["batchid", "messagesource", "messagekey"], "left_semi")
    return about.select(*keys).join(raised.select(*keys), keys, "left_anti")
