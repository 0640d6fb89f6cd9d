"""The migration transaction's statements: each `TableChange` lands in its table (COPY into an empty table, or
COPY into temporary tables, DELETE, then INSERT ... ON CONFLICT DO UPDATE), with its row in the migration ledger,
and the unit's micro-batches get their `batch_metrics` rows. COPY sends PostgreSQL's binary format, encoded from
the Arrow rows by pgpq: the server stores it without parsing text (numerics, dates), and it is encoded in half the
time CSV is written.

`streamdi.warehouse.Warehouse.apply_changes` opens the loader's connection, calls `apply_all` and commits (or
reports a lost server); this module never commits. Every statement is composed with `psycopg.sql`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pgpq import ArrowToPostgresBinaryEncoder
from psycopg import Connection, sql
from psycopg.copy import QueuedLibpqWriter

from schemas.model import Table
from streamdi import row_order
from streamdi.delta_appends import AppendedRows
from streamdi.faults import fault_point
from streamdi.warehouse_ddl import DROP_INDEXES_FN, LEDGER_ID, METRICS_ID, REBUILD_INDEXES_FN
from streamdi.warehouse_model import BatchMetric, TableChange, ledger_key, pg_name, pg_schema

log = logging.getLogger(__name__)

# Rows per COPY chunk: bounds the memory of the encoding, not the transaction size.
COPY_CHUNK_ROWS = 10_000
# A first load of at least this many rows builds the table's indexes after the COPY (`_load_empty`).
BULK_LOAD_ROWS = 50_000


def apply_all(
    conn: Connection,
    changes: Iterable[TableChange],
    batches: Sequence[BatchMetric] | Callable[[], Sequence[BatchMetric]],
    mode: str,
) -> dict[str, int]:
    """Inside the loader's transaction `conn` (not committed here), serialized with other migrations by an
    advisory lock: check and apply each of `changes` as it comes (`TableChange`s, possibly lazy), then write the
    `batch_metrics` rows of `batches` (or of what the function returns, called once `changes` is exhausted).
    Returns rows applied per `ledger_key` (0 for a change its ledger already holds). See
    `Warehouse.apply_changes` for the guarantees."""
    applied: dict[str, int] = {}
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('streamdi.migrate'))")
    for n, change in enumerate(changes):
        _check_change(change)
        key = ledger_key(change.table)
        applied[key] = applied.get(key, 0) + _apply_one(conn, change, n)
    if callable(batches):
        batches = batches()
    if batches:
        _record_batches(conn, batches, mode)
    fault_point("pg.before_commit")
    return applied


# -- one change inside the migration transaction ------------------------------------------------------


def _check_change(change: TableChange) -> None:
    table = change.table
    pg_schema(table)  # refuses a layer that is not migrated
    name = ledger_key(table)
    if change.upserts.column_names != table.column_names:
        raise ValueError(f"{name}: upserts have columns {change.upserts.column_names}, expected {table.column_names}")
    if change.deletes.column_names != list(table.key):
        raise ValueError(f"{name}: deletes have columns {change.deletes.column_names}, expected {table.key}")
    keys = list(table.key)
    if change.upserts.num_rows and not row_order.rows_distinct(change.upserts.select(keys), keys):
        raise ValueError(f"{name}: upserts hold more than one row for some key (changes must be net)")


def _apply_one(conn: Connection, change: TableChange, n: int) -> int:
    table = change.table
    key = ledger_key(table)
    target = sql.Identifier(pg_schema(table), pg_name(table))
    done = conn.execute(
        sql.SQL("SELECT max(delta_version) FROM {} WHERE table_name = %s").format(LEDGER_ID), (key,)
    ).fetchone()[0]
    if done is not None and done >= change.delta_version:
        log.info(
            "%s: Delta version %s already migrated (ledger at %s); skipped",
            key,
            change.delta_version,
            done,
        )
        return 0
    started_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]

    if _is_empty(conn, target):
        # First load of a table (e.g. Batch1): upserts are net (one row per key), nothing can conflict and
        # nothing is there to delete, so COPY straight into the table -- no temporary table, no second pass.
        _load_empty(conn, change, target)
        upserted, deleted = change.upserts.num_rows, 0
    else:
        upserted, deleted = _upsert_via_temp(conn, change, target, n)

    conn.execute(
        sql.SQL(
            """INSERT INTO {}
            (table_name, delta_version, batch_id, rows_upserted, rows_deleted, started_at, committed_at)
            VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp())"""
        ).format(LEDGER_ID),
        (key, change.delta_version, change.batch_id, upserted, deleted, started_at),
    )
    log.info(
        "%s: Delta version %s (batch %s): %d upserted, %d deleted",
        key,
        change.delta_version,
        change.batch_id,
        upserted,
        deleted,
    )
    return upserted + deleted


def _load_empty(conn: Connection, change: TableChange, target: sql.Composable) -> None:
    """COPY a change into its empty table. A large one (BULK_LOAD_ROWS) goes in without the table's indexes,
    rebuilt afterwards (`DROP_INDEXES_FN`, `REBUILD_INDEXES_FN`): one sort per index instead of an index insert
    per row, half the time (FactMarketHistory at SF 3, 1.27M rows: 2.9 s instead of 5.9 s). The drop holds the
    table's ACCESS EXCLUSIVE lock until COMMIT: a reader of the (empty) table waits for the first batch instead
    of seeing it empty. The drop also truncates the table, so the COPY freezes its rows (`DROP_INDEXES_FN`)."""
    regclass = target.as_string(conn)  # the functions' argument: the quoted `"schema"."name"`, as text
    bulk = change.upserts.num_rows >= BULK_LOAD_ROWS
    if bulk:
        conn.execute(sql.SQL("SELECT {}(%s::regclass)").format(DROP_INDEXES_FN), (regclass,))
    _copy_arrow(conn, target, change.upserts, change.table, fault_name="pg.during_copy", freeze=bulk)
    fault_point("pg.after_copy")
    if bulk:
        conn.execute(sql.SQL("SELECT {}(%s::regclass)").format(REBUILD_INDEXES_FN), (regclass,))


def _is_empty(conn: Connection, target: sql.Composable) -> bool:
    return conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(target)).fetchone()[0]


def _upsert_via_temp(conn: Connection, change: TableChange, target: sql.Composable, n: int) -> tuple[int, int]:
    """COPY the upserts (and deletes) into temporary tables, delete, then INSERT ... ON CONFLICT DO UPDATE.
    Returns (rows upserted, rows deleted)."""
    table = change.table
    upserts_tmp = sql.Identifier(f"streamdi_upserts_{n}")
    deletes_tmp = sql.Identifier(f"streamdi_deletes_{n}")
    columns = sql.SQL(", ").join(map(sql.Identifier, table.column_names))
    key = sql.SQL(", ").join(map(sql.Identifier, table.key))

    conn.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(upserts_tmp, target))
    _copy_arrow(conn, upserts_tmp, change.upserts, table, fault_name="pg.during_copy")
    fault_point("pg.after_copy")

    deleted = 0
    if change.deletes.num_rows:
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
                deletes_tmp, key, target
            )
        )
        _copy_arrow(conn, deletes_tmp, change.deletes, table)
        match = sql.SQL(" AND ").join(sql.SQL("t.{c} = d.{c}").format(c=sql.Identifier(c)) for c in table.key)
        deleted = conn.execute(
            sql.SQL("DELETE FROM {} AS t USING {} AS d WHERE {}").format(target, deletes_tmp, match)
        ).rowcount

    non_key = [c for c in table.column_names if c not in table.key]
    if non_key:
        on_conflict = sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in non_key)
        )
    else:
        on_conflict = sql.SQL("DO NOTHING")
    upserted = conn.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
            target, columns, columns, upserts_tmp, key, on_conflict
        )
    ).rowcount
    return upserted, deleted


def _record_batches(conn: Connection, batches: Sequence[BatchMetric], mode: str) -> None:
    """The `batch_metrics` rows of a migration unit, the transaction's last statement before COMMIT."""
    visible_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    unit_last = max(b.batch_id for b in batches)
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                """INSERT INTO {}
                (batch_id, arrived_at, staged_at, delta_committed_at, visible_at, rows, unit_last_batch, mode)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (batch_id) DO NOTHING"""
            ).format(METRICS_ID),
            [
                (b.batch_id, b.arrived_at, b.staged_at, b.delta_committed_at, visible_at, b.rows, unit_last, mode)
                for b in batches
            ],
        )


