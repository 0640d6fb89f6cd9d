"""DimCustomer (part of step T2, CreateAccounts): its change records, its versions and the customer alerts.

Pure Spark transforms (DataFrames in, DataFrames out); the T2 step (`jobs.create_accounts`) reads the staged
records, decides which customers to rebuild and commits. DimAccount (`jobs.accounts`) uses the change-record
contract declared here (`ORDER`, `SEQ`, `FILE`, `MICRO`, the status codes) and cuts its versions at the customer
versions this module builds.

Implements TPC-DI 1.1.0 clause 4.5 for DimCustomer, historical (CustomerMgmt.xml, Batch1) and incremental
(Customer.txt, Batch2..), plus the DimCustomer alerts of DImessages (3.2.18).

**DimCustomer** (SCD2 on the customer id, `jobs.scd2.build_versions`). A customer's change records are its
CustomerMgmt actions NEW, UPDCUST and INACT and its Customer.txt lines:
- NEW sets every field (an absent one is NULL); UPDCUST changes only the fields it carries (`present_fields`:
  present-but-empty sets NULL, absent keeps the old value); INACT changes only the status; a Customer.txt line
  (CDC_FLAG I or U) carries every field. A phone (`C_PHONE_n`) is one field: a record that carries any of its
  parts replaces the whole number (both generators always write the whole element); the tax ids are carried
  and looked up per version;
- status code: NEW/UPDCUST `ACTV`, INACT `INAC`, Customer.txt `C_ST_ID`; `status` is its `st_name` in the
  warehouse `statustype`;
- `gender`: `C_GNDR` in upper case if that is `M` or `F`, else `U` (also when absent);
- `phone1..3` from `C_CTRY_CODE`/`C_AREA_CODE`/`C_LOCAL`/`C_EXT`: country, area and local present ->
  `+ctry (area) local`; no country, area and local present -> `(area) local`; no area, local present ->
  `local`; otherwise NULL; a present extension is appended to a non-NULL number as it is;
- `email1`/`email2` = `C_PRIM_EMAIL`/`C_ALT_EMAIL` (Customer.txt `C_EMAIL_1`/`C_EMAIL_2`);
- `nationaltaxratedesc`/`nationaltaxrate` and `localtaxratedesc`/`localtaxrate`: `tx_name`/`tx_rate` of the
  warehouse `taxrate` row of `C_NAT_TX_ID`/`C_LCL_TX_ID` (NULL when the id is unknown);
- effective date: the day of ActionTS (XML) or the BatchDate of the line's TPC-DI batch (Customer.txt);
  one version per customer per day, the day's last change in declared order winning: TPC-DI batch, then
  ActionTS / BatchDate, then file position (`action_seq` / `CDC_DSN`), then the file name (a total order,
  so duplicated deliveries cannot make the pick depend on partitioning);
- `sk_customerid` = `surrogate_key(customerid, effectivedate)`.

**Alerts** (DImessages, source DimCustomer): "Invalid customer tier" (`C_ID = 1, C_TIER = 4`) and "DOB out of
range" (`C_ID = 1, C_DOB = 1905-09-03`), one per *new-customer record* -- a CustomerMgmt NEW action or a
Customer.txt line (CDC_FLAG I or U: each line carries the whole customer) -- whose tier is not 1, 2 or 3 (an absent
or empty C_TIER included) or whose birth date is before BatchDate minus 100 years or after BatchDate (BatchDate of
the record's TPC-DI batch). UPDCUST actions are not checked. Why: the specification states these checks among the
rules that build a customer's record from a full customer record (NEW, and every line of the incremental
Customer.txt); an UPDCUST carries only the fields it changes and inherits the rest, so it is not such a record.
That is also exactly what the official generator counts in C_TIER_INV, C_DOB_TO and C_DOB_TY. On official SF 3
data, Batch1's CustomerMgmt.xml has 243 NEW actions without a C_TIER attribute and 8 NEW actions with a tier
outside 1-3: 243 + 8 = 251 = C_TIER_INV; its 60 UPDCUST actions with an empty C_TIER and 1 with an invalid tier
are not counted (counting "records that carry the value", as this step once did, gave 8 + 60 + 1 = 69); Batch2's
one Customer.txt line with an empty C_TIER (a U line) is its C_TIER_INV of 1. Birth dates follow the same rule
(UPDCUST actions do not carry C_DOB in the official files). Message key: `tier C_ID=1 ACTION_SEQ=2` (XML) or
`tier C_ID=1 CDC_DSN=7` (Customer.txt); `dob ...` likewise.

A customer that lacks a required field or has an unknown status code in some version gets a `_problem`
(`first_problem`); the T2 step keeps such a customer out (see `jobs.create_accounts`).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs import prospect
from jobs.messages import alerts
from jobs.scd2 import BATCH, TS, build_versions, present_flag, surrogate_key
from schemas import warehouse as wh
from schemas.model import spark_type

SEQ = "_seq"  # position in the file: action_seq (XML) or CDC_DSN (incremental)
FILE = "_file"
MICRO = "_micro"  # micro-batch that staged the record
ORDER = (BATCH, TS, SEQ, FILE)
ACTIVE, INACTIVE = "ACTV", "INAC"

# Customer fields copied as they are: (field, CustomerMgmt.xml column, Customer.txt column).
CUSTOMER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("taxid", "c_tax_id", "c_tax_id"),
    ("lastname", "c_l_name", "c_l_name"),
    ("firstname", "c_f_name", "c_f_name"),
    ("middleinitial", "c_m_name", "c_m_name"),
    ("tier", "c_tier", "c_tier"),
    ("dob", "c_dob", "c_dob"),
    ("addressline1", "c_adline1", "c_adline1"),
    ("addressline2", "c_adline2", "c_adline2"),
    ("postalcode", "c_zipcode", "c_zipcode"),
    ("city", "c_city", "c_city"),
    ("stateprov", "c_state_prov", "c_state_prov"),
    ("country", "c_ctry", "c_ctry"),
    ("email1", "c_prim_email", "c_email_1"),
    ("email2", "c_alt_email", "c_email_2"),
    ("lcl_tx_id", "c_lcl_tx_id", "c_lcl_tx_id"),
    ("nat_tx_id", "c_nat_tx_id", "c_nat_tx_id"),
)
PHONE_PARTS = ("ctry", "area", "local", "ext")
CUSTOMER_VALUES = ("st_id", "gender", "phone1", "phone2", "phone3", *(f for f, _, _ in CUSTOMER_FIELDS))
REQUIRED_CUSTOMER = ("taxid", "lastname", "firstname", "dob", "addressline1", "postalcode", "city", "stateprov")
CUSTOMER_ACTIONS = ("NEW", "UPDCUST", "INACT")


# ------------------------------------------------------------------------------------------ field rules
def phone_number(ctry: Column, area: Column, local: Column, ext: Column) -> Column:
    """The TPC-DI phone format: `+ctry (area) local`, `(area) local` or `local`, then the extension."""
    number = (
        F.when(
            ctry.isNotNull() & area.isNotNull() & local.isNotNull(),
            F.concat(F.lit("+"), ctry, F.lit(" ("), area, F.lit(") "), local),
        )
        .when(area.isNotNull() & local.isNotNull(), F.concat(F.lit("("), area, F.lit(") "), local))
        .when(local.isNotNull(), local)
    )
    return F.when(ext.isNotNull(), F.concat(number, ext)).otherwise(number)


def gender(code: Column) -> Column:
    """`M` or `F` (in any case) in upper case; anything else, NULL included, is `U`."""
    upper = F.upper(F.trim(code))
    return F.when(upper.isin("M", "F"), upper).otherwise(F.lit("U"))


# ------------------------------------------------------------------------------------------ change records
def _customer_values() -> list[tuple[str, Column, tuple[str, ...], Column]]:
    """(field, value from a CustomerMgmt row, the XML fields that carry it, value from a Customer.txt row).

    Gender and the phone numbers are derived per record; a phone (`C_PHONE_n`) is one unit: a record that
    carries any of its parts replaces the whole number."""
    out = [(f, F.col(x), (x,), F.col(c)) for f, x, c in CUSTOMER_FIELDS]
    out.append(("gender", gender(F.col("c_gndr")), ("c_gndr",), gender(F.col("c_gndr"))))
    for n in (1, 2, 3):
        parts = tuple(f"c_{p}_{n}" for p in PHONE_PARTS)
        number = phone_number(*(F.col(p) for p in parts))
        out.append((f"phone{n}", number, parts, number))
    return out


def customer_changes(actions: DataFrame, lines: DataFrame) -> DataFrame:
    """One change record per customer action (NEW/UPDCUST/INACT) of `actions` (staged CustomerMgmt rows) and
    per line of `lines` (staged Customer.txt rows with their `batchdate`), in the `build_versions` contract:
    `customerid`, `_batch`, `_ts`, `_seq`, `_file`, `_micro`, the `CUSTOMER_VALUES` and their `_has_` flags."""
    kind = F.col("action_type")
    fields = _customer_values()
    xml = actions.where(kind.isin(*CUSTOMER_ACTIONS)).withColumn("_pf", F.split(F.col("present_fields"), ","))

    def carried(parts: tuple[str, ...]) -> Column:
        updated = reduce(Column.__or__, [F.array_contains(F.col("_pf"), p) for p in parts])
        return F.when(kind == "NEW", F.lit(True)).when(kind == "UPDCUST", updated).otherwise(F.lit(False))

    from_xml = xml.select(
        F.col("c_id").alias("customerid"),
        F.col("source_batch").alias(BATCH),
        F.col("action_ts").alias(TS),
        F.col("action_seq").alias(SEQ),
        F.col("source_file").alias(FILE),
        F.col("batch_id").alias(MICRO),
        F.when(kind == "INACT", F.lit(INACTIVE)).otherwise(F.lit(ACTIVE)).alias("st_id"),
        F.lit(True).alias(present_flag("st_id")),
        *[value.alias(f) for f, value, _, _ in fields],
        *[carried(parts).alias(present_flag(f)) for f, _, parts, _ in fields],
    )
    from_lines = lines.select(
        F.col("c_id").alias("customerid"),
        F.col("source_batch").alias(BATCH),
        F.col("batchdate").cast("timestamp").alias(TS),
        F.col("cdc_dsn").alias(SEQ),
        F.col("source_file").alias(FILE),
        F.col("batch_id").alias(MICRO),
        F.col("c_st_id").alias("st_id"),
        F.lit(True).alias(present_flag("st_id")),
        *[value.alias(f) for f, _, _, value in fields],
        *[F.lit(True).alias(present_flag(f)) for f, _, _, _ in fields],
    )
    return from_xml.unionByName(from_lines)


# ------------------------------------------------------------------------------------------ versions
def first_problem(*checks: tuple[Column, Column]) -> Column:
    """The first failing check's reason (each check is `(failed, reason)`), NULL when all pass."""
    out = F.lit(None).cast("string")
    for failed, reason in reversed(checks):
        out = F.when(failed, reason).otherwise(out)
    return out


