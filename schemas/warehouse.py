"""Warehouse tables (TPC-DI 1.1.0, clause 3.2), in the Delta warehouse and in PostgreSQL schema `dw`.

Column names are the specification's names in lower case, so `SELECT datevalue FROM dw.dimdate` reads
like the spec's `DimDate.DateValue`. Only the tables the pipeline builds so far are declared.
"""

from __future__ import annotations

from schemas import sources as src
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
WAREHOUSE_TABLES: tuple[Table, ...] = REFERENCE_TABLES


def warehouse_table(name: str) -> Table:
    for t in WAREHOUSE_TABLES:
        if t.name == name:
            return t
    raise KeyError(f"unknown warehouse table {name!r}")
