"""Warehouse tables (TPC-DI 1.1.0, clause 3.2), in the Delta warehouse and in PostgreSQL schema `dw`.

Column names are the specification's names in lower case, so `SELECT datevalue FROM dw.dimdate` reads
like the spec's `DimDate.DateValue`. Only the tables the pipeline builds so far are declared.
"""

from __future__ import annotations

from schemas import sources as src
from schemas.model import Column as C
from schemas.model import Table

# The reference tables are loaded from their Batch1 files as they are (TPC-DI 1.1.0, 4.5.1-4.5.3), so they
# declare the very columns of their source files.
DIM_DATE = Table(
    name="dimdate",
    layer="warehouse",
    columns=src.DATE_FILE.columns,
    key=("sk_dateid",),
    order_by=("sk_dateid",),
    pg_indexes=(("datevalue",),),
    doc="One row per calendar day.",
)

DIM_TIME = Table(
    name="dimtime",
    layer="warehouse",
    columns=src.TIME_FILE.columns,
    key=("sk_timeid",),
    order_by=("sk_timeid",),
    pg_indexes=(("timevalue",),),
    doc="One row per second of the day.",
)

STATUS_TYPE = Table(
    name="statustype", layer="warehouse", columns=src.STATUS_TYPE.columns, key=("st_id",), order_by=("st_id",)
)

TRADE_TYPE = Table(
    name="tradetype", layer="warehouse", columns=src.TRADE_TYPE.columns, key=("tt_id",), order_by=("tt_id",)
)

INDUSTRY = Table(
    name="industry",
    layer="warehouse",
    columns=src.INDUSTRY.columns,
    key=("in_id",),
    order_by=("in_id",),
    pg_indexes=(("in_name",),),
)

TAX_RATE = Table(name="taxrate", layer="warehouse", columns=src.TAX_RATE.columns, key=("tx_id",), order_by=("tx_id",))

REFERENCE_TABLES: tuple[Table, ...] = (DIM_DATE, DIM_TIME, STATUS_TYPE, TRADE_TYPE, INDUSTRY, TAX_RATE)

END_OF_TIME = "9999-12-31"  # the end date of a version that is still current

# SCD type 2 bookkeeping shared by the history-keeping dimensions (TPC-DI 1.1.0, 3.2 and 4.4.1): at most one
# version per natural key per day; a version ends on the day the next one starts; the open version ends on
# 9999-12-31 and is the current one. `batchid` is the TPC-DI batch of the change that made the version.
SCD2 = (
    C("iscurrent", "boolean", False, "true for the open version"),
    C("batchid", "int", False, "TPC-DI batch of the change that made this version"),
    C("effectivedate", "date", False, "first day of this version"),
    C("enddate", "date", False, "day the next version starts; 9999-12-31 while current"),
)

DIM_BROKER = Table(
    name="dimbroker",
    layer="warehouse",
    columns=(
        C("sk_brokerid", "bigint", False, "surrogate key"),
        C("brokerid", "bigint", False, "HR EmployeeID"),
        C("managerid", "bigint"),
        C("firstname", "string", False),
        C("lastname", "string", False),
        C("middleinitial", "string"),
        C("branch", "string"),
        C("office", "string"),
        C("phone", "string"),
        *SCD2,
    ),
    key=("sk_brokerid",),
    order_by=("brokerid", "effectivedate"),
    pg_indexes=(("brokerid",),),
    doc="Brokers: HR employees with job code 314.",
)

DIM_COMPANY = Table(
    name="dimcompany",
    layer="warehouse",
    columns=(
        C("sk_companyid", "bigint", False, "surrogate key"),
        C("companyid", "bigint", False, "CIK"),
        C("status", "string", False, "Active or Inactive"),
        C("name", "string", False),
        C("industry", "string", False, "industry name"),
        C("sprating", "string", doc="S&P rating; NULL when the source rating is not a valid one"),
        C("islowgrade", "boolean", doc="true when the rating is below BBB; NULL with the rating"),
        C("ceo", "string", False),
        C("addressline1", "string"),
        C("addressline2", "string"),
        C("postalcode", "string", False),
        C("city", "string", False),
        C("stateprov", "string", False),
        C("country", "string"),
        C("description", "string", False),
        C("foundingdate", "date"),
        *SCD2,
    ),
    key=("sk_companyid",),
    order_by=("companyid", "effectivedate"),
    pg_indexes=(("companyid",), ("name",)),
    doc="Companies from FINWIRE CMP records (SCD2 on CIK).",
)

DIM_SECURITY = Table(
    name="dimsecurity",
    layer="warehouse",
    columns=(
        C("sk_securityid", "bigint", False, "surrogate key"),
        C("symbol", "string", False),
        C("issue", "string", False),
        C("status", "string", False, "Active or Inactive"),
        C("name", "string", False),
        C("exchangeid", "string", False),
        C("sk_companyid", "bigint", False, "company version valid when this version started"),
        C("sharesoutstanding", "bigint", False),
        C("firsttrade", "date", False),
        C("firsttradeonexchange", "date", False),
        C("dividend", "decimal(10,2)", False),
        *SCD2,
    ),
    key=("sk_securityid",),
    order_by=("symbol", "effectivedate"),
    pg_indexes=(("symbol",), ("sk_companyid",)),
    doc="Securities from FINWIRE SEC records (SCD2 on symbol); a new company version makes new versions.",
)

