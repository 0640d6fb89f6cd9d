"""Creating and checking the warehouse's PostgreSQL objects: the DDL of every declared table (from
`schemas.model.Table`), the migration ledger and the batch metrics, the bulk-load index functions, the roles
and their privileges, and the drift check that refuses a table that differs from its declaration.

`streamdi.warehouse.Warehouse.ensure_objects` runs `create_objects` in one admin transaction before the first
migration of a process; the statements of the migration itself are in `streamdi.warehouse_apply`. Every
statement is composed with `psycopg.sql` (quoted identifiers, `%s` parameters), none by string formatting.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

from psycopg import Connection, sql

from schemas.model import Table, decimal_precision
from streamdi.warehouse_model import LOADER_ROLE, PLATFORM_SCHEMA, READER_ROLE, pg_name, pg_qualified_name, pg_schema

log = logging.getLogger(__name__)

# The ledger and the batch metrics as identifiers, for the statements of the warehouse modules.
LEDGER_ID = sql.Identifier(PLATFORM_SCHEMA, "migration_ledger")
METRICS_ID = sql.Identifier(PLATFORM_SCHEMA, "batch_metrics")

_LEDGER_DDL = sql.SQL("""CREATE TABLE IF NOT EXISTS {} (
    table_name text NOT NULL,
    delta_version bigint NOT NULL,
    batch_id bigint NOT NULL,
    rows_upserted bigint NOT NULL,
    rows_deleted bigint NOT NULL,
    started_at timestamptz NOT NULL,
    committed_at timestamptz NOT NULL,
    PRIMARY KEY (table_name, delta_version)
);""").format(LEDGER_ID)

_METRICS_DDL = sql.SQL("""CREATE TABLE IF NOT EXISTS {metrics} (
    batch_id bigint PRIMARY KEY,
    arrived_at timestamptz,
    delta_committed_at timestamptz,
    visible_at timestamptz NOT NULL,
    rows bigint NOT NULL,
    unit_last_batch bigint NOT NULL,
    mode text NOT NULL,
    staged_at timestamptz
);""").format(metrics=METRICS_ID)
# columns added to the batch metrics after their first release, for warehouses created before (`_add_missing`)
_METRICS_ADDED = (("staged_at", "timestamptz"),)

# A first load builds a large table's indexes after its COPY (`_load_empty`). Dropping and creating an index
# needs the table's owner, which the loader is not (it may not drop a table): these two functions run as their
# owner (the admin) for the loader, only on an empty table of streamdi's schemas, inside the caller's transaction.
# The first records the table's primary key and indexes in a temporary table of the transaction and drops them,
# and truncates the (empty) table, so that the COPY which follows in the same transaction may freeze its rows (no
# hint bits to set, no later freezing by VACUUM) and, on a server with `wal_level = minimal` (the embedded one),
# write no WAL for them; the second recreates what the first dropped. A transaction that ends between the two rolls
# the drop and the truncation back.
DROP_INDEXES_FN = sql.Identifier(PLATFORM_SCHEMA, "drop_indexes_for_load")
REBUILD_INDEXES_FN = sql.Identifier(PLATFORM_SCHEMA, "rebuild_indexes_after_load")
_BULK_LOAD_DDL = sql.SQL("""
CREATE OR REPLACE FUNCTION {drop_fn}(target regclass) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    is_empty boolean;
    dropped integer := 0;
    ix record;
BEGIN
    IF (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target)
       NOT IN ('dw', {platform_schema}) THEN
        RAISE EXCEPTION '% is not a table of streamdi', target;
    END IF;
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %s)', target) INTO is_empty;
    IF NOT is_empty THEN
        RAISE EXCEPTION '% is not empty: its indexes stay', target;
    END IF;
    EXECUTE format('TRUNCATE %s', target);  -- empty already: lets the COPY that follows FREEZE (and skip WAL)
    CREATE TEMP TABLE IF NOT EXISTS streamdi_dropped_indexes (target regclass, position integer, statement text)
        ON COMMIT DROP;
    FOR ix IN
        SELECT i.indexrelid, con.conname, pg_get_constraintdef(con.oid) AS condef,
               pg_get_indexdef(i.indexrelid) AS ixdef
        FROM pg_index i LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
        WHERE i.indrelid = target
        ORDER BY con.oid IS NULL, i.indexrelid::regclass::text
    LOOP
        dropped := dropped + 1;
        IF ix.conname IS NOT NULL THEN
            INSERT INTO pg_temp.streamdi_dropped_indexes VALUES
                (target, dropped, format('ALTER TABLE %s ADD CONSTRAINT %I %s', target, ix.conname, ix.condef));
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', target, ix.conname);
        ELSE
            INSERT INTO pg_temp.streamdi_dropped_indexes VALUES (target, dropped, ix.ixdef);
            EXECUTE format('DROP INDEX %s', ix.indexrelid::regclass);
        END IF;
    END LOOP;
    RETURN dropped;
