"""T2 (CreateAccounts): DimCustomer and DimAccount, with the customer alerts.

Implements TPC-DI 1.1.0 clause 4.5 for DimCustomer and DimAccount, historical (CustomerMgmt.xml, Batch1) and
incremental (Customer.txt / Account.txt, Batch2..), plus the DimCustomer alerts of DImessages (3.2.18).

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

**DimAccount** (SCD2 on the account id). An account's change records are the CustomerMgmt actions NEW (its
account), ADDACCT, UPDACCT, CLOSEACCT and its Account.txt lines: NEW/ADDACCT set every field (status `ACTV`),
UPDACCT changes the fields it carries (status `ACTV`), CLOSEACCT changes only the status (`INAC`), an
Account.txt line carries every field (status `CA_ST_ID`). The account's customer is the enclosing `C_ID` (XML)
or `CA_C_ID`; `accountdesc` = `CA_NAME`, `taxstatus` = `CA_TAX_ST`. The account's own history is then **cut at
every version of its customer**: each account version is the intersection of an account-record version and a
customer version, so a new customer version (UPDCUST, INACT, a Customer.txt line) gives each of the
customer's accounts a new version the same day that points to the new `sk_customerid`, and every account
version lies inside the customer version it points to (the audit's SK_CustomerID rule). Accounts already
closed are cut too: "the customer's accounts open at that time" is read as the accounts that exist then,
since a closed account's open-ended version must not outlive the customer version it points to. While the
customer's status is `INAC` the account's status is `INAC` too (INACT inactivates the customer's accounts;
the audit requires an inactive account row for every inactive customer version).
`sk_brokerid` is the DimBroker row of `CA_B_ID` valid on the account version's effective date. `batchid` is
the TPC-DI batch of the change that started the version (the account's or the customer's; the later-starting
one, the greater batch on a tie). `sk_accountid` = `surrogate_key(accountid, effectivedate)`.

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

Decisions where the spec is silent:
- a customer whose status code is unknown or that lacks a required field (tax id, names, DOB, address line 1,
  postal code, city, state) in some version is kept out of DimCustomer; an account with a version whose
  customer, broker or status cannot be resolved (no customer version on that day, no DimBroker row, unknown
  code) is kept out of DimAccount. Either raises an Alert ("Customer not loaded" / "Account not loaded", key
  `C_ID=..` / `CA_ID=..`, data with the reason) and is retried when touched again. The whole key is kept out,
  not just the bad version, so that no gap or stale version is ever written. When a retry succeeds (or the
  reason moves to another batch) the old "not loaded" alert is deleted in the same DImessages commit, so a
  wait that resolves leaves the tables as a load of everything at once would. `jobs.messages.commit_messages`
  has no deletes, so T2 builds its message rows the same way (time = BatchDate of the batch) in
  `_message_changes` and commits them itself;
- alerts need the BatchDate; the alerts of a record whose TPC-DI batch is not dated yet are raised when the
  date arrives (`scope.newly_dated`). CustomerMgmt versions do not wait (their dates are their ActionTS);
- DimBroker has one version per broker (TPC-DI 4.5.4), so account versions are not cut at broker versions.

Incrementality (recompute per touched key, `jobs.scd2`): touched customers are the customers with change
records in this micro-batch (Customer.txt lines only once their batch is dated; all lines of newly dated
batches); touched accounts are the accounts with records in this micro-batch (likewise) plus every account
whose records name a touched customer. When the micro-batch brings StatusType or TaxRate lines every customer
and account is touched, when it brings HR or Date lines (DimBroker) every account. Each touched key's history
is recomputed from all its records staged so far and replaces the key's rows, so any split of the input into
micro-batches, in any order within a day, ends in the same tables. A micro-batch that brings none of these
files and dates no batch costs nothing (no Spark job).

Commits: DimCustomer, DimAccount, DImessages, one MERGE each with app transaction `T2/<table>`, version =
micro-batch, skipped when already recorded, and made even when empty so that a rerun of a committed
micro-batch returns at once. Spark work: the touched accounts' records, the customer versions and the account
versions are materialized with `localCheckpoint` (this cuts the plans: planning and code generation of the
shared parts, not the data, dominate at TPC-DI sizes), then one action collects all three tables' changes.
A lost executor loses local checkpoints and fails the step, which is then rerun. Once earlier micro-batches
staged records, and unless a reference file touches every key, only the records of the keys to rebuild are read
(`rebuilt_keys` finds the keys with delta-rs; `_records` hands their records to Spark as Arrow): a small
micro-batch then runs no Spark job over every staged action.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from jobs import prospect
from jobs.collect import collect_parts
from jobs.landing import CUSTOMER_MGMT_SOURCE, nondelimited_source_for_file, source_for_file
from jobs.messages import ALERT, alerts
from jobs.scd2 import BATCH, END_OF_TIME, TS, build_versions, present_flag, surrogate_key, version_changes
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import Table, spark_type
from schemas.staging import CUSTOMER_MGMT
from streamdi.context import JobContext
from streamdi.spark import literal_frame

log = logging.getLogger(__name__)

STEP = "T2"
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

# Account change-record fields: (field, CustomerMgmt.xml column, Account.txt column).
ACCOUNT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("brokerid", "ca_b_id", "ca_b_id"),
    ("accountdesc", "ca_name", "ca_name"),
    ("taxstatus", "ca_tax_st", "ca_tax_st"),
)
ACCOUNT_VALUES = ("customerid", "st_id", *(f for f, _, _ in ACCOUNT_FIELDS))
ACCOUNT_ACTIONS = ("NEW", "ADDACCT", "UPDACCT", "CLOSEACCT")
NOT_LOADED = {"DimCustomer": "Customer not loaded", "DimAccount": "Account not loaded"}
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


def _present(name: str) -> Column:
    return F.array_contains(F.split(F.col("present_fields"), ","), name)


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


def account_changes(actions: DataFrame, lines: DataFrame) -> DataFrame:
    """One change record per account action (NEW with an account, ADDACCT, UPDACCT, CLOSEACCT) of `actions`
    and per line of `lines` (staged Account.txt rows with their `batchdate`): `accountid`, the order columns,
    `_micro`, the `ACCOUNT_VALUES` and their `_has_` flags."""
    kind = F.col("action_type")
    xml = actions.where(kind.isin(*ACCOUNT_ACTIONS) & F.col("ca_id").isNotNull())
    carried = {
        f: F.when(kind.isin("NEW", "ADDACCT"), F.lit(True)).when(kind == "UPDACCT", _present(x)).otherwise(F.lit(False))
        for f, x, _ in ACCOUNT_FIELDS
    }
    from_xml = xml.select(
        F.col("ca_id").alias("accountid"),
        F.col("source_batch").alias(BATCH),
        F.col("action_ts").alias(TS),
        F.col("action_seq").alias(SEQ),
        F.col("source_file").alias(FILE),
        F.col("batch_id").alias(MICRO),
        F.col("c_id").alias("customerid"),
        F.lit(True).alias(present_flag("customerid")),
        F.when(kind == "CLOSEACCT", F.lit(INACTIVE)).otherwise(F.lit(ACTIVE)).alias("st_id"),
        F.lit(True).alias(present_flag("st_id")),
        *[F.col(x).alias(f) for f, x, _ in ACCOUNT_FIELDS],
        *[carried[f].alias(present_flag(f)) for f, _, _ in ACCOUNT_FIELDS],
    )
    from_lines = lines.select(
        F.col("ca_id").alias("accountid"),
        F.col("source_batch").alias(BATCH),
        F.col("batchdate").cast("timestamp").alias(TS),
        F.col("cdc_dsn").alias(SEQ),
        F.col("source_file").alias(FILE),
        F.col("batch_id").alias(MICRO),
        F.col("ca_c_id").alias("customerid"),
        F.lit(True).alias(present_flag("customerid")),
        F.col("ca_st_id").alias("st_id"),
        F.lit(True).alias(present_flag("st_id")),
        *[F.col(c).alias(f) for f, _, c in ACCOUNT_FIELDS],
        *[F.lit(True).alias(present_flag(f)) for f, _, _ in ACCOUNT_FIELDS],
    )
    return from_xml.unionByName(from_lines)


# ------------------------------------------------------------------------------------------ versions
def _problems(*checks: tuple[Column, Column]) -> Column:
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
    problem = _problems(
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


def account_versions(
    changes: DataFrame, customers: DataFrame, brokers: DataFrame, status_types: DataFrame
) -> DataFrame:
    """DimAccount versions of every account in `changes`: the account-record versions cut at the versions of
    their customer (`customers`: loadable DimCustomer versions with `st_id`), with `sk_brokerid` from
    `brokers` (DimBroker) and the status name from `status_types`; plus `customerid`, `brokerid` and
    `_problem` (why the version cannot be loaded; NULL when it can)."""
    base = build_versions(changes, ["accountid"], ORDER, ACCOUNT_VALUES).select(
        "accountid",
        "customerid",
        "brokerid",
        "accountdesc",
        "taxstatus",
        F.col("st_id").alias("_a_st"),
        F.col("effectivedate").alias("_a_eff"),
        F.col("enddate").alias("_a_end"),
        F.col("batchid").alias("_a_batch"),
    )
    cust = customers.select(
        F.col("customerid").alias("_c_id"),
        F.col("sk_customerid"),
        F.col("st_id").alias("_c_st"),
        F.col("effectivedate").alias("_c_eff"),
        F.col("enddate").alias("_c_end"),
        F.col("batchid").alias("_c_batch"),
    )
    # The customer version valid when the account version starts: customer versions run without gaps to the
    # end of time, so the account version is wholly covered exactly when this one exists.
    same = F.col("customerid") == F.col("_c_id")
    starts = base.join(
        cust.select("_c_id", F.col("_c_eff").alias("_s_eff"), F.col("_c_end").alias("_s_end")),
        same & (F.col("_s_eff") <= F.col("_a_eff")) & (F.col("_a_eff") < F.col("_s_end")),
        "left",
    ).select(*base.columns, F.col("_c_id").isNotNull().alias("_covered"))
    pieces = starts.join(cust, same & (F.col("_c_eff") < F.col("_a_end")) & (F.col("_a_eff") < F.col("_c_end")), "left")
    eff = F.when(F.col("_c_eff").isNull(), F.col("_a_eff")).otherwise(F.greatest("_a_eff", "_c_eff"))
    end = F.when(F.col("_c_end").isNull(), F.col("_a_end")).otherwise(F.least("_a_end", "_c_end"))
    started_by = (
        F.when(F.col("_c_eff").isNull() | (F.col("_a_eff") > F.col("_c_eff")), F.col("_a_batch"))
        .when(F.col("_c_eff") > F.col("_a_eff"), F.col("_c_batch"))
        .otherwise(F.greatest("_a_batch", "_c_batch"))
    )
    st_code = F.when(F.col("_c_st") == INACTIVE, F.lit(INACTIVE)).otherwise(F.col("_a_st"))
    cut = pieces.select(
        "accountid",
        "customerid",
        "brokerid",
        "accountdesc",
        "taxstatus",
        "sk_customerid",
        "_covered",
        st_code.alias("st_id"),
        eff.alias("effectivedate"),
        end.alias("enddate"),
        started_by.alias("batchid"),
    )
    b = brokers.select(
        F.col("brokerid").alias("_b_id"),
        "sk_brokerid",
        F.col("effectivedate").alias("_b_eff"),
        F.col("enddate").alias("_b_end"),
    )
    with_broker = cut.join(
        F.broadcast(b),
        (F.col("brokerid") == F.col("_b_id"))
        & (F.col("_b_eff") <= F.col("effectivedate"))
        & (F.col("effectivedate") < F.col("_b_end")),
        "left",
    )
    names = F.broadcast(status_types.select("st_id", F.col("st_name").alias("status")))
    v = with_broker.join(names, "st_id", "left")
    day = F.date_format("effectivedate", "yyyy-MM-dd")
    problem = _problems(
        (
            ~F.col("_covered") | F.col("sk_customerid").isNull(),
            F.format_string("no DimCustomer version of C_ID = %s on %s", F.col("customerid").cast("string"), day),
        ),
        (
            F.col("sk_brokerid").isNull(),
            F.format_string("no DimBroker row of CA_B_ID = %s on %s", F.col("brokerid").cast("string"), day),
        ),
        (F.col("status").isNull(), F.format_string("unknown status code '%s'", F.coalesce(F.col("st_id"), F.lit("")))),
    )
    return v.select(
        surrogate_key("accountid", "effectivedate").alias("sk_accountid"),
        "accountid",
        "sk_brokerid",
        "sk_customerid",
        "accountdesc",
        "taxstatus",
        "status",
        (F.col("enddate") == F.lit(END_OF_TIME)).alias("iscurrent"),
        "batchid",
        "effectivedate",
        "enddate",
        "customerid",
        "brokerid",
        problem.alias("_problem"),
    )


def loadable(versions: DataFrame, natural: str) -> DataFrame:
    """The versions of the keys none of whose versions has a `_problem`."""
    bad = F.max(F.col("_problem").isNotNull()).over(Window.partitionBy(natural))
    return versions.withColumn("_bad", bad).where(~F.col("_bad")).drop("_bad")


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


def _not_loaded_key(natural: str, label: str) -> Column:
    return F.concat(F.lit(f"{label}="), F.col(natural).cast("string"))


def not_loaded_alerts(versions: DataFrame, *, source: str, natural: str, label: str) -> DataFrame:
    """One Alert per key with a version that cannot be loaded: the earliest such version's reason."""
    first = (
        versions.where(F.col("_problem").isNotNull())
        .groupBy(natural)
        .agg(F.min_by(F.struct("batchid", "_problem"), F.col("effectivedate")).alias("_first"))
    )
    return alerts(
        first,
        source=source,
        text=NOT_LOADED[source],
        when=F.lit(True),
        data=F.concat(F.lit(f"{label} = "), F.col(natural).cast("string"), F.lit(": "), F.col("_first._problem")),
        key=_not_loaded_key(natural, label),
        batchid=F.col("_first.batchid"),
    )


