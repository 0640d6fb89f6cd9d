"""T1 (CreateSecurities): DimCompany, DimSecurity and Financial from the staged FINWIRE records.

Implements the historical-load rules of TPC-DI 1.1.0, clause 4.5, for DimCompany (with 4.5.3.3, the "Invalid
SPRating" alert), DimSecurity and Financial, on the staged tables `staging.finwire_cmp|sec|fin`
(`schemas.finwire`; FINWIRE layouts in clause 2.2.2.8). Every micro-batch recomputes the full history of every
natural key it touches from all records staged so far and replaces that key's rows (`jobs.scd2`), so a Batch1
whose FINWIRE files arrive over several micro-batches, in any quarter order, ends exactly where a single load
ends.

Rules:
- **Declared order** of FINWIRE records: posting timestamp (PTS), then file name, then line. A file delivered
  again (same name) replaces its earlier lines: per (file, line) the latest micro-batch's line counts.
- **DimCompany** (SCD2 on CIK): one version per CIK per day, the day's last record winning; effective date =
  PTS date; `batchid` = the record's TPC-DI batch; status = StatusType name of the status code, industry =
  Industry name of the industry id (warehouse tables `statustype`, `industry`); `sprating` = the rating when it
  is one of AAA, AA[+/-], A[+/-], BBB[+/-], BB[+/-], B[+/-], CCC[+/-], CC, C, D, and `islowgrade` = false when
  it begins with "A" or "BBB", else true. Otherwise both are NULL and an Alert "Invalid SPRating" with
  `CO_ID = <CIK>, CO_SP_RATE = <rating>` is raised, once per DimCompany row (the version's record). A blank
  rating is not a valid one either (spec silent; it gets the alert with an empty rating).
  `sk_companyid = jobs.scd2.surrogate_key(CIK, effective date)`.
- **Company reference** (last field of SEC and FIN): a CIK when it is 10 digits, else a company name. It
  resolves to the DimCompany version valid on the record's PTS date (effectivedate <= day < enddate), by CIK
  or by the name that version has. Spec silent on two companies bearing the referenced name that day: the
  smallest CIK is taken.
- **DimSecurity** (SCD2 on symbol): one version per symbol per day as for companies; effective date = PTS
  date; status via StatusType; `sk_companyid` = the company version valid on the version's effective date. A
  new version of the referenced company during a security version starts a new security version that day with
  the new `sk_companyid` (same attributes, `batchid` of the company version), so every security row lies
  inside the validity of its company row (the audit's "DimSecurity SK_CompanyID" check).
  `sk_securityid = jobs.scd2.hashed_surrogate_key("dimsecurity", [symbol], effective date)`.
- **Financial**: one row per FIN record, `sk_companyid` = the company version valid on the PTS date; when a
  (CIK, year, quarter) repeats, the last record in declared order wins (the table key is
  `sk_companyid, fi_year, fi_qtr`, so a company may not have two rows for a quarter).
- **Records that cannot be loaded** are left out of the warehouse and raise one Alert each (`messagekey` =
  `<file>:<line>`, batch = the record's TPC-DI batch), with the reason as message text: "Unknown company"
  (no company version with that CIK/name on the PTS date), "Unknown status type", "Unknown industry",
  "Missing required field" (a column the warehouse declares NOT NULL would be NULL). Left-out records do not
  take part in versioning (the key's history is built from the loadable records only, so its rows still
  chain). When a later micro-batch makes such a record loadable (its company arrives), its alert is withdrawn:
  the alerts of every recomputed record are replaced by the ones the recomputation raises.

Incrementality (what a micro-batch recomputes):
- companies: the CIKs with CMP records in this micro-batch;
- securities: the symbols with SEC records in this micro-batch, plus every symbol with a SEC record referring
  to a touched company (by its CIK or by any name in its CMP records);
- financials: the touched companies plus every company named (on any day) by the reference of a FIN record
  that may have changed resolution -- this micro-batch's FIN records and those referring to a touched company
  -- so the companies a record moves from and to are both rebuilt; their rows are rebuilt from every FIN
  record referring to them;
- when a StatusType or Industry file arrives, everything is recomputed (names and flags depend on them).
What arrived is read from the names of the micro-batch's landing files (`scope.file_seq`): a micro-batch
without FINWIRE, StatusType or Industry files does nothing, without a Spark job. Rows of recomputed keys that
no longer exist are deleted in the same commit. Financial has no CIK column: the CIK of a row is recovered from
its `sk_companyid` (`company_of_key`, the inverse of `surrogate_key`).

Each table is committed once per micro-batch (`T1/<table>`, micro-batch id; DImessages as `T1/dimessages`,
upserts and withdrawals in one MERGE, stamped like `jobs.messages.commit_messages`), and a table already
committed for this micro-batch is skipped, so a rerun changes nothing. A few small intermediate results are
computed once and their lineage cut (`_pin`), which keeps the step at a handful of Spark queries.
"""

