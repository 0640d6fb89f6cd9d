"""Warehouse tables (TPC-DI 1.1.0, clause 3.2), in the Delta warehouse and in PostgreSQL schema `dw`.

Column names are the specification's names in lower case, so `SELECT datevalue FROM dw.dimdate` reads
like the spec's `DimDate.DateValue`. Only the tables the pipeline builds so far are declared.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table

DIM_DATE = Table(
    name="dimdate",
    layer="warehouse",
    columns=(
        C("sk_dateid", "int", False),
        C("datevalue", "date", False),
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
    key=("sk_dateid",),
    order_by=("sk_dateid",),
    pg_indexes=(("datevalue",),),
    doc="One row per calendar day.",
)

DIM_TIME = Table(
    name="dimtime",
    layer="warehouse",
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
    key=("sk_timeid",),
    order_by=("sk_timeid",),
    pg_indexes=(("timevalue",),),
    doc="One row per second of the day.",
)

STATUS_TYPE = Table(
    name="statustype",
    layer="warehouse",
    columns=(C("st_id", "string", False), C("st_name", "string", False)),
    key=("st_id",),
    order_by=("st_id",),
)

TRADE_TYPE = Table(
    name="tradetype",
    layer="warehouse",
    columns=(
        C("tt_id", "string", False),
        C("tt_name", "string", False),
        C("tt_is_sell", "int", False),
        C("tt_is_mrkt", "int", False),
    ),
    key=("tt_id",),
    order_by=("tt_id",),
)

INDUSTRY = Table(
    name="industry",
    layer="warehouse",
    columns=(C("in_id", "string", False), C("in_name", "string", False), C("in_sc_id", "string", False)),
    key=("in_id",),
    order_by=("in_id",),
    pg_indexes=(("in_name",),),
)

TAX_RATE = Table(
    name="taxrate",
    layer="warehouse",
    columns=(C("tx_id", "string", False), C("tx_name", "string", False), C("tx_rate", "decimal(6,5)", False)),
    key=("tx_id",),
    order_by=("tx_id",),
)

REFERENCE_TABLES: tuple[Table, ...] = (DIM_DATE, DIM_TIME, STATUS_TYPE, TRADE_TYPE, INDUSTRY, TAX_RATE)
WAREHOUSE_TABLES: tuple[Table, ...] = REFERENCE_TABLES


def warehouse_table(name: str) -> Table:
    for t in WAREHOUSE_TABLES:
        if t.name == name:
            return t
    raise KeyError(f"unknown warehouse table {name!r}")