def resolved_alerts(
    existing: DataFrame, raised: DataFrame, touched: DataFrame, *, source: str, natural: str, label: str
) -> DataFrame:
    """Keys of the "not loaded" alerts of touched keys that are not raised again (the key loads now, or its
    alert moved to another batch): they are deleted, so a retry that succeeds leaves no trace of the wait."""
    keys = touched.select(_not_loaded_key(natural, label).alias("messagekey"))
    mine = (
        (F.col("messagesource") == source)
        & (F.col("messagetype") == ALERT)
        & (F.col("messagetext") == NOT_LOADED[source])
    )
    old = existing.where(mine).join(keys, "messagekey", "left_semi").select(*wh.DI_MESSAGES.key)
    return old.join(raised.select(*wh.DI_MESSAGES.key), list(wh.DI_MESSAGES.key), "left_anti")


# ------------------------------------------------------------------------------------------ run
@dataclass(frozen=True)
class Triggers:
    """What this micro-batch brings that T2 depends on (from its landing files and newly dated batches)."""

    records: bool  # CustomerMgmt.xml, Customer.txt or Account.txt
    prospects: bool  # Prospect.csv: the Prospect table, and the demographics of the customers it matches
    statuses: bool  # StatusType.txt: every status name may change
    tax_rates: bool  # TaxRate.txt: every customer's tax rates may change
    brokers: bool  # HR.csv or Date.txt: DimBroker may change
    dated: bool  # a TPC-DI batch got its BatchDate

    @property
    def any(self) -> bool:
        return self.records or self.prospects or self.statuses or self.tax_rates or self.brokers or self.dated


