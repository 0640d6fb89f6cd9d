"""DimCompany (part of step T1, CreateSecurities) and the company references of SEC and FIN records.

Pure Spark transforms (DataFrames in, DataFrames out) on the staged CMP records (`schemas.finwire`, FINWIRE
layouts in TPC-DI 1.1.0 clause 2.2.2.8, DimCompany rules in clause 4.5 with 4.5.3.3, the "Invalid SPRating"
alert); the T1 step (`jobs.create_securities`) reads, chooses the keys to rebuild and commits. DimSecurity
(`jobs.securities`) and Financial (`jobs.financials`) resolve their records' company through the references
declared here. The record order, lineage and rejection rules shared by all three are in `jobs.finwire_records`.

**DimCompany** (SCD2 on CIK): one version per CIK per day, the day's last record winning; effective date =
PTS date; `batchid` = the record's TPC-DI batch; status = StatusType name of the status code, industry =
Industry name of the industry id (warehouse tables `statustype`, `industry`); `sprating` = the rating when it
is one of AAA, AA[+/-], A[+/-], BBB[+/-], BB[+/-], B[+/-], CCC[+/-], CC, C, D, and `islowgrade` = false when
it begins with "A" or "BBB", else true. Otherwise both are NULL and an Alert "Invalid SPRating" with
`CO_ID = <CIK>, CO_SP_RATE = <rating>` is raised, once per DimCompany row (the version's record). A blank
rating is not a valid one either (spec silent; it gets the alert with an empty rating).
`sk_companyid = jobs.scd2.surrogate_key(CIK, effective date)`.

**Company reference** (last field of SEC and FIN): a CIK when it is 10 digits, else a company name. It
resolves to the DimCompany version valid on the record's PTS date (effectivedate <= day < enddate), by CIK
or by the name that version has. Spec silent on two companies bearing the referenced name that day: the
smallest CIK is taken.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs.finwire_records import (
    INVALID_SP_RATING,
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    UNKNOWN_INDUSTRY,
    UNKNOWN_STATUS,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from jobs.messages import alerts
from jobs.scd2 import build_versions, surrogate_key, valid_at
from schemas import warehouse as wh

VALID_SP_RATINGS = (
    *("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-"),
    *("BB+", "BB", "BB-", "B+", "B", "B-", "CCC+", "CCC", "CCC-", "CC", "C", "D"),
)

COMPANY_VALUES = (
    "status",
    "name",
    "industry",
    "sprating",
    "islowgrade",
    "ceo",
    "addressline1",
    "addressline2",
    "postalcode",
    "city",
    "stateprov",
    "country",
    "description",
    "foundingdate",
)

_CIK_PATTERN = r"^[0-9]{10}$"
_DAYS_PER_KEY = 100_000  # `surrogate_key` = CIK * 100000 + days since 1900-01-01 (see company_of_key)


# ------------------------------------------------------------------------------------------- references
def company_reference(cik: Column, name: Column) -> Column:
    """`C<CIK>` when the reference is a 10-digit CIK, else `N<name>`: the join key of `company_references`."""
    as_cik = F.coalesce(cik, F.when(name.rlike(_CIK_PATTERN), name))
    return F.when(as_cik.isNotNull(), F.concat(F.lit("C"), as_cik.cast("bigint").cast("string"))).otherwise(
        F.concat(F.lit("N"), name)
    )


def company_references(companies: DataFrame) -> DataFrame:
    """Every DimCompany version under the two references that reach it: `C<CIK>` and `N<name>`."""
    cols = ("companyid", "sk_companyid", "effectivedate", "enddate")
    by_cik = companies.select(F.concat(F.lit("C"), F.col("companyid").cast("string")).alias("_ref"), *cols)
    by_name = companies.select(F.concat(F.lit("N"), F.col("name")).alias("_ref"), *cols)
    return by_cik.unionByName(by_name)


def company_of_key(sk_companyid: Column) -> Column:
    """The CIK of a DimCompany surrogate key (`surrogate_key` is `CIK * 100000 + days since 1900-01-01`)."""
    return F.floor(sk_companyid / F.lit(_DAYS_PER_KEY)).cast("bigint")


def resolve_company(records: DataFrame, references: DataFrame) -> DataFrame:
    """`records` (with `_ref`, `_pdate` and unique `source_file, line_no`) plus `_companyid` and `sk_companyid`
    of the company version their reference names on `_pdate`; NULL when there is none. Of several companies
    bearing the referenced name that day, the smallest CIK."""
    joined = valid_at(
        records, "_ref", "_pdate", references, "_ref", {"companyid": "_companyid", "sk_companyid": "sk_companyid"}
    )
    first = Window.partitionBy("source_file", "line_no").orderBy(F.col("_companyid").asc_nulls_last())
    return joined.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop("_n")


def unknown_company_detail() -> Column:
    return F.concat(
        F.lit("CO_NAME_OR_CIK = "), F.col("co_name_or_cik"), F.lit(", DAY = "), F.col("_pdate").cast("string")
    )


def references_to(cmp: DataFrame, ciks: DataFrame) -> DataFrame:
    """`_ref` values that can reach the companies `ciks` (`companyid`): their CIKs and every name their CMP
    records (`cmp`, with `companyid`) carry."""
    by_cik = ciks.select(F.concat(F.lit("C"), F.col("companyid").cast("string")).alias("_ref"))
    by_name = cmp.join(ciks, "companyid", "left_semi").select(F.concat(F.lit("N"), F.col("company_name")).alias("_ref"))
    return by_cik.unionByName(by_name).distinct()


def companies_reached(references: DataFrame, refs: DataFrame) -> DataFrame:
    """`companyid` of every company that one of `refs` (`_ref`) names on some day (`company_references`)."""
    return references.join(refs, "_ref", "left_semi").select("companyid").distinct()


# ------------------------------------------------------------------------------------------- DimCompany
def company_changes(cmp: DataFrame, status_type: DataFrame, industry: DataFrame) -> DataFrame:
    """One change record per CMP record: `companyid`, the DimCompany values, lineage (`_ts`, `_pdate`, `_batch`,
    file, line, `_rec`), `_sp_raw` (the rating as filed), `_reason`/`_detail` (why it cannot be loaded)."""
    st = status_type.select(F.col("st_id").alias("_st_id"), F.col("st_name").alias("status"))
    ind = industry.select(F.col("in_id").alias("industry_id"), F.col("in_name").alias("industry"))
    rows = (
        cmp.withColumnRenamed("status", "_st_id")
        .join(F.broadcast(st), "_st_id", "left")
        .join(F.broadcast(ind), "industry_id", "left")
    )
    rating = F.col("sp_rating")
    valid = F.coalesce(rating.isin(*VALID_SP_RATINGS), F.lit(False))
    mapped = rows.select(
        F.col("cik").cast("bigint").alias("companyid"),
        *lineage(),
        F.col("_st_id"),
        F.col("industry_id"),
        F.col("status"),
        F.col("company_name").alias("name"),
        F.col("industry"),
        F.when(valid, rating).alias("sprating"),
        F.when(valid, ~(rating.startswith("A") | rating.startswith("BBB"))).alias("islowgrade"),
        F.col("ceo_name").alias("ceo"),
        F.col("addr_line1").alias("addressline1"),
        F.col("addr_line2").alias("addressline2"),
        F.col("postal_code").alias("postalcode"),
        F.col("city"),
        F.col("state_province").alias("stateprov"),
        F.col("country"),
        F.col("description"),
        F.col("founding_date").alias("foundingdate"),
        rating.alias("_sp_raw"),
    )
    missing = missing_required(wh.DIM_COMPANY, ("companyid", *COMPANY_VALUES))
    reason, detail = first_reason(
        (F.col("status").isNull(), UNKNOWN_STATUS, F.concat(F.lit("ST_ID = "), F.coalesce(F.col("_st_id"), F.lit("")))),
        (
            F.col("industry").isNull(),
            UNKNOWN_INDUSTRY,
            F.concat(F.lit("IN_ID = "), F.coalesce(F.col("industry_id"), F.lit(""))),
        ),
        (missing != "", MISSING_FIELD, F.concat(F.lit("FIELDS = "), missing)),
    )
    return mapped.withColumn("_reason", reason).withColumn("_detail", detail).drop("_st_id", "industry_id")


def company_versions(changes: DataFrame) -> DataFrame:
    """DimCompany rows (every declared column) of the CIKs in `changes`, from their loadable records; plus
    `_sp_raw` and `_rec`, the rating as filed and the identity of the record that made each version."""
    loadable = changes.where(F.col("_reason").isNull())
    versions = build_versions(loadable, ["companyid"], ORDER, [*COMPANY_VALUES, "_sp_raw", "_rec"])
    return versions.withColumn("sk_companyid", surrogate_key("companyid", "effectivedate"))


def company_alerts(changes: DataFrame, versions: DataFrame) -> DataFrame:
    """Alerts of DimCompany: records left out (`rejection_alerts`) and rows with an invalid S&P rating."""
    source = SOURCE_OF[wh.DIM_COMPANY.name]
    co_id = F.concat(F.lit("CO_ID = "), F.col("companyid").cast("string"))
    rating = alerts(
        versions,
        source=source,
        text=INVALID_SP_RATING,
        when=F.col("sprating").isNull(),
        data=F.concat(co_id, F.lit(", CO_SP_RATE = "), F.coalesce(F.col("_sp_raw"), F.lit(""))),
        key=F.col("_rec"),
        batchid=F.col("batchid"),
    )
    return rejection_alerts(changes, source, co_id).unionByName(rating)