END
$fn$;

CREATE OR REPLACE FUNCTION {rebuild_fn}(target regclass) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET maintenance_work_mem = '256MB'
AS $fn$
DECLARE
    statement text;
    rebuilt integer := 0;
BEGIN
    IF to_regclass('pg_temp.streamdi_dropped_indexes') IS NULL THEN
        RETURN 0;
    END IF;
    FOR statement IN
        SELECT d.statement FROM pg_temp.streamdi_dropped_indexes d WHERE d.target = $1 ORDER BY d.position
    LOOP
        EXECUTE statement;
        rebuilt := rebuilt + 1;
    END LOOP;
    DELETE FROM pg_temp.streamdi_dropped_indexes d WHERE d.target = $1;
    RETURN rebuilt;
END
$fn$;

REVOKE ALL ON FUNCTION {drop_fn}(regclass), {rebuild_fn}(regclass) FROM PUBLIC;
""").format(drop_fn=DROP_INDEXES_FN, rebuild_fn=REBUILD_INDEXES_FN, platform_schema=sql.Literal(PLATFORM_SCHEMA))

_PG_TYPES = {
    "int": "integer",
    "bigint": "bigint",
    "double": "double precision",
    "string": "text",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "time": "time",
}
# How PostgreSQL's format_type() spells the types above, for the drift check.
_CATALOG_SPELLING = {"timestamp": "timestamp without time zone", "time": "time without time zone"}


class WarehouseSchemaError(RuntimeError):
    """A table in PostgreSQL differs from its declaration (no silent drift)."""


def pg_type(logical: str) -> str:
    """The PostgreSQL type of a logical column type (see the table in `schemas.model`)."""
    return _pg_type_sql(logical).as_string()


def _pg_type_sql(logical: str) -> sql.Composable:
    dec = decimal_precision(logical)
    if dec:
        return sql.SQL("numeric({},{})").format(*map(sql.Literal, dec))
    return sql.SQL(_PG_TYPES[logical])


def create_table_sql(table: Table) -> str:
    """DDL for one declared table: `CREATE TABLE IF NOT EXISTS`, its `pg_fillfactor` (`ALTER TABLE ... SET`) and
    one `CREATE INDEX IF NOT EXISTS` per `pg_indexes` entry. Types follow the declaration, NOT NULL follows
    `nullable`, the primary key is `table.key`. Idempotent; of an existing table it changes nothing but the
    fillfactor, which applies to the pages written from then on (`Warehouse.ensure_objects` runs only the statements
    of what a table lacks, `_ensure_table`)."""
    return _create_table(table).as_string()


def _create_table(table: Table) -> sql.Composed:
    """`create_table_sql` as one composed statement."""
    qualified = _qualified(table)
    statements = [_create_table_only(table)]
    if table.pg_fillfactor is not None:  # also on a table created before the declaration said so (new pages)
        statements.append(_set_fillfactor(table, qualified))
    statements.extend(_create_index(table, qualified, columns) for columns in table.pg_indexes)
    return sql.SQL("\n").join(statements)


def _qualified(table: Table) -> sql.Composed:
    # The schema is one of the constant names of SCHEMA_BY_LAYER (`dw`, `streamdi`), written unquoted as the DDL
    # always has been; the table, column and index names are quoted identifiers.
    return sql.SQL("{}.{}").format(sql.SQL(pg_schema(table)), sql.Identifier(pg_name(table)))


def _create_table_only(table: Table) -> sql.Composed:
    if not table.key:
        raise ValueError(f"{table.name}: a PostgreSQL table needs a key (primary key and upsert key)")
    lines = [
        sql.SQL("    {} {}{}").format(
            sql.Identifier(c.name), _pg_type_sql(c.type), sql.SQL("" if c.nullable else " NOT NULL")
        )
        for c in table.columns
    ]
    lines.append(sql.SQL("    PRIMARY KEY ({})").format(_column_list(table.key)))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (\n{}\n);").format(_qualified(table), sql.SQL(",\n").join(lines))


def _set_fillfactor(table: Table, qualified: sql.Composable) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} SET (fillfactor = {});").format(qualified, sql.Literal(table.pg_fillfactor))


def _index_name(table: Table, columns: tuple[str, ...]) -> str:
    return f"{pg_name(table)}_{'_'.join(columns)}_idx"[:63]


def _create_index(table: Table, qualified: sql.Composable, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({});").format(
        sql.Identifier(_index_name(table, columns)), qualified, _column_list(columns)
    )


def _ensure_table(conn: Connection, table: Table) -> None:
    """`create_table_sql`, but of an existing table only what it lacks: `CREATE INDEX IF NOT EXISTS` of an index
    that exists still waits for a SHARE lock on the table (behind any open transaction that writes it, or a user's
    VACUUM, and then ahead of every later writer), and `ALTER TABLE ... SET` for a SHARE UPDATE EXCLUSIVE one; a
    process that starts while a migration or a VACUUM runs would wait for it, and hold up the writers queued
    behind it. `CREATE TABLE IF NOT EXISTS` of an existing table takes no lock."""
    qualified = _qualified(table)
    conn.execute(_create_table_only(table))
    regclass = sql.Identifier(pg_schema(table), pg_name(table)).as_string(conn)  # to_regclass's text argument
    options = conn.execute(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass(%s)", (regclass,)
    ).fetchone()[0]
    if table.pg_fillfactor is not None and f"fillfactor={table.pg_fillfactor}" not in options:
        conn.execute(_set_fillfactor(table, qualified))
    for columns in table.pg_indexes:
        index = sql.Identifier(pg_schema(table), _index_name(table, columns)).as_string(conn)
        if conn.execute("SELECT to_regclass(%s) IS NULL", (index,)).fetchone()[0]:
            conn.execute(_create_index(table, qualified, columns))


def _add_missing(conn: Connection, table: sql.Identifier, columns: Iterable[tuple[str, str]]) -> None:
    """`ALTER TABLE ... ADD COLUMN` of the `columns` (name, type) `table` lacks: `ADD COLUMN IF NOT EXISTS` of a
    column that exists still waits for an ACCESS EXCLUSIVE lock (behind every reader of the table)."""
    regclass = table.as_string(conn)
    for name, type_ in columns:
        present = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped",
            (regclass, name),
        ).fetchone()
        if not present:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(table, sql.Identifier(name), sql.SQL(type_)))


def _ensure_view(conn: Connection, name: sql.Composable, statement: sql.Composable) -> None:
    """Run `statement` (which makes the view `name`: `CREATE OR REPLACE VIEW`) unless it made the view there now:
    replacing a view waits for an ACCESS EXCLUSIVE lock on it, behind every query reading it (a dashboard), and
    ahead of the queries after. The view's comment holds a digest of the statement that made it."""
    digest = "streamdi " + hashlib.sha256(statement.as_string(conn).encode()).hexdigest()[:16]
    made = conn.execute(
        sql.SQL("SELECT obj_description(to_regclass({}), 'pg_class')").format(sql.Literal(name.as_string(conn)))
    ).fetchone()[0]
    if made != digest:
        conn.execute(statement)
        conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(name, sql.Literal(digest)))


