"""TPC-DI source files, field by field, in file order (TPC-DI 1.1.0, clause 2.2).

Every delimited source file is declared here once; the parser (`jobs.stage`), the staging tables and the
generator (`streamdi.generator`) all read these declarations. The two files that are not delimited are
declared elsewhere: FINWIRE's fixed-width records in `schemas.finwire`, and CustomerMgmt.xml's element
layout in `CUSTOMER_MGMT_XML` below.

Batch1 (historical) and Batch2.. (incremental) files can share a name (`Trade.txt`); the incremental
variant starts with the two columns `cdc_flag`, `cdc_dsn` and is declared as a separate source named
`<Name>_CDC`. `sources_for_batch(source_batch)` gives the sources a file of that TPC-DI batch may be.
File patterns are globs on the file name that also accept drip-mode names such as `Trade_batch2_0003.txt`
but not the neighbouring `TradeHistory.txt` (hence `Trade[._]*txt` rather than `Trade*.txt`).
`*_audit.csv` files (`AUDIT_PATTERN`) hold expected counts for the audit and are never staged as data.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.model import Column as C
from schemas.model import SourceFile

DATE = "yyyy-MM-dd"
TIMESTAMP = "yyyy-MM-dd HH:mm:ss"
AUDIT_PATTERN = "*_audit.csv"

STATUS_TYPE = SourceFile(
    name="StatusType",
    pattern="StatusType*.txt",
    delimiter="|",
    columns=(C("st_id", "string", False), C("st_name", "string", False)),
    doc="Status codes of trades, accounts and watches.",
)

TRADE_TYPE = SourceFile(
    name="TradeType",
    pattern="TradeType*.txt",
    delimiter="|",
    columns=(
        C("tt_id", "string", False),
        C("tt_name", "string", False),
        C("tt_is_sell", "int", False, "1 for sell orders"),
        C("tt_is_mrkt", "int", False, "1 for market orders"),
    ),
)

INDUSTRY = SourceFile(
    name="Industry",
    pattern="Industry*.txt",
    delimiter="|",
    columns=(C("in_id", "string", False), C("in_name", "string", False), C("in_sc_id", "string", False)),
)

TAX_RATE = SourceFile(
    name="TaxRate",
    pattern="TaxRate*.txt",
    delimiter="|",
    columns=(C("tx_id", "string", False), C("tx_name", "string", False), C("tx_rate", "decimal(6,5)", False)),
)

DATE_FILE = SourceFile(
    name="Date",
    pattern="Date*.txt",
    delimiter="|",
    columns=(
        C("sk_dateid", "int", False),
        C("datevalue", "date", False, fmt=DATE),
        C("datedesc", "string", False),
        C("calendaryearid", "int", False),
        C("calendaryeardesc", "string", False),
        C("calendarqtrid", "int", False),
        C("calendarqtrdesc", "string", False),
        C("calendarmonthid", "int", False),
        C("calendarmonthdesc", "string", False),
        C("calendarweekid", "int", False),
        C("calendarweekdesc", "string", False),
        C("dayofweeknum", "int", False),
        C("dayofweekdesc", "string", False),
        C("fiscalyearid", "int", False),
        C("fiscalyeardesc", "string", False),
        C("fiscalqtrid", "int", False),
        C("fiscalqtrdesc", "string", False),
        C("holidayflag", "boolean", False),
    ),
)

TIME_FILE = SourceFile(
    name="Time",
    pattern="Time*.txt",
    delimiter="|",
    columns=(
        C("sk_timeid", "int", False),
        C("timevalue", "time", False),
        C("hourid", "int", False),
        C("hourdesc", "string", False),
        C("minuteid", "int", False),
        C("minutedesc", "string", False),
        C("secondid", "int", False),
        C("seconddesc", "string", False),
        C("markethoursflag", "boolean", False),
        C("officehoursflag", "boolean", False),
    ),
)

BATCH_DATE = SourceFile(
    name="BatchDate",
    pattern="BatchDate*.txt",
    delimiter="|",
    columns=(C("batchdate", "date", False, "the business date of the TPC-DI batch", fmt=DATE),),
    doc="One line: the date the batch's data was extracted.",
)


def _cdc(source: SourceFile) -> SourceFile:
    """The incremental (Batch2..) variant of a Batch1 source: the same fields behind `cdc_flag`, `cdc_dsn`."""
    return SourceFile(
        name=f"{source.name}_CDC",
        pattern=source.pattern,
        delimiter=source.delimiter,
        columns=(
            C("cdc_flag", "string", False, "I insert, U update"),
            C("cdc_dsn", "bigint", False, "increases through the file: the file's declared order"),
            *source.columns,
        ),
        doc=f"Incremental {source.name}: {source.doc}".strip(),
        # a micro-batch appends to it and the next looks up earlier records by key: held in a warm process
        resident=True,
    )


HR = SourceFile(
    name="HR",
    pattern="HR[._]*csv",
    delimiter=",",
    columns=(
        C("employeeid", "bigint", False),
        C("managerid", "bigint", False),
        C("employeefirstname", "string", False),
        C("employeelastname", "string", False),
        C("employeemi", "string"),
        C("employeejobcode", "int", doc="314 = broker"),
        C("employeebranch", "string"),
        C("employeeoffice", "string"),
        C("employeephone", "string"),
    ),
    doc="Employees; those with job code 314 become DimBroker rows.",
)

PROSPECT = SourceFile(
    name="Prospect",
    pattern="Prospect[._]*csv",
    delimiter=",",
    columns=(
        C("agencyid", "string", False),
        C("lastname", "string", False),
        C("firstname", "string", False),
        C("middleinitial", "string"),
        C("gender", "string"),
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
        C("maritalstatus", "string"),
        C("age", "int"),
        C("creditrating", "int"),
        C("ownorrentflag", "string"),
        C("employer", "string"),
        C("numbercreditcards", "int"),
        C("networth", "bigint"),
    ),
    doc="Marketing prospects: a full snapshot in every batch (no CDC columns).",
)

TRADE = SourceFile(
    name="Trade",
    pattern="Trade[._]*txt",
    delimiter="|",
    columns=(
        C("t_id", "bigint", False),
        C("t_dts", "timestamp", False, fmt=TIMESTAMP),
        C("t_st_id", "string", False),
        C("t_tt_id", "string", False),
        C("t_is_cash", "boolean", False),
        C("t_s_symb", "string", False),
        C("t_qty", "int", False),
        C("t_bid_price", "decimal(8,2)", False),
        C("t_ca_id", "bigint", False),
        C("t_exec_name", "string", False),
        C("t_trade_price", "decimal(8,2)", doc="empty until the trade completes"),
        C("t_chrg", "decimal(10,2)"),
        C("t_comm", "decimal(10,2)"),
        C("t_tax", "decimal(10,2)"),
    ),
    doc="Trades: in Batch1 one line per trade in its last state; incrementally one line per status change.",
    resident=True,
)

TRADE_HISTORY = SourceFile(
    name="TradeHistory",
    pattern="TradeHistory[._]*txt",
    delimiter="|",
    columns=(
        C("th_t_id", "bigint", False),
        C("th_dts", "timestamp", False, fmt=TIMESTAMP),
        C("th_st_id", "string", False),
    ),
    doc="Status history of the Batch1 trades (SBMT/PNDG -> CMPT or CNCL).",
    resident=True,
)

CASH_TRANSACTION = SourceFile(
    name="CashTransaction",
    pattern="CashTransaction[._]*txt",
    delimiter="|",
    columns=(
        C("ct_ca_id", "bigint", False),
        C("ct_dts", "timestamp", False, fmt=TIMESTAMP),
        C("ct_amt", "decimal(10,2)", False),
        C("ct_name", "string", False),
    ),
    resident=True,
)

HOLDING_HISTORY = SourceFile(
    name="HoldingHistory",
    pattern="HoldingHistory[._]*txt",
    delimiter="|",
    columns=(
        C("hh_h_t_id", "bigint", False, "the trade that opened the holding"),
        C("hh_t_id", "bigint", False, "the trade that changed it"),
        C("hh_before_qty", "int", False),
        C("hh_after_qty", "int", False),
    ),
    resident=True,
)

DAILY_MARKET = SourceFile(
    name="DailyMarket",
    pattern="DailyMarket[._]*txt",
    delimiter="|",
    columns=(
        C("dm_date", "date", False, fmt=DATE),
        C("dm_s_symb", "string", False),
        C("dm_close", "decimal(8,2)", False),
        C("dm_high", "decimal(8,2)", False),
        C("dm_low", "decimal(8,2)", False),
        C("dm_vol", "bigint", False),
    ),
)

WATCH_HISTORY = SourceFile(
    name="WatchHistory",
    pattern="WatchHistory[._]*txt",
    delimiter="|",
    columns=(
        C("w_c_id", "bigint", False),
        C("w_s_symb", "string", False),
        C("w_dts", "timestamp", False, fmt=TIMESTAMP),
        C("w_action", "string", False, "ACTV or CNCL"),
    ),
    resident=True,
)

_PHONES = tuple(C(f"c_{part}_{n}", "string") for n in (1, 2, 3) for part in ("ctry", "area", "local", "ext"))

CUSTOMER = SourceFile(
    name="Customer",
    pattern="Customer[._]*txt",
    delimiter="|",
    columns=(
        C("cdc_flag", "string", False, "I insert, U update"),
        C("cdc_dsn", "bigint", False, "increases through the file: the file's declared order"),
        C("c_id", "bigint", False),
        C("c_tax_id", "string", False),
        C("c_st_id", "string", False, "ACTV or INAC"),
        C("c_l_name", "string", False),
        C("c_f_name", "string", False),
        C("c_m_name", "string"),
        C("c_gndr", "string"),
        C("c_tier", "int"),
        C("c_dob", "date", False, fmt=DATE),
        C("c_adline1", "string", False),
        C("c_adline2", "string"),
        C("c_zipcode", "string", False),
        C("c_city", "string", False),
        C("c_state_prov", "string", False),
        C("c_ctry", "string"),
        *_PHONES,
        C("c_email_1", "string"),
        C("c_email_2", "string"),
        C("c_lcl_tx_id", "string", False),
        C("c_nat_tx_id", "string", False),
    ),
    doc="Customer changes of an incremental batch (Batch1 customers come from CustomerMgmt.xml).",
)

ACCOUNT = SourceFile(
    name="Account",
    pattern="Account[._]*txt",
    delimiter="|",
    columns=(
        C("cdc_flag", "string", False, "I insert, U update"),
        C("cdc_dsn", "bigint", False, "increases through the file: the file's declared order"),
        C("ca_id", "bigint", False),
        C("ca_b_id", "bigint", False),
        C("ca_c_id", "bigint", False),
        C("ca_name", "string"),
        C("ca_tax_st", "int", False),
        C("ca_st_id", "string", False, "ACTV or INAC"),
    ),
    doc="Account changes of an incremental batch (Batch1 accounts come from CustomerMgmt.xml).",
)

TRADE_CDC = _cdc(TRADE)
CASH_TRANSACTION_CDC = _cdc(CASH_TRANSACTION)
HOLDING_HISTORY_CDC = _cdc(HOLDING_HISTORY)
DAILY_MARKET_CDC = _cdc(DAILY_MARKET)
WATCH_HISTORY_CDC = _cdc(WATCH_HISTORY)


@dataclass(frozen=True)
class XmlField:
    """One value of a CustomerMgmt.xml action: an attribute (`@NAME`) or an element path under `Customer`."""

    name: str
    path: str
    type: str = "string"


# The element layout of CustomerMgmt.xml (namespace TPCDI = http://www.tpc.org/tpc-di), in document order.
# The root is `TPCDI:Actions`; each `TPCDI:Action` has attributes ActionType and ActionTS (yyyy-MM-ddTHH:mm:ss)
# and one `Customer` child. NEW carries every customer field; UPDCUST only the groups that change; ADDACCT and
# UPDACCT one `Account`; CLOSEACCT an `Account` with only CA_ID; INACT only C_ID.
CUSTOMER_MGMT_NAMESPACE = "http://www.tpc.org/tpc-di"
CUSTOMER_MGMT_ACTIONS = ("NEW", "ADDACCT", "UPDACCT", "UPDCUST", "CLOSEACCT", "INACT")
CUSTOMER_MGMT_XML: tuple[XmlField, ...] = (
    XmlField("c_id", "Customer/@C_ID", "bigint"),
    XmlField("c_tax_id", "Customer/@C_TAX_ID"),
    XmlField("c_gndr", "Customer/@C_GNDR"),
    XmlField("c_tier", "Customer/@C_TIER", "int"),
    XmlField("c_dob", "Customer/@C_DOB", "date"),
    XmlField("c_l_name", "Customer/Name/C_L_NAME"),
    XmlField("c_f_name", "Customer/Name/C_F_NAME"),
    XmlField("c_m_name", "Customer/Name/C_M_NAME"),
    XmlField("c_adline1", "Customer/Address/C_ADLINE1"),
    XmlField("c_adline2", "Customer/Address/C_ADLINE2"),
    XmlField("c_zipcode", "Customer/Address/C_ZIPCODE"),
    XmlField("c_city", "Customer/Address/C_CITY"),
    XmlField("c_state_prov", "Customer/Address/C_STATE_PROV"),
    XmlField("c_ctry", "Customer/Address/C_CTRY"),
    XmlField("c_prim_email", "Customer/ContactInfo/C_PRIM_EMAIL"),
    XmlField("c_alt_email", "Customer/ContactInfo/C_ALT_EMAIL"),
    *(
        XmlField(f"c_{part}_{n}", f"Customer/ContactInfo/C_PHONE_{n}/{tag}")
        for n in (1, 2, 3)
        for part, tag in (("ctry", "C_CTRY_CODE"), ("area", "C_AREA_CODE"), ("local", "C_LOCAL"), ("ext", "C_EXT"))
    ),
    XmlField("c_lcl_tx_id", "Customer/TaxInfo/C_LCL_TX_ID"),
    XmlField("c_nat_tx_id", "Customer/TaxInfo/C_NAT_TX_ID"),
    XmlField("ca_id", "Customer/Account/@CA_ID", "bigint"),
    XmlField("ca_tax_st", "Customer/Account/@CA_TAX_ST", "int"),
    XmlField("ca_b_id", "Customer/Account/CA_B_ID", "bigint"),
    XmlField("ca_name", "Customer/Account/CA_NAME"),
)

REFERENCE_SOURCES: tuple[SourceFile, ...] = (
    STATUS_TYPE,
    TRADE_TYPE,
    INDUSTRY,
    TAX_RATE,
    DATE_FILE,
    TIME_FILE,
)
HISTORICAL_SOURCES: tuple[SourceFile, ...] = (
    BATCH_DATE,
    *REFERENCE_SOURCES,
    HR,
    PROSPECT,
    TRADE,
    TRADE_HISTORY,
    CASH_TRANSACTION,
    HOLDING_HISTORY,
    DAILY_MARKET,
    WATCH_HISTORY,
)
INCREMENTAL_SOURCES: tuple[SourceFile, ...] = (
    BATCH_DATE,
    CUSTOMER,
    ACCOUNT,
    TRADE_CDC,
    CASH_TRANSACTION_CDC,
    HOLDING_HISTORY_CDC,
    DAILY_MARKET_CDC,
    WATCH_HISTORY_CDC,
    PROSPECT,
)
ALL_SOURCES: tuple[SourceFile, ...] = tuple(dict.fromkeys((*HISTORICAL_SOURCES, *INCREMENTAL_SOURCES)))


def sources_for_batch(source_batch: int) -> tuple[SourceFile, ...]:
    """The delimited sources a file of TPC-DI batch `source_batch` may be (1 historical, 2.. incremental)."""
    if source_batch < 1:
        raise ValueError(f"TPC-DI batches start at 1, got {source_batch}")
    return HISTORICAL_SOURCES if source_batch == 1 else INCREMENTAL_SOURCES


def source_by_name(name: str) -> SourceFile:
    for src in ALL_SOURCES:
        if src.name == name:
            return src
    raise KeyError(f"unknown source {name!r}; known: {[s.name for s in ALL_SOURCES]}")


# How jobs.landing finds and jobs.customer_mgmt reads CustomerMgmt.xml (Batch1 only, like FINWIRE, whose pattern is
# in schemas.finwire).
# The row tag is each action (`TPCDI:Action`, never the root `TPCDI:Actions`); `jobs.customer_mgmt` matches its
# prefix through the namespace the file binds it to, and writes attributes with a leading `_` in a rejected
# action's JSON (`_ActionType`, `Customer._C_ID`), as Spark's XML reader, which read the file before, did.
CUSTOMER_MGMT_PATTERN = "CustomerMgmt*.xml"
CUSTOMER_MGMT_ROW_TAG = "TPCDI:Action"
ACTION_TS = "yyyy-MM-dd'T'HH:mm:ss"  # ActionTS, in the datetime pattern notation of `jobs.fields` (Spark's)
CUSTOMER_MGMT_ACTION: tuple[XmlField, ...] = (
    XmlField("action_type", "@ActionType"),
    XmlField("action_ts", "@ActionTS", "timestamp"),
)
