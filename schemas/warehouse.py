"""Warehouse tables (TPC-DI 1.1.0, clause 3.2), in the Delta warehouse and in PostgreSQL schema `dw`.

Column names are the specification's names in lower case, so `SELECT datevalue FROM dw.dimdate` reads
like the spec's `DimDate.DateValue`. Every table of the specification is declared. A few tables carry, after the
specification's columns, the natural key their rows are kept by (FactCashBalances `accountid`, FactWatches
`customerid`/`symbol`/`placed`, FactMarketHistory `symbol`): the specification gives those tables only surrogate
keys, which change when a dimension's history is recomputed, while a row must keep one identity for its upserts
(in Delta and in PostgreSQL).
"""

from __future__ import annotations

from schemas import sources as src
from schemas.model import Column as C
from schemas.model import Table
from schemas.windows import MARKET_WINDOW_SLICES, MARKET_WINDOWS, TRADE_WINDOW_SLICES, TRADE_WINDOWS, WINDOW_LATEST

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

# The file size of tables a micro-batch rewrites mostly whole (its changes reach most keys: DimCustomer, DimAccount,
# Prospect) or adds to at the end (DImessages), given only so that streamdi's own MERGE writes them
# (`streamdi.delta_merge`): it needs a declared file size, and it costs less than delta-rs's (SF 6, one micro-batch
# replayed, process CPU: DimCustomer 0.10 -> 0.05 s, DimAccount 0.055 -> 0.03, Prospect 0.20 -> 0.155, a DImessages
# MERGE 0.018 -> 0.008; the same rows and change feed).
OWN_MERGE_BYTES = 8 * 1024 * 1024
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
    resident=True,  # read in every micro-batch (T2's accounts, DM's checks), never rewritten after Batch1: held
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
    resident=True,  # read in every micro-batch (FactMarketHistory, AG's routing, DM's checks): held
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
    resident=True,  # looked up by symbol in every micro-batch (T3, T4, AG, DM): held in a warm process
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
    resident=True,  # looked up by customer in every micro-batch (DimAccount, Prospect, FactWatches, AG, DM)
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
        C("agencyid", "string", doc="AgencyID of the prospect that matches this version (NULL when none does)"),
        C("creditrating", "int", doc="CreditRating of the matching prospect"),
        C("networth", "bigint", doc="NetWorth of the matching prospect"),
        C("marketingnameplate", "string", doc="MarketingNameplate of the matching prospect"),
        *SCD2,
    ),
    key=("sk_customerid",),
    order_by=("customerid", "effectivedate"),
    pg_indexes=(("customerid",),),
    file_bytes=OWN_MERGE_BYTES,
    doc="Customers (SCD2 on customer id): CustomerMgmt.xml in Batch1, Customer.txt afterwards.",
)

DIM_ACCOUNT = Table(
    name="dimaccount",
    layer="warehouse",
    resident=True,  # looked up by account in every micro-batch (DimTrade, FactCashBalances, AG, DM): held
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
    file_bytes=OWN_MERGE_BYTES,
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
    skip_equal_rows=True,  # the trades of changed accounts are recomputed, and mostly come out equal
    resident=True,  # and looked up (T3's equal rows, FactHoldings' trades, AG's completed trades) all over the table
    doc="One row per trade; keys fixed at the trade's creation, close date/time from its status history.",
)