FINANCIAL = Table(
    name="financial",
    layer="warehouse",
    columns=(
        C("sk_companyid", "bigint", False, "company version valid at the record's posting time"),
        C("fi_year", "int", False),
        C("fi_qtr", "int", False),
        C("fi_qtr_start_date", "date", False),
        C("fi_revenue", "decimal(15,2)", False),
        C("fi_net_earn", "decimal(15,2)", False),
        C("fi_basic_eps", "decimal(10,2)", False),
        C("fi_dilut_eps", "decimal(10,2)", False),
        C("fi_margin", "decimal(10,2)", False),
        C("fi_inventory", "decimal(15,2)", False),
        C("fi_assets", "decimal(15,2)", False),
        C("fi_liability", "decimal(15,2)", False),
        C("fi_out_basic", "bigint", False),
        C("fi_out_dilut", "bigint", False),
    ),
    key=("sk_companyid", "fi_year", "fi_qtr"),
    order_by=("sk_companyid", "fi_year", "fi_qtr"),
    doc="Quarterly financial results from FINWIRE FIN records.",
)

DIM_CUSTOMER = Table(
    name="dimcustomer",
    layer="warehouse",
    columns=(
        C("sk_customerid", "bigint", False, "surrogate key"),
        C("customerid", "bigint", False),
        C("taxid", "string", False),
        C("status", "string", False, "Active or Inactive"),
        C("lastname", "string", False),
        C("firstname", "string", False),
        C("middleinitial", "string"),
        C("gender", "string", doc="M, F or U"),
        C("tier", "int"),
        C("dob", "date", False),
        C("addressline1", "string", False),
        C("addressline2", "string"),
        C("postalcode", "string", False),
        C("city", "string", False),
        C("stateprov", "string", False),
        C("country", "string"),
        C("phone1", "string"),
        C("phone2", "string"),
        C("phone3", "string"),
        C("email1", "string"),
        C("email2", "string"),
        C("nationaltaxratedesc", "string"),
        C("nationaltaxrate", "decimal(6,5)"),
        C("localtaxratedesc", "string"),
        C("localtaxrate", "decimal(6,5)"),
        *SCD2,
    ),
    key=("sk_customerid",),
    order_by=("customerid", "effectivedate"),
    pg_indexes=(("customerid",),),
    doc="Customers (SCD2 on customer id): CustomerMgmt.xml in Batch1, Customer.txt afterwards.",
)

DIM_ACCOUNT = Table(
    name="dimaccount",
    layer="warehouse",
    columns=(
        C("sk_accountid", "bigint", False, "surrogate key"),
        C("accountid", "bigint", False),
        C("sk_brokerid", "bigint", False),
        C("sk_customerid", "bigint", False, "customer version valid when this version started"),
        C("accountdesc", "string"),
        C("taxstatus", "int"),
        C("status", "string", False, "Active or Inactive"),
        *SCD2,
    ),
    key=("sk_accountid",),
    order_by=("accountid", "effectivedate"),
    pg_indexes=(("accountid",), ("sk_customerid",)),
    doc="Accounts (SCD2 on account id); a new customer version makes new versions of its accounts.",
)

DIM_TRADE = Table(
    name="dimtrade",
    layer="warehouse",
    columns=(
        C("tradeid", "bigint", False),
        C("sk_brokerid", "bigint"),
        C("sk_createdateid", "int", False),
        C("sk_createtimeid", "int", False),
        C("sk_closedateid", "int"),
        C("sk_closetimeid", "int"),
        C("status", "string", False, "status name, e.g. Completed"),
        C("type", "string", False, "trade type name, e.g. Market Buy"),
        C("cashflag", "boolean", False),
        C("sk_securityid", "bigint", False),
        C("sk_companyid", "bigint", False),
        C("quantity", "int", False),
        C("bidprice", "decimal(8,2)", False),
        C("sk_customerid", "bigint", False),
        C("sk_accountid", "bigint", False),
        C("executedby", "string", False),
        C("tradeprice", "decimal(8,2)"),
        C("fee", "decimal(10,2)"),
        C("commission", "decimal(10,2)"),
        C("tax", "decimal(10,2)"),
        C("batchid", "int", False, "TPC-DI batch of the trade's latest record"),
    ),
    key=("tradeid",),
    order_by=("tradeid",),
    pg_indexes=(("sk_accountid",), ("sk_securityid",), ("sk_createdateid",)),
    file_bytes=4 * 1024 * 1024,  # a micro-batch's MERGE rewrites the file of the latest trades, not the table
    doc="One row per trade; keys fixed at the trade's creation, close date/time from its status history.",
)

DI_MESSAGES = Table(
    name="dimessages",
    layer="warehouse",
    columns=(
        C("messagedateandtime", "timestamp", doc="the batch's BatchDate (deterministic, not the wall clock)"),
        C("batchid", "int", False, "TPC-DI batch"),
        C("messagesource", "string", False, "table or step, e.g. DimTrade"),
        C("messagetext", "string", False),
        C("messagetype", "string", False, "Status, Validation or Alert"),
        C("messagedata", "string"),
        C("messagekey", "string", False, "identifies the message within its batch, source and type"),
    ),
    key=("batchid", "messagesource", "messagetype", "messagekey"),
    order_by=("batchid", "messagesource", "messagetype", "messagekey"),
    doc="Status, validation and alert messages per TPC-DI batch.",
)

SECURITY_TABLES: tuple[Table, ...] = (DIM_COMPANY, DIM_SECURITY, FINANCIAL)
ACCOUNT_TABLES: tuple[Table, ...] = (DIM_CUSTOMER, DIM_ACCOUNT)
WAREHOUSE_TABLES: tuple[Table, ...] = (
    *REFERENCE_TABLES,
    DIM_BROKER,
    *SECURITY_TABLES,
    *ACCOUNT_TABLES,
    DIM_TRADE,
    DI_MESSAGES,
)


def warehouse_table(name: str) -> Table:
    for t in WAREHOUSE_TABLES:
        if t.name == name:
            return t
    raise KeyError(f"unknown warehouse table {name!r}")