def _as_declared(batch: pa.RecordBatch, table: Table) -> pa.RecordBatch:
    """Cast to the declared Arrow types, then to what binary COPY sends for the column's PostgreSQL type:
    timestamps without their zone (a PostgreSQL `timestamp` stores the wall-clock value, UTC here), and the
    `time` columns (HH:MM:SS text in Arrow) as microseconds of the day."""
    schema = table.arrow_schema()
    logical = {c.name: c.type for c in table.columns}
    columns = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        target = schema.field(name).type
        if col.type != target:
            col = col.cast(target)
        if pa.types.is_timestamp(target) and target.tz is not None:
            col = col.cast(pa.timestamp(target.unit))
        elif logical[name] == "time":
            col = _time_of_day(col)
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _time_of_day(text: pa.Array) -> pa.Array:
    """`HH:MM:SS` (the staging tables' `time` text, checked when staged) as Arrow `time64[us]`."""
    parts = pc.split_pattern(text, ":")
    seconds = pc.add(
        pc.add(
            pc.multiply(pc.list_element(parts, 0).cast(pa.int64()), 3600),
            pc.multiply(pc.list_element(parts, 1).cast(pa.int64()), 60),
        ),
        pc.list_element(parts, 2).cast(pa.int64()),
    )
    return pc.multiply(seconds, 1_000_000).cast(pa.time64("us"))


