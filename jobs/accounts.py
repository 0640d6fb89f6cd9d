"""DimAccount (part of step T2, CreateAccounts): its change records and its versions, cut at the customer versions.

Pure Spark transforms (DataFrames in, DataFrames out); the T2 step (`jobs.create_accounts`) reads the staged
records, decides which accounts to rebuild and commits. The change records follow the contract of DimCustomer's
(`jobs.customers`: declared order, file position, micro-batch), and the versions are cut at the DimCustomer
versions that `jobs.customers.customer_versions` builds.

Implements TPC-DI 1.1.0 clause 4.5 for DimAccount, historical (CustomerMgmt.xml, Batch1) and incremental
(Account.txt, Batch2..).

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

An account version whose customer, broker or status cannot be resolved gets a `_problem` (`first_problem`); the
T2 step keeps such an account out (see `jobs.create_accounts`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.customers import ACTIVE, FILE, INACTIVE, MICRO, ORDER, SEQ, first_problem
from jobs.scd2 import BATCH, END_OF_TIME, TS, build_versions, present_flag, surrogate_key

# Account change-record fields: (field, CustomerMgmt.xml column, Account.txt column).
ACCOUNT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("brokerid", "ca_b_id", "ca_b_id"),
    ("accountdesc", "ca_name", "ca_name"),
    ("taxstatus", "ca_tax_st", "ca_tax_st"),
)
ACCOUNT_VALUES = ("customerid", "st_id", *(f for f, _, _ in ACCOUNT_FIELDS))
ACCOUNT_ACTIONS = ("NEW", "ADDACCT", "UPDACCT", "CLOSEACCT")


def _present(name: str) -> Column:
    return F.array_contains(F.split(F.col("present_fields"), ","), name)


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
    problem = first_problem(
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