def _column_list(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, names))


# -- drift check -------------------------------------------------------------------------------------


def _drift(conn: Connection, table: Table) -> list[str]:
    """Differences between an existing PostgreSQL table and its declaration ([] if absent or equal)."""
    qualified = pg_qualified_name(table)
    regclass = sql.Identifier(pg_schema(table), pg_name(table)).as_string(conn)  # to_regclass's text argument
    found = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
        FROM pg_attribute a
        WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        (regclass,),
    ).fetchall()
    if not found:
        return []
    actual = {name: (typ, notnull) for name, typ, notnull in found}
    problems = []
    for col in table.columns:
        expected_type = _CATALOG_SPELLING.get(col.type, pg_type(col.type))
        if col.name not in actual:
            problems.append(f"{qualified}: column {col.name} ({expected_type}) is missing")
            continue
        typ, notnull = actual[col.name]
        if typ != expected_type:
            problems.append(f"{qualified}.{col.name}: type is {typ}, declared {expected_type}")
        if notnull == col.nullable:
            problems.append(
                f"{qualified}.{col.name}: is {'NOT NULL' if notnull else 'nullable'}, "
                f"declared {'nullable' if col.nullable else 'NOT NULL'}"
            )
    for name, (typ, _) in actual.items():
        if name not in table.column_names:
            problems.append(f"{qualified}: column {name} ({typ}) is not declared")
    pk = conn.execute(
        """
        SELECT a.attname
        FROM pg_index i
        CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = to_regclass(%s) AND i.indisprimary
        ORDER BY k.ord
        """,
        (regclass,),
    ).fetchall()
    pk_columns = tuple(r[0] for r in pk)
    if pk_columns != table.key:
        problems.append(f"{qualified}: primary key is {pk_columns or 'missing'}, declared {table.key}")
    return problems


