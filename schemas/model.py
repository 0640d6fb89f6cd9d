"""The declaration language: columns with logical types, source files and tables.

Logical types (one string each) map to Spark, Arrow and PostgreSQL types:

| logical        | Spark            | Arrow                 | PostgreSQL        |
|----------------|------------------|-----------------------|-------------------|
| int            | IntegerType      | int32                 | integer           |
| bigint         | LongType         | int64                 | bigint            |
| double         | DoubleType       | float64               | double precision  |
| decimal(p,s)   | DecimalType(p,s) | decimal128(p,s)       | numeric(p,s)      |
| string         | StringType       | large_string          | text              |
| boolean        | BooleanType      | bool_                 | boolean           |
| date           | DateType         | date32                | date              |
| timestamp      | TimestampType    | timestamp(us, UTC)    | timestamp         |
| time           | StringType       | large_string          | time              |

`time` is kept as `HH:MM:SS` text in Delta (Delta has no time type) and becomes a real `time` in PostgreSQL.
Timestamps are zone-less in TPC-DI; the platform runs Spark in UTC so they round-trip unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import types as T

_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_SIMPLE = {"int", "bigint", "double", "string", "boolean", "date", "timestamp", "time"}


def check_logical_type(logical: str) -> str:
    if logical in _SIMPLE or _DECIMAL.fullmatch(logical):
        return logical
    raise ValueError(f"unknown logical type {logical!r}; expected one of {sorted(_SIMPLE)} or decimal(p,s)")


def decimal_precision(logical: str) -> tuple[int, int] | None:
    m = _DECIMAL.fullmatch(logical)
    return (int(m.group(1)), int(m.group(2))) if m else None


def spark_type(logical: str) -> T.DataType:
    from pyspark.sql import types as T  # pyspark only where a Spark schema is wanted (~0.1 s to import)

    dec = decimal_precision(logical)
    if dec:
        return T.DecimalType(*dec)
    return {
        "int": T.IntegerType(),
        "bigint": T.LongType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "boolean": T.BooleanType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "time": T.StringType(),
    }[check_logical_type(logical)]


def arrow_type(logical: str) -> pa.DataType:
    dec = decimal_precision(logical)
    if dec:
        return pa.decimal128(*dec)
    return {
        "int": pa.int32(),
        "bigint": pa.int64(),
        "double": pa.float64(),
        "string": pa.large_string(),
        "boolean": pa.bool_(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "time": pa.large_string(),
    }[check_logical_type(logical)]


@dataclass(frozen=True)
class Column:
    """One column. `fmt` is the text format for dates/timestamps in source files (Spark datetime pattern)."""

    name: str
    type: str
    nullable: bool = True
    doc: str = ""
    fmt: str | None = None

    def __post_init__(self) -> None:
        check_logical_type(self.type)


@dataclass(frozen=True)
class Table:
    """A Delta (and, for the warehouse, PostgreSQL) table.

    `layer` is `staging`, `warehouse` or `platform`; `key` lists the columns that identify a row (the
    PostgreSQL primary key and the MERGE/upsert key); `order_by` fixes the row order of every write so the
    same input gives the same files.
    """

    name: str
    layer: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    order_by: tuple[str, ...] = ()
    doc: str = ""
    pg_indexes: tuple[tuple[str, ...], ...] = field(default=())
    # Target size of the Delta data files (`delta.targetFileSize`, set when the table is created), or None for
    # one file per write. A MERGE rewrites only the files that hold a matched key, so a large table whose updates
    # hit its latest keys (DimTrade: a trade is updated soon after it is created) is kept in small files.
    file_bytes: int | None = None
    # A micro-batch's upserts are mostly rows of new keys (a new day's facts, the holdings of new trades): `Lake`
    # looks for the rows' keys first and appends when none is there, instead of a MERGE (0.1-0.2 s however small).
    new_keys_mostly: bool = False
    # A micro-batch's upserts carry many rows equal to the table's (T3 recomputes every trade of a changed account):
    # `Lake` reads the table's rows of those keys first and leaves the equal ones out of the MERGE, whose reads then
    # reach only the files of the rows that change.
    skip_equal_rows: bool = False
    # PostgreSQL's fillfactor for the table (percent of each page filled by inserts), or None for its default (100).
    # A table whose every row is updated again and again (Prospect: each TPC-DI batch lists every prospect anew)
    # leaves room on its pages, so an update writes the new row version beside the old one (a HOT update: no index
    # entry, and the old version pruned on the page) instead of on a new page with new index entries.
    pg_fillfactor: int | None = None
    # A warm process reads this table often by keys scattered over all of it (Batch1's trade history, looked up by
    # trade, account or customer in every micro-batch; the trade windows, read seven times by step AG): such a read
    # decodes every row group (0.1-0.2 s at SF 6). `Lake` holds the whole snapshot of a version in memory once its
    # reads from files have cost what a whole read would, and filters it there (within `Settings.resident_mb`).
    resident: bool = False

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate column names")
        for col in (*self.key, *self.order_by, *(c for idx in self.pg_indexes for c in idx)):
            if col not in names:
                raise ValueError(f"{self.name}: unknown column {col!r} in key/order/index")
        if self.pg_fillfactor is not None and not 10 <= self.pg_fillfactor <= 100:
            raise ValueError(
                f"{self.name}: pg_fillfactor must be 10 to 100 (PostgreSQL's range), not {self.pg_fillfactor}"
            )

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def qualified_name(self) -> str:
        return f"{self.layer}.{self.name}"

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def spark_schema(self) -> T.StructType:
        from pyspark.sql import types as T

        return T.StructType([T.StructField(c.name, spark_type(c.type), c.nullable) for c in self.columns])

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable) for c in self.columns])


@dataclass(frozen=True)
class SourceFile:
    """A TPC-DI source file in the official generator's format.

    `pattern` is a glob on the file name (landing files may carry a prefix or suffix, e.g. drip splits);
    `delimiter` is `|` or `,`; `columns` are the fields in file order; `staging` is the staging table
    derived from it (the columns plus lineage).
    """

    name: str
    pattern: str
    delimiter: str
    columns: tuple[Column, ...]
    doc: str = ""
    resident: bool = False  # its staging table is `Table.resident`

    @property
    def staging(self) -> Table:
        return staging_table_for(self)


LINEAGE = (
    Column("batch_id", "bigint", False, "micro-batch that staged this line"),
    Column("source_batch", "int", False, "TPC-DI batch of the file"),
    Column("source_file", "string", False, "landing file, relative to the landing zone"),
    Column("line_no", "bigint", False, "1-based line number in the file"),
)


@cache
def staging_table_for(source: SourceFile) -> Table:
    return Table(
        name=source.name.lower(),
        layer="staging",
        columns=(*source.columns, *LINEAGE),
        order_by=("batch_id", "source_file", "line_no"),
        doc=f"Parsed lines of {source.pattern}.",
        resident=source.resident,
    )
