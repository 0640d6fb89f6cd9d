"""TPC-DI source files, field by field, in file order (TPC-DI 1.1.0, clause 2.2).

Only the files the pipeline reads so far are declared; each later source is added here, once.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import SourceFile

DATE = "yyyy-MM-dd"

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

REFERENCE_SOURCES: tuple[SourceFile, ...] = (
    STATUS_TYPE,
    TRADE_TYPE,
    INDUSTRY,
    TAX_RATE,
    DATE_FILE,
    TIME_FILE,
)
ALL_SOURCES: tuple[SourceFile, ...] = (BATCH_DATE, *REFERENCE_SOURCES)


def source_by_name(name: str) -> SourceFile:
    for src in ALL_SOURCES:
        if src.name == name:
            return src
    raise KeyError(f"unknown source {name!r}; known: {[s.name for s in ALL_SOURCES]}")