def triggers(scope: BatchScope) -> Triggers:
    """Which T2 inputs this micro-batch's files carry, by the declared file patterns."""
    names: set[str] = set()
    watched = (src.CUSTOMER, src.ACCOUNT, src.PROSPECT, src.STATUS_TYPE, src.TAX_RATE, src.HR, src.DATE_FILE)
    for file in scope.file_seq:
        source = source_for_file(file, sources=watched)
        if source is not None:
            names.add(source.name)
        elif nondelimited_source_for_file(file) == CUSTOMER_MGMT_SOURCE:
            names.add(CUSTOMER_MGMT_SOURCE)
    return Triggers(
        records=bool(names & {CUSTOMER_MGMT_SOURCE, src.CUSTOMER.name, src.ACCOUNT.name}),
        prospects=src.PROSPECT.name in names,
        statuses=src.STATUS_TYPE.name in names,
        tax_rates=src.TAX_RATE.name in names,
        brokers=bool(names & {src.HR.name, src.DATE_FILE.name}),
        dated=bool(scope.newly_dated),
    )


def _table(ctx: JobContext, table: Table) -> DataFrame:
    return ctx.lake.read_or_empty(table)


RECORD_TABLES = (CUSTOMER_MGMT, src.CUSTOMER.staging, src.ACCOUNT.staging)
# Above this many customers plus accounts to rebuild, Spark selects their records instead of the driver.
DRIVER_KEYS = 100_000


