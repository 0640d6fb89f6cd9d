"""Financial (part of step T1, CreateSecurities): one row per company and quarter from the staged FIN records.

Pure Spark transforms (DataFrames in, DataFrames out); the T1 step (`jobs.create_securities`) reads, chooses the
companies to rebuild and commits. A record's company is resolved through `jobs.companies`; record order and
rejection rules are in `jobs.finwire_records`.

**Financial**: one row per FIN record, `sk_companyid` = the company version valid on the PTS date; when a
(CIK, year, quarter) repeats, the last record in declared order wins (the table key is
`sk_companyid, fi_year, fi_qtr`, so a company may not have two rows for a quarter).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from jobs.companies import company_reference, resolve_company, unknown_company_detail
from jobs.finwire_records import (
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    UNKNOWN_COMPANY,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from schemas import warehouse as wh

FINANCIAL_VALUES = tuple(c for c in wh.FINANCIAL.column_names if c != "sk_companyid")


def financial_records(fin: DataFrame, references: DataFrame) -> DataFrame:
    """One record per FIN record: the Financial values, `_companyid`/`sk_companyid` of the company version
    valid on the PTS date, lineage, `_ref`, `_reason`/`_detail`."""
    mapped = fin.select(
        *lineage(),
        F.col("co_name_or_cik"),
        company_reference(F.col("cik"), F.col("company_name")).alias("_ref"),
        F.col("year").alias("fi_year"),
        F.col("quarter").alias("fi_qtr"),
        F.col("qtr_start_date").alias("fi_qtr_start_date"),
        F.col("revenue").alias("fi_revenue"),
        F.col("earnings").alias("fi_net_earn"),
        F.col("eps").alias("fi_basic_eps"),
        F.col("diluted_eps").alias("fi_dilut_eps"),
        F.col("margin").alias("fi_margin"),
        F.col("inventory").alias("fi_inventory"),
        F.col("assets").alias("fi_assets"),
        F.col("liabilities").alias("fi_liability"),
        F.col("sh_out").alias("fi_out_basic"),
        F.col("diluted_sh_out").alias("fi_out_dilut"),
    )
    resolved = resolve_company(mapped, references)
    missing = missing_required(wh.FINANCIAL, FINANCIAL_VALUES)
    reason, detail = first_reason(
        (missing != "", MISSING_FIELD, F.concat(F.lit("FIELDS = "), missing)),
        (F.col("_companyid").isNull(), UNKNOWN_COMPANY, unknown_company_detail()),
    )
    return resolved.withColumn("_reason", reason).withColumn("_detail", detail)


def financial_rows(records: DataFrame) -> DataFrame:
    """Financial rows of the loadable records: per (CIK, year, quarter) the last record in declared order."""
    last = Window.partitionBy("_companyid", "fi_year", "fi_qtr").orderBy(*[F.col(c).desc() for c in ORDER])
    loadable = records.where(F.col("_reason").isNull())
    ranked = loadable.withColumn("_n", F.row_number().over(last)).where(F.col("_n") == 1)
    return ranked.select(*wh.FINANCIAL.column_names)


def financial_alerts(records: DataFrame) -> DataFrame:
    ident = F.concat(
        F.lit("FI_YEAR = "),
        F.col("fi_year").cast("string"),
        F.lit(", FI_QTR = "),
        F.col("fi_qtr").cast("string"),
    )
    return rejection_alerts(records, SOURCE_OF[wh.FINANCIAL.name], ident)