def customer_versions(changes: DataFrame, status_types: DataFrame, tax_rates: DataFrame) -> DataFrame:
    """DimCustomer versions of every customer in `changes`, plus `st_id` (the status code) and `_problem`
    (why the version cannot be loaded; NULL when it can)."""
    raw = build_versions(changes, ["customerid"], ORDER, CUSTOMER_VALUES)
    names = F.broadcast(status_types.select("st_id", F.col("st_name").alias("status")))
    nat = F.broadcast(
        tax_rates.select(
            F.col("tx_id").alias("nat_tx_id"),
            F.col("tx_name").alias("nationaltaxratedesc"),
            F.col("tx_rate").alias("nationaltaxrate"),
        )
    )
    lcl = F.broadcast(
        tax_rates.select(
            F.col("tx_id").alias("lcl_tx_id"),
            F.col("tx_name").alias("localtaxratedesc"),
            F.col("tx_rate").alias("localtaxrate"),
        )
    )
    v = raw.join(names, "st_id", "left").join(nat, "nat_tx_id", "left").join(lcl, "lcl_tx_id", "left")
    missing = [(F.col(c).isNull(), F.lit(f"missing {c}")) for c in REQUIRED_CUSTOMER]
    problem = first_problem(
        (F.col("status").isNull(), F.format_string("unknown status code '%s'", F.coalesce(F.col("st_id"), F.lit("")))),
        *missing,
    )
    return v.select(
        surrogate_key("customerid", "effectivedate").alias("sk_customerid"),
        "customerid",
        "taxid",
        "status",
        "lastname",
        "firstname",
        "middleinitial",
        "gender",
        "tier",
        "dob",
        "addressline1",
        "addressline2",
        "postalcode",
        "city",
        "stateprov",
        "country",
        "phone1",
        "phone2",
        "phone3",
        "email1",
        "email2",
        "nationaltaxratedesc",
        "nationaltaxrate",
        "localtaxratedesc",
        "localtaxrate",
        # the demographics come from Prospect.csv lines, in the driver once the versions are collected
        # (`jobs.prospect.with_demographics`)
        *[F.lit(None).cast(spark_type(wh.DIM_CUSTOMER.column(c).type)).alias(c) for c in prospect.DEMOGRAPHICS],
        "iscurrent",
        "batchid",
        "effectivedate",
        "enddate",
        "st_id",
        problem.alias("_problem"),
    )