def rebuilt_keys(ctx: JobContext, scope: BatchScope, matched: pa.Array | None = None) -> tuple[pa.Array, pa.Array]:
    """The customers and the accounts `run` rebuilds when no reference file touches every key: the customers
    with a record new to the warehouse (and the customers `matched` by new prospect lines), the accounts with one
    or whose records name such a customer, and the customers of those accounts. Read with delta-rs (no Spark
    job) from the key columns of the staged records; Customer.txt and Account.txt lines count once their TPC-DI
    batch is dated, as in `run`."""
    dated = pc.field("source_batch").isin(pa.array(sorted(scope.batch_dates), pa.int32()))
    newly = pa.array(scope.newly_dated, pa.int32())

    def in_scope(t: pa.Table) -> pa.Table:
        return t.filter(pc.or_(pc.equal(t["batch_id"], scope.batch_id), pc.is_in(t["source_batch"], newly)))

    lineage = ["batch_id", "source_batch"]
    xml = scope.staged_where(ctx, CUSTOMER_MGMT, pc.scalar(True), ["action_type", "c_id", "ca_id", *lineage])
    lines = scope.staged_where(ctx, src.CUSTOMER.staging, dated, ["c_id", *lineage])
    xml_customers = xml.filter(pc.is_in(xml["action_type"], pa.array(CUSTOMER_ACTIONS)))
    customers = _unique(
        in_scope(xml_customers)["c_id"], in_scope(lines)["c_id"], *([] if matched is None else [matched])
    )

    account_kind = pc.is_in(xml["action_type"], pa.array(ACCOUNT_ACTIONS))
    xml_accounts = xml.filter(pc.and_(account_kind, pc.is_valid(xml["ca_id"])))
    account_lines = scope.staged_where(ctx, src.ACCOUNT.staging, dated, ["ca_id", "ca_c_id", *lineage])
    records = pa.table(
        {
            name: pa.chunked_array([*xml_accounts[x].chunks, *account_lines[line].chunks], xml_accounts[x].type)
            for name, x, line in (
                ("accountid", "ca_id", "ca_id"),
                ("customerid", "c_id", "ca_c_id"),
                *((c, c, c) for c in lineage),
            )
        }
    )
    of_customers = records.filter(pc.is_in(records["customerid"], customers))["accountid"]
    accounts = _unique(in_scope(records)["accountid"], of_customers)
    needed = _unique(customers, records.filter(pc.is_in(records["accountid"], accounts))["customerid"])
    return needed, accounts