# -- creating what is missing --------------------------------------------------------------------------


def create_objects(
    conn: Connection,
    tables: Iterable[Table],
    *,
    manage_roles: bool,
    dedicated_roles: bool,
    passwords: dict[str, str | None],
    views: Iterable[tuple[sql.Composable, sql.Composable]] = (),
) -> None:
    """Inside the admin's transaction `conn`, serialized across processes: refuse drift, then create what is missing
    (schemas `dw` and `streamdi`, the ledger, the batch metrics, each of `tables` with its indexes, `views` ((name,
    statement) pairs, over those tables), the bulk-load functions), the two roles when `manage_roles` (with
    `passwords` by role key, when given), and their privileges when `dedicated_roles`. Raises WarehouseSchemaError,
    creating nothing, when an existing table differs from its declaration. Of a warehouse that has it all already,
    it changes nothing and takes no lock on its tables and views (`_ensure_table`, `_add_missing`, `_ensure_view`):
    a process that starts waits for no migration, VACUUM or query under way."""
    tables = list(tables)
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('streamdi.ensure_objects'))")
    problems = [p for t in tables for p in _drift(conn, t)]
    if problems:
        raise WarehouseSchemaError(
            "PostgreSQL tables differ from their declarations in schemas/:\n  - " + "\n  - ".join(problems)
        )
    conn.execute(
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}; CREATE SCHEMA IF NOT EXISTS {};").format(
            sql.Identifier("dw"), sql.Identifier(PLATFORM_SCHEMA)
        )
    )
    conn.execute(_LEDGER_DDL)
    conn.execute(_METRICS_DDL)
    _add_missing(conn, METRICS_ID, _METRICS_ADDED)
    for table in tables:
        _ensure_table(conn, table)
    for name, statement in views:  # after the tables they read, before the grants that cover them
        _ensure_view(conn, name, statement)
    conn.execute(_BULK_LOAD_DDL)
    if manage_roles:
        _ensure_roles(conn, passwords)
    if dedicated_roles:
        _grant(conn)


def _ensure_roles(conn: Connection, passwords: dict[str, str | None]) -> None:
    for role, key in ((LOADER_ROLE, "loader"), (READER_ROLE, "reader")):
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            log.info("created role %s", role)
        password = passwords.get(key)
        if password:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))


def _grant(conn: Connection) -> None:
    database = conn.execute("SELECT current_database()").fetchone()[0]
    loader, reader = sql.Identifier(LOADER_ROLE), sql.Identifier(READER_ROLE)
    schemas = sql.SQL(", ").join([sql.Identifier("dw"), sql.Identifier(PLATFORM_SCHEMA)])
    writes = sql.SQL("SELECT, INSERT, UPDATE, DELETE")
    for stmt in (
        sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {loader}"),
        sql.SQL("GRANT CONNECT ON DATABASE {db} TO {reader}"),
        sql.SQL("GRANT USAGE ON SCHEMA {schemas} TO {loader}, {reader}"),
        sql.SQL("GRANT {writes} ON ALL TABLES IN SCHEMA {schemas} TO {loader}"),
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {schemas} TO {reader}"),
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {schemas} GRANT {writes} ON TABLES TO {loader}"),
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {schemas} GRANT SELECT ON TABLES TO {reader}"),
        sql.SQL("GRANT EXECUTE ON FUNCTION {drop_fn}(regclass), {rebuild_fn}(regclass) TO {loader}"),
    ):
        conn.execute(
            stmt.format(
                db=sql.Identifier(database),
                loader=loader,
                reader=reader,
                schemas=schemas,
                writes=writes,
                drop_fn=DROP_INDEXES_FN,
                rebuild_fn=REBUILD_INDEXES_FN,
            )
        )
