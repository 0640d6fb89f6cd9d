"""The warehouse's vocabulary, without a database driver: where each declared table lands in PostgreSQL (its
schema, its name, its key in the migration ledger), the roles, and the records the migration hands over.

The migrator builds `TableChange`s (net changes read from the Delta change feed) and `BatchMetric`s (the batch
log's times of each micro-batch it makes visible) and gives them to `streamdi.warehouse.Warehouse.apply_changes`;
`Warehouse.read_snapshot` returns a `Snapshot`. Modules that only need these names (the migrator, the
orchestration's checks) import them from here, not from the psycopg modules (`streamdi.warehouse`,
`streamdi.warehouse_ddl`, `streamdi.warehouse_apply`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from schemas.model import Table
from schemas.quality import QUALITY_TABLES

if TYPE_CHECKING:
    from streamdi.delta_appends import AppendedRows

LOADER_ROLE = "streamdi_loader"
READER_ROLE = "streamdi_reader"
PLATFORM_SCHEMA = "streamdi"
# Where a declared table lands: the schema of its layer, and its name behind the layer's prefix. Warehouse tables
# keep their names in `dw`; the quality tables sit next to the ledger as platform objects, and the prefix keeps
# "results" from meaning nothing there (`quality.results` -> `streamdi.quality_results`).
SCHEMA_BY_LAYER = {"warehouse": "dw", "quality": PLATFORM_SCHEMA}
TABLE_PREFIX_BY_LAYER = {"quality": "quality_"}
# Declared tables every database gets besides the caller's warehouse tables (see `ensure_objects`).
PLATFORM_PG_TABLES: tuple[Table, ...] = QUALITY_TABLES
# The ledger and the batch metrics as unquoted `schema.name`, for messages and other modules (the statements use
# them as identifiers: `streamdi.warehouse_ddl.LEDGER_ID`, `METRICS_ID`).
LEDGER_TABLE = f"{PLATFORM_SCHEMA}.migration_ledger"
METRICS_TABLE = f"{PLATFORM_SCHEMA}.batch_metrics"


@dataclass
class TableChange:
    """Net changes of one migrated table (warehouse or quality) up to Delta version `delta_version`.

    `upserts` has every declared column, in declared order, with the Arrow types of
    `schemas.model.arrow_type`, at most one row per key; `deletes` has only the key columns. A key in both is
    deleted, then upserted (so it ends up present). A big first load's upserts may be `AppendedRows`, read from
    the Delta files a piece at a time as they are sent (`streamdi.migrator.STREAMED_ROWS`).
    """

    table: Table
    delta_version: int
    batch_id: int
    upserts: pa.Table | AppendedRows
    deletes: pa.Table


@dataclass(frozen=True)
class BatchMetric:
    """A micro-batch a migration makes visible: when its last file arrived, when it was staged and when its Delta
    commits were done (the batch log's stage and transform marks), and how many change rows its commits carry over
    all warehouse tables (`dw.*` only: the quality record a batch leaves is not counted, so `rows` keeps meaning
    warehouse data)."""

    batch_id: int
    arrived_at: dt.datetime | None
    delta_committed_at: dt.datetime | None
    rows: int
    staged_at: dt.datetime | None = None


@dataclass(frozen=True)
class Snapshot:
    """A query's result and what it saw: the newest visible batch and its staleness (snapshot time minus that
    batch's arrival), both read in the same snapshot as the rows. `seconds` is the query's run time."""

    columns: list[str]
    rows: list[tuple]
    newest_batch: int | None
    newest_arrived_at: dt.datetime | None
    staleness_seconds: float | None
    seconds: float


def pg_schema(table: Table) -> str:
    """The PostgreSQL schema a declared table lives in (`warehouse` -> `dw`, `quality` -> `streamdi`)."""
    try:
        return SCHEMA_BY_LAYER[table.layer]
    except KeyError:
        raise ValueError(f"{table.name}: layer {table.layer!r} has no PostgreSQL schema") from None


def pg_name(table: Table) -> str:
    """The table's name in its PostgreSQL schema: the declared name for the warehouse (`dimtrade`), the layer's
    prefix plus the declared name otherwise (`quality_results`)."""
    pg_schema(table)  # refuses layers that are not migrated
    return TABLE_PREFIX_BY_LAYER.get(table.layer, "") + table.name


def pg_qualified_name(table: Table) -> str:
    """`schema.name` of the table in PostgreSQL (`dw.dimtrade`, `streamdi.quality_results`), unquoted."""
    return f"{pg_schema(table)}.{pg_name(table)}"


def ledger_key(table: Table) -> str:
    """The table's `table_name` in `streamdi.migration_ledger`, which records Delta versions: the bare name for
    warehouse tables (as since the first migration, so databases migrated before keep their ledger), the
    qualified Delta name for every other layer (`quality.results`), which no warehouse name can collide with."""
    return table.name if table.layer == "warehouse" else table.qualified_name