def _copy_arrow(
    conn: Connection,
    target: sql.Composable,
    rows: pa.Table | AppendedRows,
    table: Table,
    fault_name: str | None = None,
    *,
    freeze: bool = False,
) -> None:
    """Stream `rows` (of `table`'s columns, or of some of them) into `target` in PostgreSQL's binary COPY format,
    a chunk at a time. The encoder (pgpq) checks each chunk against the first one's types, and the server each
    value against its column's type: a mismatch fails the COPY (and the transaction), it is never converted.
    `freeze`: the rows are written frozen (COPY's FREEZE: `target` was truncated in this transaction)."""
    copy = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary{})").format(
        target, sql.SQL(", ").join(map(sql.Identifier, rows.column_names)), sql.SQL(", FREEZE" if freeze else "")
    )
    encoder: ArrowToPostgresBinaryEncoder | None = None
    # The queued writer sends to the server from a thread: the next chunk is encoded meanwhile.
    with conn.cursor() as cur, cur.copy(copy, writer=QueuedLibpqWriter(cur)) as pg_copy:
        for i, batch in enumerate(_chunks(rows)):
            batch = _as_declared(batch, table)
            if encoder is None:
                encoder = ArrowToPostgresBinaryEncoder(batch.schema)
                pg_copy.write(encoder.write_header())
            pg_copy.write(encoder.write_batch(batch))
            if i == 0 and fault_name:
                fault_point(fault_name)
        pg_copy.write(encoder.finish())


def _chunks(rows: pa.Table | AppendedRows) -> Iterator[pa.RecordBatch]:
    """`rows` in batches of at most `COPY_CHUNK_ROWS`; one empty batch when there are none."""
    empty = True
    for batch in rows.to_batches(max_chunksize=COPY_CHUNK_ROWS):
        empty = False
        yield batch
    if empty:
        yield pa.RecordBatch.from_pylist([], schema=rows.schema)