from __future__ import annotations

from functools import reduce

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs.landing import FINWIRE as FINWIRE_SOURCE
from jobs.landing import nondelimited_source_for_file, source_for_file
from jobs.messages import ALERT, alerts
from jobs.scd2 import END_OF_TIME, build_versions, hashed_surrogate_key, surrogate_key, valid_at, version_changes
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import Table
from schemas.staging import FINWIRE_TABLES
from streamdi.context import JobContext

STEP = "T1"
CMP, SEC, FIN = FINWIRE_TABLES["CMP"], FINWIRE_TABLES["SEC"], FINWIRE_TABLES["FIN"]

VALID_SP_RATINGS = (
    *("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-"),
    *("BB+", "BB", "BB-", "B+", "B", "B-", "CCC+", "CCC", "CCC-", "CC", "C", "D"),
)

# Declared order of FINWIRE records (after `latest_delivery`, (file, line) is unique).
ORDER = ("_ts", "source_file", "line_no")

INVALID_SP_RATING = "Invalid SPRating"
UNKNOWN_COMPANY = "Unknown company"
UNKNOWN_STATUS = "Unknown status type"
UNKNOWN_INDUSTRY = "Unknown industry"
MISSING_FIELD = "Missing required field"
ALERT_TEXTS = (INVALID_SP_RATING, UNKNOWN_COMPANY, UNKNOWN_STATUS, UNKNOWN_INDUSTRY, MISSING_FIELD)

SOURCE_OF = {wh.DIM_COMPANY.name: "DimCompany", wh.DIM_SECURITY.name: "DimSecurity", wh.FINANCIAL.name: "Financial"}

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
FINANCIAL_VALUES = tuple(c for c in wh.FINANCIAL.column_names if c != "sk_companyid")

_CIK_PATTERN = r"^[0-9]{10}$"
_DAYS_PER_KEY = 100_000  # `surrogate_key` = CIK * 100000 + days since 1900-01-01 (see company_of_key)


# ------------------------------------------------------------------------------------------- shared pieces
def latest_delivery(staged: DataFrame) -> DataFrame:
    """One row per (file, line): the one staged by the latest micro-batch (a file delivered again wins)."""
    latest = Window.partitionBy("source_file", "line_no").orderBy(F.col("batch_id").desc())
    return staged.withColumn("_n", F.row_number().over(latest)).where(F.col("_n") == 1).drop("_n")


def record_key() -> Column:
    """A staged record's identity, `<file>:<line>` (the `messagekey` of its alerts)."""
    return F.concat_ws(":", F.col("source_file"), F.col("line_no").cast("string"))


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


def missing_required(table: Table, columns: tuple[str, ...]) -> Column:
    """Comma list of the `columns` that `table` declares NOT NULL and that are NULL ('' when none)."""
    required = [c for c in columns if not table.column(c).nullable]
    return F.concat_ws(",", *[F.when(F.col(c).isNull(), F.lit(c)) for c in required])


def _first_reason(*checks: tuple[Column, str, Column]) -> tuple[Column, Column]:
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