PROSPECT = Table(
    name="prospect",
    layer="warehouse",
    columns=(
        C("agencyid", "string", False, "the prospect's identity at the marketing agency"),
        C("sk_recorddateid", "int", False, "DimDate id of the BatchDate of the latest batch that listed the prospect"),
        C("sk_updatedateid", "int", False, "DimDate id of the BatchDate of the batch that last changed the prospect"),
        C("batchid", "int", False, "TPC-DI batch that last inserted or changed the prospect"),
        C("iscustomer", "boolean", False, "matches a current, active DimCustomer (names, address, postal code)"),
        C("lastname", "string", False),
        C("firstname", "string", False),
        C("middleinitial", "string"),
        C("gender", "string", doc="M, F or U"),
        C("addressline1", "string"),
        C("addressline2", "string"),
        C("postalcode", "string"),
        C("city", "string", False),
        C("state", "string", False),
        C("country", "string"),
        C("phone", "string"),
        C("income", "bigint"),
        C("numbercars", "int"),
        C("numberchildren", "int"),
        C("maritalstatus", "string", doc="S, M, D, W or U"),
        C("age", "int"),
        C("creditrating", "int"),
        C("ownorrentflag", "string", doc="O, R or U"),
        C("employer", "string"),
        C("numbercreditcards", "int"),
        C("networth", "bigint"),
        C("marketingnameplate", "string", doc="'+'-joined tags (HighValue, Expenses, ...); NULL when none applies"),
    ),
    key=("agencyid",),
    order_by=("agencyid",),
    file_bytes=OWN_MERGE_BYTES,
    # every row is updated every batch (its SK_RecordDateID): half-full pages make those HOT updates (SF 6, 30,540
    # rows: the upsert 0.16 -> 0.09 s, and the table 16 MB instead of growing ~7.5 MB a batch until vacuumed)
    pg_fillfactor=50,
    doc="Marketing prospects from Prospect.csv (a full snapshot in every batch), one row per AgencyID.",
)

FACT_CASH_BALANCES = Table(
    name="factcashbalances",
    layer="warehouse",
    resident=True,  # T3 reads the stored balances of the micro-batch's accounts, scattered over the table
    columns=(
        C("sk_customerid", "bigint", False, "customer of the account version valid on the day"),
        C("sk_accountid", "bigint", False, "account version valid on the day"),
        C("sk_dateid", "int", False, "the day (DimDate id)"),
        C("cash", "decimal(15,2)", False, "the account's cash balance at the end of the day"),
        C("batchid", "int", False, "TPC-DI batch of the day's transactions"),
        C("accountid", "bigint", False, "the account (with sk_dateid, the row's identity)"),
    ),
    key=("accountid", "sk_dateid"),
    order_by=("sk_dateid", "accountid"),
    pg_indexes=(("sk_accountid",),),
    file_bytes=4 * 1024 * 1024,  # a micro-batch adds its days at the end of the date order
    doc="Cash balance of every account at the end of every day with cash transactions.",
    new_keys_mostly=True,
)

FACT_HOLDINGS = Table(
    name="factholdings",
    layer="warehouse",
    columns=(
        C("tradeid", "bigint", False, "the trade that opened the holding (HH_H_T_ID)"),
        C("currenttradeid", "bigint", False, "the trade that changed the holding (HH_T_ID)"),
        C("sk_customerid", "bigint", False),
        C("sk_accountid", "bigint", False),
        C("sk_securityid", "bigint", False),
        C("sk_companyid", "bigint", False),
        C("currentprice", "decimal(8,2)", doc="trade price of the current trade"),
        C("currentholding", "int", False, "quantity held after the current trade (HH_AFTER_QTY)"),
        C("sk_dateid", "int", False, "close date of the current trade"),
        C("sk_timeid", "int", False, "close time of the current trade"),
        C("batchid", "int", False, "TPC-DI batch of the HoldingHistory record"),
    ),
    key=("tradeid", "currenttradeid"),
    order_by=("currenttradeid", "tradeid"),
    pg_indexes=(("currenttradeid",), ("sk_accountid",)),
    file_bytes=4 * 1024 * 1024,  # a micro-batch's holdings are those of its latest trades
    doc="One row per change of a holding (HoldingHistory), keyed through the DimTrade row of the current trade.",
    new_keys_mostly=True,
)

FACT_WATCHES = Table(
    name="factwatches",
    layer="warehouse",
    columns=(
        C("sk_customerid", "bigint", False, "customer version valid on the day the watch was placed"),
        C("sk_securityid", "bigint", False, "security version valid on the day the watch was placed"),
        C("sk_dateid_dateplaced", "int", False),
        C("sk_dateid_dateremoved", "int", doc="NULL while the watch is active"),
        C("batchid", "int", False, "TPC-DI batch of the watch's latest record (ACTV or CNCL)"),
        C("customerid", "bigint", False, "W_C_ID (with symbol and placed, the row's identity)"),
        C("symbol", "string", False, "W_S_SYMB"),
        C("placed", "timestamp", False, "W_DTS of the ACTV record that placed the watch"),
    ),
    key=("customerid", "symbol", "placed"),
    # in the order watches are placed, in files of 1 MB: a micro-batch adds today's at the end and cancels mostly
    # recent ones, so its MERGE rewrites the files of the last year or so, not the table (at SF 6 a day cancels ~137
    # watches, 80% placed that year; one file of the whole table was rewritten every micro-batch before)
    order_by=("placed", "customerid", "symbol"),
    file_bytes=1024 * 1024,
    pg_indexes=(("sk_customerid",), ("sk_securityid",)),
    resident=True,  # T4 reads the watches of the micro-batch's customers, scattered over the table
    doc="Securities on customers' watch lists: one row per ACTV record, removed by the CNCL that follows it.",
)

