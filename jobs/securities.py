"""DimSecurity (part of step T1, CreateSecurities): its change records, its versions cut at the company versions,
and the alerts of the SEC records left out.

Pure Spark transforms (DataFrames in, DataFrames out) on the staged SEC records; the T1 step
(`jobs.create_securities`) reads, chooses the symbols to rebuild and commits. A record's company is resolved
through `jobs.companies`; record order and rejection rules are in `jobs.finwire_records`.

**DimSecurity** (SCD2 on symbol): one version per symbol per day as for companies; effective date = PTS
date; status via StatusType; `sk_companyid` = the company version valid on the version's effective date. A
new version of the referenced company during a security version starts a new security version that day with
the new `sk_companyid` (same attributes, `batchid` of the company version), so every security row lies
inside the validity of its company row (the audit's "DimSecurity SK_CompanyID" check).
`sk_securityid = jobs.scd2.hashed_surrogate_key("dimsecurity", [symbol], effective date)`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.companies import company_reference, resolve_company, unknown_company_detail
from jobs.finwire_records import (
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    UNKNOWN_COMPANY,
    UNKNOWN_STATUS,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from jobs.scd2 import END_OF_TIME, build_versions, hashed_surrogate_key
from schemas import warehouse as wh

SECURITY_VALUES = (
    "issue",
    "status",
    "name",
    "exchangeid",
    "sharesoutstanding",
    "firsttrade",
    "firsttradeonexchange",
    "dividend",
)


def security_changes(sec: DataFrame, status_type: DataFrame, references: DataFrame) -> DataFrame:
    """One change record per SEC record: `symbol`, the DimSecurity values, `_companyid` (the company its
    reference resolves to on the PTS date), lineage, `_ref`, `_reason`/`_detail`."""
    st = status_type.select(F.col("st_id").alias("_st_id"), F.col("st_name").alias("status"))
    rows = sec.withColumnRenamed("status", "_st_id").join(F.broadcast(st), "_st_id", "left")
    mapped = rows.select(
        F.col("symbol"),
        *lineage(),
        F.col("_st_id"),
        F.col("co_name_or_cik"),
        company_reference(F.col("cik"), F.col("company_name")).alias("_ref"),
        F.col("issue_type").alias("issue"),
        F.col("status"),
        F.col("name"),
        F.col("ex_id").alias("exchangeid"),
        F.col("sh_out").alias("sharesoutstanding"),
        F.col("first_trade_date").alias("firsttrade"),
        F.col("first_trade_exchg").alias("firsttradeonexchange"),
        F.col("dividend"),
    )
    resolved = resolve_company(mapped, references)
    missing = missing_required(wh.DIM_SECURITY, ("symbol", *SECURITY_VALUES))
    reason, detail = first_reason(
        (F.col("status").isNull(), UNKNOWN_STATUS, F.concat(F.lit("ST_ID = "), F.col("_st_id"))),
        (missing != "", MISSING_FIELD, F.concat(F.lit("FIELDS = "), missing)),
        (F.col("_companyid").isNull(), UNKNOWN_COMPANY, unknown_company_detail()),
    )
    return resolved.withColumn("_reason", reason).withColumn("_detail", detail).drop("_st_id", "sk_companyid")


def security_versions(changes: DataFrame, companies: DataFrame) -> DataFrame:
    """DimSecurity rows (every declared column) of the symbols in `changes`: SCD2 versions of the loadable
    records, each cut where a new version of its company starts (`split_by_company`)."""
    loadable = changes.where(F.col("_reason").isNull())
    versions = build_versions(loadable, ["symbol"], ORDER, [*SECURITY_VALUES, "_companyid"])
    return split_by_company(versions, companies)


def split_by_company(versions: DataFrame, companies: DataFrame) -> DataFrame:
    """Security versions (`_companyid` valid at their effective date) cut by the company's versions: one row
    per overlap of a security version and a version of its company, with that company version's key.

    The first piece keeps the security version's `batchid`; a piece the company change starts takes the
    company version's `batchid` (the change that made it).
    """
    comp = companies.select(
        F.col("companyid").alias("_companyid"),
        F.col("sk_companyid"),
        F.col("effectivedate").alias("_ceff"),
        F.col("enddate").alias("_cend"),
        F.col("batchid").alias("_cbatch"),
    )
    overlap = (
        (versions["_companyid"] == comp["_companyid"])
        & (comp["_ceff"] < versions["enddate"])
        & (comp["_cend"] > versions["effectivedate"])
    )
    pieces = versions.join(comp, overlap).drop(comp["_companyid"])
    start = F.greatest(F.col("effectivedate"), F.col("_ceff"))
    end = F.least(F.col("enddate"), F.col("_cend"))
    out = pieces.select(
        F.col("symbol"),
        *SECURITY_VALUES,
        F.col("sk_companyid"),
        start.alias("effectivedate"),
        end.alias("enddate"),
        (end == F.lit(END_OF_TIME)).alias("iscurrent"),
        F.when(start == F.col("effectivedate"), F.col("batchid")).otherwise(F.col("_cbatch")).alias("batchid"),
    )
    return out.withColumn("sk_securityid", hashed_surrogate_key("dimsecurity", ["symbol"], "effectivedate"))


def security_alerts(changes: DataFrame) -> DataFrame:
    ident = F.concat(F.lit("S_SYMB = "), F.col("symbol"))
    return rejection_alerts(changes, SOURCE_OF[wh.DIM_SECURITY.name], ident)