def _lineage(pts: str = "pts") -> list[Column]:
    return [
        F.col(pts).alias("_ts"),
        F.to_date(F.col(pts)).alias("_pdate"),
        F.col("source_batch").alias("_batch"),
        F.col("source_file"),
        F.col("line_no"),
        F.col("batch_id"),
        record_key().alias("_rec"),
    ]


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
        *_lineage(),
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
    reason, detail = _first_reason(
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


# ------------------------------------------------------------------------------------------- DimSecurity
def security_changes(sec: DataFrame, status_type: DataFrame, references: DataFrame) -> DataFrame:
    """One change record per SEC record: `symbol`, the DimSecurity values, `_companyid` (the company its
    reference resolves to on the PTS date), lineage, `_ref`, `_reason`/`_detail`."""
    st = status_type.select(F.col("st_id").alias("_st_id"), F.col("st_name").alias("status"))
    rows = sec.withColumnRenamed("status", "_st_id").join(F.broadcast(st), "_st_id", "left")
    mapped = rows.select(
        F.col("symbol"),
        *_lineage(),
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
    reason, detail = _first_reason(
        (F.col("status").isNull(), UNKNOWN_STATUS, F.concat(F.lit("ST_ID = "), F.col("_st_id"))),
        (missing != "", MISSING_FIELD, F.concat(F.lit("FIELDS = "), missing)),
        (F.col("_companyid").isNull(), UNKNOWN_COMPANY, _unknown_company_detail()),
    )
    return resolved.withColumn("_reason", reason).withColumn("_detail", detail).drop("_st_id", "sk_companyid")


def _unknown_company_detail() -> Column:
    return F.concat(
        F.lit("CO_NAME_OR_CIK = "), F.col("co_name_or_cik"), F.lit(", DAY = "), F.col("_pdate").cast("string")
    )


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


# ------------------------------------------------------------------------------------------- Financial
def financial_records(fin: DataFrame, references: DataFrame) -> DataFrame:
    """One record per FIN record: the Financial values, `_companyid`/`sk_companyid` of the company version
    valid on the PTS date, lineage, `_ref`, `_reason`/`_detail`."""
    mapped = fin.select(
        *_lineage(),
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
    reason, detail = _first_reason(
        (missing != "", MISSING_FIELD, F.concat(F.lit("FIELDS = "), missing)),
        (F.col("_companyid").isNull(), UNKNOWN_COMPANY, _unknown_company_detail()),
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


def withdrawn_alerts(existing: DataFrame, examined: DataFrame, raised: DataFrame) -> DataFrame:
    """Keys of the T1 alerts in `existing` (DImessages) about records in `examined` (`batchid`,
    `messagesource`, `messagekey`) that the recomputation no longer raises (`raised`)."""
    mine = existing.where((F.col("messagetype") == "Alert") & F.col("messagetext").isin(*ALERT_TEXTS))
    keys = list(wh.DI_MESSAGES.key)
    about = mine.join(examined.distinct(), ["batchid", "messagesource", "messagekey"], "left_semi")
    return about.select(*keys).join(raised.select(*keys), keys, "left_anti")


def references_to(cmp: DataFrame, ciks: DataFrame) -> DataFrame:
    """`_ref` values that can reach the companies `ciks` (`companyid`): their CIKs and every name their CMP
    records (`cmp`, with `companyid`) carry."""
    by_cik = ciks.select(F.concat(F.lit("C"), F.col("companyid").cast("string")).alias("_ref"))
    by_name = cmp.join(ciks, "companyid", "left_semi").select(F.concat(F.lit("N"), F.col("company_name")).alias("_ref"))
    return by_cik.unionByName(by_name).distinct()


def companies_reached(references: DataFrame, refs: DataFrame) -> DataFrame:
    """`companyid` of every company that one of `refs` (`_ref`) names on some day (`company_references`)."""
    return references.join(refs, "_ref", "left_semi").select("companyid").distinct()


# ------------------------------------------------------------------------------------------- I/O edge
def _staged(ctx: JobContext, scope: BatchScope, table: Table, *, upto: bool) -> DataFrame:
    df = scope.staged(ctx, table, upto=upto)
    return df if df is not None else ctx.lake.empty(table)


def _warehouse(ctx: JobContext, table: Table) -> DataFrame:
    return ctx.lake.read_or_empty(table)


def arrived_sources(files: list[str]) -> set[str]:
    """Which of FINWIRE, StatusType and Industry the landing `files` of a micro-batch belong to (by name)."""
    found = set()
    for file in files:
        if nondelimited_source_for_file(file) == FINWIRE_SOURCE:
            found.add(FINWIRE_SOURCE)
        elif (source := source_for_file(file, 1, (src.STATUS_TYPE, src.INDUSTRY))) is not None:
            found.add(source.name)
    return found


def _with_reference(staged: DataFrame) -> DataFrame:
    return latest_delivery(staged).withColumn("_ref", company_reference(F.col("cik"), F.col("company_name")))


def _pin(df: DataFrame) -> DataFrame:
    """Compute `df` now and cut its lineage: the small intermediate results are reused by several later
    plans, which then stay shallow (cheap to analyse) and do not recompute them."""
    return df.localCheckpoint(eager=True)


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the companies, securities and financials this micro-batch touches; one commit per table.

    Returns the rows written (upserted) per table name; tables already committed for this micro-batch are
    skipped and absent from the result.
    """
    targets = (wh.DIM_COMPANY, wh.DIM_SECURITY, wh.FINANCIAL, wh.DI_MESSAGES)
    if all(scope.committed(ctx, STEP, t) for t in targets):
        return {}
    arrived = arrived_sources(sorted(scope.file_seq))
    everything = bool(arrived & {src.STATUS_TYPE.name, src.INDUSTRY.name})
    if not arrived:
        return {}
    return _run(ctx, scope, everything)


def _only(df: DataFrame, keys: DataFrame | None, on: str) -> DataFrame:
    """The rows of `df` whose `on` is in `keys`; all of them when `keys` is None (everything recomputed)."""
    return df if keys is None else df.join(keys, on, "left_semi")


def _stale(current: DataFrame, rows: DataFrame, table: Table, natural: str, keys: DataFrame | None) -> DataFrame:
    """Keys of the rows of `current` (of the natural keys `keys`; all when None) that `rows` no longer holds."""
    if keys is not None:
        return version_changes(current, rows, table, [natural], keys)[1]
    key = list(table.key)
    return current.select(*key).join(rows.select(*key), key, "left_anti")


def _run(ctx: JobContext, scope: BatchScope, everything: bool) -> dict[str, int]:
    """The recomputation; with `everything`, of every key (StatusType or Industry arrived)."""
    this_batch = F.col("batch_id") == F.lit(scope.batch_id)
    status_type = _warehouse(ctx, wh.STATUS_TYPE)
    industry = _warehouse(ctx, wh.INDUSTRY)

    # DimCompany: the CIKs with CMP records in this micro-batch (None: all)
    cmp_all = latest_delivery(_staged(ctx, scope, CMP, upto=True))
    cmp_all = cmp_all.withColumn("companyid", F.col("cik").cast("bigint"))
    touched = None
    if not everything:
        cmp_all = _pin(cmp_all)
        touched = _pin(cmp_all.where(this_batch).select("companyid").distinct())
    changes = company_changes(_only(cmp_all, touched, "companyid"), status_type, industry)
    versions = _pin(company_versions(changes))
    current_companies = _warehouse(ctx, wh.DIM_COMPANY)
    company_deletes = _stale(current_companies, versions, wh.DIM_COMPANY, "companyid", touched)
    columns = wh.DIM_COMPANY.column_names
    companies = versions.select(*columns)
    if touched is not None:
        kept = current_companies.join(touched, "companyid", "left_anti").select(*columns)
        companies = _pin(kept.unionByName(companies))
    references = company_references(companies)

    # DimSecurity: symbols with SEC records in this micro-batch or referring to a touched company
    sec_all = _with_reference(_staged(ctx, scope, SEC, upto=True))
    symbols = None
    if touched is not None:
        reaching = sec_all.join(references_to(cmp_all, touched), "_ref", "left_semi").select("symbol")
        symbols = _pin(sec_all.where(this_batch).select("symbol").unionByName(reaching).distinct())
    sec_examined = _only(sec_all, symbols, "symbol").drop("_ref")
    sec_changes = _pin(security_changes(sec_examined, status_type, references))
    securities = security_versions(sec_changes, companies)
    security_deletes = _stale(_warehouse(ctx, wh.DIM_SECURITY), securities, wh.DIM_SECURITY, "symbol", symbols)

    # Financial: the companies a FIN record may have moved to or from (see the module docstring)
    fin_all = _with_reference(_staged(ctx, scope, FIN, upto=True))
    fin_examined = fin_all
    current_fin = _warehouse(ctx, wh.FINANCIAL)
    fin_ciks = None
    if touched is not None:
        fin_all = _pin(fin_all)
        moved = fin_all.join(references_to(cmp_all, touched), "_ref", "left_semi")
        moved = moved.unionByName(fin_all.where(this_batch))
        fin_ciks = _pin(touched.unionByName(companies_reached(references, moved.select("_ref"))).distinct())
        hit = references_to(cmp_all, fin_ciks).withColumn("_hit", F.lit(True))
        fin_examined = fin_all.join(hit, "_ref", "left").where(F.coalesce(F.col("_hit"), this_batch)).drop("_hit")
        current_fin = current_fin.join(
            fin_ciks, company_of_key(current_fin["sk_companyid"]) == fin_ciks["companyid"], "left_semi"
        )
    fin_records = _pin(financial_records(fin_examined.drop("_ref"), references))
    by_company = None if fin_ciks is None else fin_ciks.withColumnRenamed("companyid", "_companyid")
    financials = financial_rows(_only(fin_records, by_company, "_companyid"))
    fin_key = list(wh.FINANCIAL.key)
    financial_deletes = current_fin.select(*fin_key).join(financials.select(*fin_key), fin_key, "left_anti")

    # DImessages: the alerts of every examined record replace the ones it raised before
    raised = (
        company_alerts(changes, versions)
        .unionByName(security_alerts(sec_changes))
        .unionByName(financial_alerts(fin_records))
    )
    examined = [(changes, wh.DIM_COMPANY), (sec_changes, wh.DIM_SECURITY), (fin_records, wh.FINANCIAL)]
    examined_keys = reduce(
        DataFrame.unionByName,
        [
            df.select(
                F.col("_batch").alias("batchid"),
                F.lit(SOURCE_OF[table.name]).alias("messagesource"),
                F.col("_rec").alias("messagekey"),
            )
            for df, table in examined
        ],
    )
    withdrawn = withdrawn_alerts(_warehouse(ctx, wh.DI_MESSAGES), examined_keys, raised)

    written: dict[str, int] = {}
    for table, rows, deletes in (
        (wh.DIM_COMPANY, versions, company_deletes),
        (wh.DIM_SECURITY, securities, security_deletes),
        (wh.FINANCIAL, financials, financial_deletes),
    ):
        n = _commit(ctx, scope, table, rows, deletes)
        if n is not None:
            written[table.name] = n
    n = _commit_alerts(ctx, scope, raised, withdrawn)
    if n is not None:
        written[wh.DI_MESSAGES.name] = n
    return written


def _commit(ctx: JobContext, scope: BatchScope, table: Table, rows: DataFrame, deletes: DataFrame) -> int | None:
    """Upsert `rows` and delete the keys in `deletes` in one commit `T1/<table>`; None if already committed.

    Rows and delete keys are computed by one Spark query (a flagged union), split afterwards in Arrow."""
    if scope.committed(ctx, STEP, table):
        return None
    flag, names = "_delete", table.column_names
    keep = rows.select(*[F.col(c) for c in table.column_names], F.lit(False).alias(flag))
    drop = deletes.select(
        *[F.col(c) if c in table.key else F.lit(None).cast(rows.schema[c].dataType).alias(c) for c in names],
        F.lit(True).alias(flag),
    )
    both = keep.unionByName(drop).toArrow()
    is_delete = both[flag]
    data = ctx.lake.to_arrow(table, both.filter(pc.invert(is_delete)).drop_columns([flag]))
    doomed = both.filter(is_delete).select(list(table.key))
    ctx.lake.upsert(table, data, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=doomed)
    return data.num_rows


def _commit_alerts(ctx: JobContext, scope: BatchScope, raised: DataFrame, withdrawn: DataFrame) -> int | None:
    """Upsert the raised alerts (time = their batch's BatchDate, as `jobs.messages.commit_messages` does) and
    delete the withdrawn ones, in one commit `T1/dimessages`."""
    if scope.committed(ctx, STEP, wh.DI_MESSAGES):
        return None
    dates = scope.dates_frame(ctx).select(
        F.col("source_batch").alias("batchid"), F.col("batchdate").cast("timestamp").alias("messagedateandtime")
    )
    full = raised.join(dates, "batchid", "left").select(*wh.DI_MESSAGES.column_names)
    return _commit(ctx, scope, wh.DI_MESSAGES, full, withdrawn)