FACT_MARKET_HISTORY = Table(
    name="factmarkethistory",
    layer="warehouse",
    columns=(
        C("sk_securityid", "bigint", False, "security version valid on the day"),
        C("sk_companyid", "bigint", False, "company of that security version"),
        C("sk_dateid", "int", False, "the day (DM_DATE)"),
        C("peratio", "decimal(10,2)", doc="close / EPS of the last four quarters; NULL without earnings"),
        C("yield", "decimal(10,2)", False, "dividend / close, in percent"),
        C("fiftytwoweekhigh", "decimal(8,2)", False, "highest DM_HIGH of the 52 weeks ending on the day"),
        C("sk_fiftytwoweekhighdate", "int", False, "first day of those 52 weeks with that high"),
        C("fiftytwoweeklow", "decimal(8,2)", False, "lowest DM_LOW of the 52 weeks ending on the day"),
        C("sk_fiftytwoweeklowdate", "int", False, "first day of those 52 weeks with that low"),
        C("closeprice", "decimal(8,2)", False),
        C("dayhigh", "decimal(8,2)", False),
        C("daylow", "decimal(8,2)", False),
        C("volume", "bigint", False),
        C("batchid", "int", False, "TPC-DI batch of the DailyMarket record"),
        C("symbol", "string", False, "DM_S_SYMB (with sk_dateid, the row's identity)"),
    ),
    key=("symbol", "sk_dateid"),
    order_by=("sk_dateid", "symbol"),
    pg_indexes=(("sk_securityid",), ("sk_dateid",)),
    file_bytes=8 * 1024 * 1024,  # a micro-batch adds its days at the end of the date order
    doc="Daily market data per security with its 52-week high and low, P/E ratio and yield.",
    new_keys_mostly=True,
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
    # a micro-batch's messages come at the end of the batch order: its upserts (several steps each) rewrite the last
    # file, so it is kept small (at 8 MiB it grew with history: 121,767 rows, 826 KB, ~135 ms an upsert after 500
    # SF 1 micro-batches, against 15 ms after 12)
    file_bytes=256 * 1024,
    doc="Status, validation and alert messages per TPC-DI batch.",
)

SECURITY_TABLES: tuple[Table, ...] = (DIM_COMPANY, DIM_SECURITY, FINANCIAL)
ACCOUNT_TABLES: tuple[Table, ...] = (DIM_CUSTOMER, DIM_ACCOUNT, PROSPECT)
TRADE_TABLES: tuple[Table, ...] = (DIM_TRADE, FACT_CASH_BALANCES, FACT_HOLDINGS)
MARKET_TABLES: tuple[Table, ...] = (FACT_MARKET_HISTORY, FACT_WATCHES)
WINDOW_TABLES: tuple[Table, ...] = (
    TRADE_WINDOWS,
    MARKET_WINDOWS,
    TRADE_WINDOW_SLICES,
    MARKET_WINDOW_SLICES,
    WINDOW_LATEST,
)
WAREHOUSE_TABLES: tuple[Table, ...] = (
    *REFERENCE_TABLES,
    DIM_BROKER,
    *SECURITY_TABLES,
    *ACCOUNT_TABLES,
    *TRADE_TABLES,
    *MARKET_TABLES,
    *WINDOW_TABLES,
    DI_MESSAGES,
)


def warehouse_table(name: str) -> Table:
    for t in WAREHOUSE_TABLES:
        if t.name == name:
            return t
    raise KeyError(f"unknown warehouse table {name!r}")