def _unique(*columns: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct ids of the (int64) columns together."""
    chunks = [c for col in columns for c in (col.chunks if isinstance(col, pa.ChunkedArray) else [col])]
    return pc.unique(pa.chunked_array(chunks, pa.int64()))


def _records(
    ctx: JobContext, scope: BatchScope, why: Triggers, matched: pa.Array
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The staged CustomerMgmt actions, Customer.txt lines and Account.txt lines `run` reads (up to this
    micro-batch). When earlier micro-batches staged records and no reference file touches every key, only the
    records of the keys to rebuild (`rebuilt_keys`) are read, with delta-rs, and handed to Spark as Arrow: `run`
    finds the same keys in them (each record it uses names a kept customer or account), and a small micro-batch
    runs no Spark job over every staged record."""
    everything = why.statuses or why.tax_rates or why.brokers
    if not everything and scope.staged_before(ctx, RECORD_TABLES):
        customers, accounts = rebuilt_keys(ctx, scope, matched)
        if len(customers) + len(accounts) <= DRIVER_KEYS:
            kept = {
                CUSTOMER_MGMT: pc.field("c_id").isin(customers) | pc.field("ca_id").isin(accounts),
                src.CUSTOMER.staging: pc.field("c_id").isin(customers),
                src.ACCOUNT.staging: pc.field("ca_id").isin(accounts),
            }
            return tuple(ctx.lake.to_frame(t, scope.staged_where(ctx, t, c)) for t, c in kept.items())
    return tuple(_staged(ctx, scope, t) for t in RECORD_TABLES)


def _staged(ctx: JobContext, scope: BatchScope, table: Table) -> DataFrame:
    staged = scope.staged(ctx, table, upto=True)
    return staged if staged is not None else ctx.lake.empty(table)


def _in_scope(scope: BatchScope, micro: str = "batch_id", batch: str = "source_batch") -> Column:
    """Records that are new to the warehouse in this micro-batch: staged by it, or of a newly dated batch."""
    this = F.col(micro) == F.lit(scope.batch_id)
    if scope.newly_dated:
        return this | F.col(batch).isin(*scope.newly_dated)
    return this


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the touched customers and accounts from all their staged records and commit DimCustomer,
    DimAccount and the alerts (one commit each, skipped when already recorded for this micro-batch), then the
    Prospect table (`jobs.prospect.run`, which needs this micro-batch's DimCustomer).

    Spark actions: one per version set (customers, accounts) and one that collects the three tables' changes
    (`collect_changes`)."""
    why = triggers(scope)
    if not why.any:
        return {}
    rows = _customers_and_accounts(ctx, scope, why)
    rows.update(prospect.run(ctx, scope))
    return rows


def _customers_and_accounts(ctx: JobContext, scope: BatchScope, why: Triggers) -> dict[str, int]:
    todo = [t for t in (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.DI_MESSAGES) if not scope.committed(ctx, STEP, t)]
    if not todo:
        return {}
    matched = prospect.customers_matching_new_lines(ctx, scope)
    if why == Triggers(False, True, False, False, False, False) and len(matched) == 0:
        # only Prospect lines that match no customer version: no customer or account is touched, hence no version,
        # alert or resolution (the Spark plans below would all be empty); the commits record the micro-batch
        for table in todo:
            empty = table.arrow_schema().empty_table()
            ctx.lake.upsert(table, empty, app_id=scope.app_id(STEP, table), version=scope.batch_id)
        return {table.name: 0 for table in todo}
    dates = F.broadcast(scope.dates_frame(ctx))
    actions, customer_staged, account_staged = _records(ctx, scope, why, matched)
    customer_lines = customer_staged.join(dates, "source_batch")
    account_lines = account_staged.join(dates, "source_batch")
    cust_changes = customer_changes(actions, customer_lines)
    acct_changes = account_changes(actions, account_lines)

    # Touched keys. Incremental lines are in play once dated (the joins above drop the others).
    in_scope = _in_scope(scope, MICRO, BATCH)
    if why.statuses or why.tax_rates:
        touched_customers = cust_changes.select("customerid").distinct()
    else:
        touched_customers = cust_changes.where(in_scope).select("customerid")
        if len(matched):  # customers whose demographics may change: a new prospect line matches them
            ids = literal_frame(ctx.spark, [(i,) for i in matched.to_pylist()], "customerid bigint")
            touched_customers = touched_customers.unionByName(ids)
        touched_customers = touched_customers.distinct()
    if why.statuses or why.brokers:
        touched_accounts = acct_changes.select("accountid").distinct()
    else:
        own = acct_changes.where(in_scope).select("accountid")
        of_customers = acct_changes.join(touched_customers, "customerid", "left_semi").select("accountid")
        touched_accounts = own.unionByName(of_customers).distinct()
    account_records = acct_changes.join(touched_accounts, "accountid", "left_semi").localCheckpoint()
    # the customers to rebuild: the touched ones and those the touched accounts need (equal rows stay alone)
    customers_needed = touched_customers.unionByName(account_records.select("customerid")).distinct()

    # Versions are materialized (local checkpoints): the plans that use them stay small, so Spark plans and
    # generates code for each part once instead of once per use.
    status_types = _table(ctx, wh.STATUS_TYPE)
    cv = customer_versions(
        cust_changes.join(customers_needed, "customerid", "left_semi"), status_types, _table(ctx, wh.TAX_RATE)
    ).localCheckpoint()
    customers = loadable(cv, "customerid")
    av = account_versions(account_records, customers, _table(ctx, wh.DIM_BROKER), status_types).localCheckpoint()
    accounts = loadable(av, "accountid")
    # every rebuilt key has change records, hence versions: the rebuilt keys are the keys of the versions
    customer_keys = cv.select("customerid").distinct()
    account_keys = av.select("accountid").distinct()

    raised = reduce(
        DataFrame.unionByName,
        (
            customer_alerts(
                actions.join(dates, "source_batch").where(_in_scope(scope)), customer_lines.where(_in_scope(scope))
            ),
            not_loaded_alerts(cv, source="DimCustomer", natural="customerid", label="C_ID"),
            not_loaded_alerts(av, source="DimAccount", natural="accountid", label="CA_ID"),
        ),
    )
    existing = _table(ctx, wh.DI_MESSAGES)
    resolved = resolved_alerts(
        existing, raised, customer_keys, source="DimCustomer", natural="customerid", label="C_ID"
    ).unionByName(
        resolved_alerts(existing, raised, account_keys, source="DimAccount", natural="accountid", label="CA_ID")
    )
    changes = {
        wh.DIM_CUSTOMER: lambda: _table_changes(ctx, wh.DIM_CUSTOMER, customers, "customerid", customer_keys),
        wh.DIM_ACCOUNT: lambda: _table_changes(ctx, wh.DIM_ACCOUNT, accounts, "accountid", account_keys),
        wh.DI_MESSAGES: lambda: _message_changes(ctx, scope, raised, resolved),
    }
    collected = collect_changes({t: changes[t]() for t in todo})
    rows: dict[str, int] = {}
    for table, (new, gone) in collected.items():
        if table is wh.DIM_CUSTOMER:
            new = prospect.rebuilt_demographics(ctx, scope, new)
        # committed even when empty, so that the app transaction records the micro-batch as done
        data = ctx.lake.to_arrow(table, new)
        ctx.lake.upsert(table, data, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=gone)
        rows[table.name] = data.num_rows
        log.info(
            "T2 micro-batch %s: %s: %s upserted, %s deleted", scope.batch_id, table.name, data.num_rows, gone.num_rows
        )
    return rows


DELETE = "_delete"  # marks the key-only rows to delete


def _table_changes(ctx: JobContext, table: Table, versions: DataFrame, natural: str, touched: DataFrame) -> DataFrame:
    """The rows to upsert into `table` and (flagged `_delete`, key only) the keys to delete."""
    upserts, deletes = version_changes(_table(ctx, table), versions, table, [natural], touched)
    return upserts.withColumn(DELETE, F.lit(False)).unionByName(
        deletes.withColumn(DELETE, F.lit(True)), allowMissingColumns=True
    )


def _message_changes(ctx: JobContext, scope: BatchScope, raised: DataFrame, resolved: DataFrame) -> DataFrame:
    """As `jobs.messages.commit_messages` (the message time is the BatchDate of its batch), plus the keys of
    the resolved alerts to delete in the same commit."""
    dates = scope.dates_frame(ctx).select(
        F.col("source_batch").alias("batchid"), F.col("batchdate").cast("timestamp").alias("messagedateandtime")
    )
    key = list(wh.DI_MESSAGES.key)
    values = [c for c in wh.DI_MESSAGES.column_names if c not in key]
    # a record delivered twice raises its alert twice: one row per message key (the rows are equal)
    dated = (
        raised.join(F.broadcast(dates), "batchid", "left")
        .groupBy(*key)
        .agg(*[F.min(c).alias(c) for c in values])
        .select(*wh.DI_MESSAGES.column_names)
    )
    return dated.withColumn(DELETE, F.lit(False)).unionByName(
        resolved.withColumn(DELETE, F.lit(True)), allowMissingColumns=True
    )


def collect_changes(parts: dict[Table, DataFrame]) -> dict[Table, tuple[pa.Table, pa.Table]]:
    """Collect every table's changes with one Spark action; per table: (rows to upsert, keys to delete)."""
    data = collect_parts({t.name: df for t, df in parts.items()})
    out = {}
    for table in parts:
        mine = data[table.name]
        gone = mine[DELETE].combine_chunks() if mine.num_rows else pa.array([], pa.bool_())
        out[table] = (mine.filter(pc.invert(gone)), mine.filter(gone).select(list(table.key)))
    return out