# ------------------------------------------------------------------------------------------ alerts
def _identity(label: str, position: str) -> Column:
    """A source record's identity that no micro-batch split changes: customer id and file position."""
    return F.concat(
        F.lit("C_ID="), F.col("c_id").cast("string"), F.lit(f" {label}="), F.col(position).cast("string")
    ).alias("_ident")


def customer_alerts(actions: DataFrame, lines: DataFrame) -> DataFrame:
    """Tier and birth-date alerts of the records given: CustomerMgmt rows and Customer.txt rows, each with the
    `batchdate` of its TPC-DI batch. One alert per new-customer record (a NEW action or a Customer.txt line) whose
    tier is not 1, 2 or 3 (absent or empty included) or whose birth date is out of range (see module doc)."""
    kind = F.col("action_type")
    xml = actions.where(kind == "NEW").select(
        F.col("c_id").alias("customerid"),
        F.col("c_tier").alias("tier"),
        F.col("c_dob").alias("dob"),
        _identity("ACTION_SEQ", "action_seq"),
        "source_batch",
        "batchdate",
    )
    cdc = lines.select(
        F.col("c_id").alias("customerid"),
        F.col("c_tier").alias("tier"),
        F.col("c_dob").alias("dob"),
        _identity("CDC_DSN", "cdc_dsn"),
        "source_batch",
        "batchdate",
    )
    records = xml.unionByName(cdc)
    cid = F.concat(F.lit("C_ID = "), F.col("customerid").cast("string"))
    tier = alerts(
        records,
        source="DimCustomer",
        text="Invalid customer tier",
        when=F.col("tier").isNull() | ~F.col("tier").isin(1, 2, 3),
        data=F.concat(cid, F.lit(", C_TIER = "), F.coalesce(F.col("tier").cast("string"), F.lit(""))),
        key=F.concat(F.lit("tier "), F.col("_ident")),
        batchid=F.col("source_batch"),
    )
    bd = F.col("batchdate")
    dob = alerts(
        records,
        source="DimCustomer",
        text="DOB out of range",
        when=(F.col("dob") < F.add_months(bd, -1200)) | (F.col("dob") > bd),
        data=F.concat(cid, F.lit(", C_DOB = "), F.date_format("dob", "yyyy-MM-dd")),
        key=F.concat(F.lit("dob "), F.col("_ident")),
        batchid=F.col("source_batch"),
    )
    return tier.unionByName(dob)
