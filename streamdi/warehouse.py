"""The PostgreSQL warehouse: the last hop of the data flow (`warehouse.*` Delta -> migrate -> `dw.*`, and the
data-quality record `quality.*` Delta -> migrate -> `streamdi.quality_*`).

The migrator hands this module the net changes of warehouse and quality tables (`TableChange`, as Arrow tables
read from the Delta change feed); `Warehouse.apply_changes` lands all of them in one PostgreSQL transaction
(COPY into temp tables, delete, upsert, ledger row), so a batch is visible entirely or not at all and a
replay is a no-op. Reports and the CLI read through `Warehouse.query` as the read-only role;
`Warehouse.read_snapshot` runs a query in one read-only snapshot together with the newest visible batch, so the
staleness it reports is the staleness of exactly the rows it returns.

This module holds the connections (`Warehouse`, `open_warehouse`) and the reads; the objects' DDL and drift check
are in `streamdi.warehouse_ddl`, the migration transaction's statements in `streamdi.warehouse_apply`, and the
names and records that need no driver (where a table lands, `TableChange`, `BatchMetric`, `Snapshot`) in
`streamdi.warehouse_model`. Only `warehouse`, `warehouse_ddl` and `warehouse_apply` import psycopg. Objects they own:
- schema `dw`: one table per declared warehouse table (`schemas.model.Table`, DDL from
  `streamdi.warehouse_ddl.create_table_sql`);
- schema `streamdi`: `migration_ledger`, one row per (table, Delta version) migrated, and `batch_metrics`, one
  row per micro-batch made visible (arrival, Delta commit and visible times, rows), written in the same
  transaction as the batch's data: a reader that sees a batch's metrics row sees all of its data;
  `quality_results` and `quality_quarantine`, the declared `schemas.quality` tables, landed like `dw.*` tables
  and in the same transactions (`ensure_objects` creates them whatever tables it is given);
- roles `streamdi_loader` (writes dw and streamdi) and `streamdi_reader` (reads them, writes nothing).

Connection: `settings.database_url` when set, else the embedded server (`streamdi.embedded_pg`). On the
embedded server every role logs in with a password (SCRAM): `settings.loader_password` /
`settings.reader_password` when given, else the one the server generated into its password file, which the
conninfo names (`passfile=`); with a URL they use the given passwords. When the URL's user can neither create roles nor
find them already created, every role connects as that user (a warning says so) and the reader's sessions
are read-only (`default_transaction_read_only`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from schemas.model import Table
from streamdi import embedded_pg
from streamdi.errors import QueryFailed, WarehouseUnavailable
from streamdi.settings import Settings
from streamdi.warehouse_apply import apply_all
from streamdi.warehouse_ddl import LEDGER_ID, METRICS_ID, create_objects
from streamdi.warehouse_model import (
    LOADER_ROLE,
    PLATFORM_PG_TABLES,
    READER_ROLE,
    BatchMetric,
    Snapshot,
    TableChange,
    pg_name,
    pg_qualified_name,
    pg_schema,
)
from streamdi.window_views import views_over

log = logging.getLogger(__name__)
# psycopg warns when it cannot end a COPY on a connection that is already gone ("error ignored terminating ..."):
# the migration then raises WarehouseUnavailable with the same cause, so the warning only repeats it.
logging.getLogger("psycopg").setLevel(logging.ERROR)

Role = Literal["admin", "loader", "reader"]

# The newest ledger row of each table: a skip through the ledger's key (table_name, delta_version), two index probes per
# table, instead of a GROUP BY that reads every row the ledger ever got (~15 a micro-batch: 1.5 ms at 7,500 rows).
_MIGRATED_VERSIONS = sql.SQL("""WITH RECURSIVE names(name) AS (
        SELECT min(table_name) FROM {ledger}
        UNION ALL
        SELECT (SELECT min(table_name) FROM {ledger} WHERE table_name > names.name) FROM names WHERE name IS NOT NULL
    )
    SELECT name, (SELECT max(delta_version) FROM {ledger} WHERE table_name = name) FROM names WHERE name IS NOT NULL
""").format(ledger=LEDGER_ID)
_LAST_VISIBLE_BATCH = sql.SQL("SELECT max(batch_id) FROM {}").format(METRICS_ID)


class Warehouse:
    """Handle on the PostgreSQL warehouse; opens a short-lived connection per operation."""

    def __init__(
        self,
        admin_conninfo: str,
        role_conninfo: dict[str, str],
        *,
        dedicated_roles: bool,
        manage_roles: bool,
        passwords: dict[str, str | None],
    ) -> None:
        self._conninfo = {"admin": admin_conninfo, **role_conninfo}
        self.dedicated_roles = dedicated_roles
        self._manage_roles = manage_roles
        self._passwords = passwords
        self._ensured: set[str] | None = None  # qualified PostgreSQL names this handle has created or checked

    # -- connections ---------------------------------------------------------------------------------

    def display_conninfo(self, role: Role = "reader") -> str:
        """libpq connection string for `role` without its password (for psql and BI tools)."""
        params = conninfo_to_dict(self._conninfo[role])
        params.pop("password", None)
        return make_conninfo(**params)

    @contextmanager
    def connect(self, role: Role = "admin") -> Iterator[psycopg.Connection]:
        """A new connection as `role` (not autocommit): committed when the block ends normally, rolled
        back when it raises, closed in both cases."""
        if role not in self._conninfo:
            raise ValueError(f"unknown role {role!r}; expected admin, loader or reader")
        try:
            conn = psycopg.connect(self._conninfo[role])
        except psycopg.OperationalError as exc:
            user = conninfo_to_dict(self._conninfo[role]).get("user")
            # with password authentication the server answers a missing role as a wrong password: ask it
            if role != "admin" and (f'role "{user}" does not exist' in str(exc) or not self._role_exists(user)):
                raise RuntimeError(
                    f"role {user} does not exist yet; Warehouse.ensure_objects creates it (`streamdi load`, `streamdi "
                    "migrate` and `streamdi db start` call it)"
                ) from exc
            if "password authentication failed" in str(exc) or "no password supplied" in str(exc):
                raise
            raise WarehouseUnavailable(
                f"cannot connect to PostgreSQL ({self.display_conninfo(role)}): {' '.join(str(exc).split())}"
            ) from exc
        with conn:
            yield conn

    def _role_exists(self, name: str | None) -> bool:
        """Whether the server has role `name` (True when the admin cannot tell: the caller keeps its own error)."""
        try:
            with self.connect("admin") as conn:
                return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None
        except (psycopg.Error, WarehouseUnavailable):
            return True

    def server_version(self) -> str:
        """The server's version string, e.g. `18.1`."""
        with self.connect("admin") as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def query(
        self,
        statement: str | sql.Composable,
        params: Sequence[Any] | dict[str, Any] | None = None,
        role: Role = "reader",
    ) -> tuple[list[str], list[tuple]]:
        """Run one statement as `role` and return (column names, rows); empty lists for statements that
        return no rows. Writes made as a writing role are committed."""
        with self.connect(role) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            if cur.description is None:
                return [], []
            return [d.name for d in cur.description], cur.fetchall()

    # -- objects -------------------------------------------------------------------------------------

    def ensure_objects(self, tables: Iterable[Table]) -> None:
        """Create what is missing, in one transaction serialized across processes: schemas `dw` and
        `streamdi`, the two roles and their privileges (including tables created later), the migration
        ledger, the batch metrics, one table (with its indexes and fillfactor) per declared table in `tables`, and the
        platform's own declared tables (`PLATFORM_PG_TABLES`: the quality tables), which every caller gets
        without naming them.

        Raises WarehouseSchemaError, creating nothing, when an existing table's columns, types,
        nullability or primary key differ from the declaration (platform tables included). A handle checks
        each table once: later calls with tables it already ensured return at once (the migrator calls this
        before every batch)."""
        by_name = {pg_qualified_name(t): t for t in (*tables, *PLATFORM_PG_TABLES)}
        tables = list(by_name.values())
        if self._ensured is not None and by_name.keys() <= self._ensured:
            return
        with self.connect("admin") as conn:
            create_objects(
                conn,
                tables,
                manage_roles=self._manage_roles,
                dedicated_roles=self.dedicated_roles,
                passwords=self._passwords,
                views=views_over(tables),
            )
        self._ensured = (self._ensured or set()) | by_name.keys()
        log.info("warehouse objects ensured (%d declared tables)", len(tables))

    # -- migration -----------------------------------------------------------------------------------

    def apply_changes(
        self,
        changes: Iterable[TableChange],
        batches: Sequence[BatchMetric] | Callable[[], Sequence[BatchMetric]] = (),
        mode: str = "push",
    ) -> dict[str, int]:
        """Apply all `changes` in ONE transaction as the loader role and return rows applied per table, keyed
        by `ledger_key` (upserted + deleted; 0 for a skipped change). `changes` may be a lazy iterable: each is
        checked and applied as it comes (a bad one rolls back the whole transaction). `batches` (or a function
        returning them, called once `changes` is exhausted) are the micro-batches this migration unit makes
        visible: each gets its `batch_metrics` row (`visible_at` = the clock right before COMMIT, `mode` = push
        or pull) in the same transaction; a batch that already has one keeps it.

        Guarantees: either every change, its ledger row and the batches' metrics rows are committed, or
        nothing is (a crash at any point leaves the previous state). A change whose table already has a ledger
        row with delta_version >= its delta_version is skipped, so replaying a list is a no-op. Concurrent
        callers serialize on an advisory lock. Values round-trip exactly (NULL vs empty string, decimals,
        timestamps as wall-clock values, `time` text)."""
        committing = False
        try:
            with self.connect("loader") as conn:
                applied = apply_all(conn, changes, batches, mode)
                committing = True
                conn.commit()
        except psycopg.OperationalError as exc:
            outcome = (
                "the server may or may not have committed it"
                if committing
                else "nothing of it was committed (one transaction)"
            )
            raise WarehouseUnavailable(
                f"PostgreSQL ({self.display_conninfo('loader')}) was lost during a migration: "
                f"{' '.join(str(exc).split()).rstrip('.')}; {outcome}. Run again once the server is back: the "
                "migration resumes from the ledger, exactly once"
            ) from exc
        return applied

    def last_migrated_version(self, table_name: str) -> int | None:
        """The highest Delta version of `table_name` (a `ledger_key`) recorded in the ledger, None if never
        migrated."""
        _, rows = self.query(
            sql.SQL("SELECT max(delta_version) FROM {} WHERE table_name = %s").format(LEDGER_ID), (table_name,)
        )
        return rows[0][0]

    def migrated_versions(self) -> dict[str, int]:
        """The highest migrated Delta version of every table in the ledger, by `ledger_key` (one query)."""
        _, rows = self.query(_MIGRATED_VERSIONS)
        return dict(rows)

    def migration_state(self) -> tuple[int | None, dict[str, int]]:
        """`(last_visible_batch(), migrated_versions())` read in one round trip."""
        with self.connect("reader") as conn:
            visible = conn.execute(_LAST_VISIBLE_BATCH).fetchone()[0]
            versions = conn.execute(_MIGRATED_VERSIONS).fetchall()
        return visible, dict(versions)

    def last_visible_batch(self) -> int | None:
        """The newest micro-batch visible in PostgreSQL (per `batch_metrics`), None if none is."""
        _, rows = self.query(_LAST_VISIBLE_BATCH)
        return rows[0][0]

    def batch_visible(self, batch_id: int) -> bool:
        """Whether `batch_id` is visible (its metrics row, hence all of its data, is committed)."""
        _, rows = self.query(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE batch_id = %s)").format(METRICS_ID), (batch_id,)
        )
        return bool(rows[0][0])

    def batch_metrics(self) -> list[dict[str, Any]]:
        """All `batch_metrics` rows, oldest batch first."""
        columns, rows = self.query(sql.SQL("SELECT * FROM {} ORDER BY batch_id").format(METRICS_ID))
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def batch_latency(self, batch_id: int) -> tuple[int, float | None, float | None, float | None] | None:
        """The batch's `batch_metrics` row as (rows, seconds from arrival to staged, to committed in Delta, to
        visible in PostgreSQL), or None when the batch is not visible yet."""
        since = sql.SQL("extract(epoch FROM {} - arrived_at)")
        _, rows = self.query(
            sql.SQL("SELECT rows, {}, {}, {} FROM {} WHERE batch_id = %s").format(
                since.format(sql.Identifier("staged_at")),
                since.format(sql.Identifier("delta_committed_at")),
                since.format(sql.Identifier("visible_at")),
                METRICS_ID,
            ),
            (batch_id,),
        )
        if not rows:
            return None
        count, *seconds = rows[0]
        return int(count or 0), *(None if v is None else float(v) for v in seconds)

    def row_counts(self, tables: Iterable[Table]) -> dict[str, int]:
        """Rows of each of `tables` in PostgreSQL, by table name (one statement)."""
        tables = list(tables)
        if not tables:
            return {}
        counts = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {}, count(*) FROM {}").format(sql.Literal(t.name), sql.Identifier(pg_schema(t), pg_name(t)))
            for t in tables
        )
        return {name: int(n) for name, n in self.query(counts)[1]}

    def empty_tables(self, tables: Iterable[Table]) -> None:
        """TRUNCATE `tables`, the migration ledger and the batch metrics, as the admin (benchmarks start every run
        from an empty warehouse)."""
        names = [sql.Identifier(pg_schema(t), pg_name(t)) for t in tables]
        self.query(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join([*names, LEDGER_ID, METRICS_ID])), role="admin")

    def read_snapshot(
        self, statement: str, params: Sequence[Any] | dict[str, Any] | None = None, *, timeout: float = 0
    ) -> Snapshot:
        """Run one read-only statement as the reader, in a REPEATABLE READ transaction that first reads the
        newest visible batch: the rows and the staleness (snapshot time minus the newest visible batch's
        arrival) describe the same snapshot.

        One statement only: it is sent with the extended protocol (prepared), which refuses a string of several
        (`COMMIT; DELETE ...` cannot end the read-only transaction and go on). The transaction is READ ONLY, and
        with `timeout` (seconds, 0: none) PostgreSQL cancels the statement after that long. A statement that fails
        raises QueryFailed with PostgreSQL's message."""
        with self.connect("reader") as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            if timeout > 0:
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout * 1000)}ms",))
            newest = conn.execute(
                sql.SQL(
                    """SELECT m.batch_id, m.arrived_at, extract(epoch FROM statement_timestamp() - m.arrived_at)
                    FROM (SELECT max(batch_id) AS b FROM {metrics}) AS top
                    LEFT JOIN {metrics} AS m ON m.batch_id = top.b"""
                ).format(metrics=METRICS_ID)
            ).fetchone()
            started = time.perf_counter()
            try:
                with conn.cursor() as cur:
                    cur.execute(statement, params, prepare=True)
                    columns = [d.name for d in cur.description] if cur.description else []
                    rows = cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                missing = isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName)
                raise QueryFailed(" ".join(str(exc).split()) or type(exc).__name__, missing_relation=missing) from exc
            seconds = time.perf_counter() - started
        batch_id, arrived_at, staleness = newest
        return Snapshot(
            columns=columns,
            rows=rows,
            newest_batch=batch_id,
            newest_arrived_at=arrived_at,
            staleness_seconds=float(staleness) if staleness is not None else None,
            seconds=seconds,
        )

    def ledger(self) -> list[dict[str, Any]]:
        """All ledger rows, oldest commit first (ties by table name and version)."""
        columns, rows = self.query(
            sql.SQL("SELECT * FROM {} ORDER BY committed_at, table_name, delta_version").format(LEDGER_ID),
            role="reader",
        )
        return [dict(zip(columns, row, strict=True)) for row in rows]


def open_warehouse(settings: Settings) -> Warehouse:
    """Connect to the warehouse server (`DATABASE_URL`, else the embedded server, started if needed) and
    decide how each role connects. Creates no database objects (see `Warehouse.ensure_objects`)."""
    given = {"loader": settings.loader_password, "reader": settings.reader_password}
    passwords = dict(given)
    if settings.database_url:
        url = settings.database_url
    else:  # every login needs a password: the ones not given come from the embedded server's password file
        url = embedded_pg.ensure_server(settings, roles=(LOADER_ROLE, READER_ROLE))
        stored = embedded_pg.role_passwords(settings)
        passwords = {
            key: given[key] or stored[role] for key, role in (("loader", LOADER_ROLE), ("reader", READER_ROLE))
        }
    with psycopg.connect(url) as conn:
        (can_create,) = conn.execute(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        existing = conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname IN (%s, %s)", (LOADER_ROLE, READER_ROLE)
        ).fetchone()[0]
        user = conn.info.user
    dedicated = bool(can_create) or existing == 2
    if dedicated:  # a password from the password file stays out of the conninfo (it names the file)
        role_conninfo = {
            "loader": _conninfo_as(url, LOADER_ROLE, given["loader"]),
            "reader": _conninfo_as(url, READER_ROLE, given["reader"]),
        }
    else:
        log.warning(
            "PostgreSQL user %r cannot create roles and %s/%s do not exist: loading and reading "
            "connect as %r (reads in read-only transactions)",
            user,
            LOADER_ROLE,
            READER_ROLE,
            user,
        )
        role_conninfo = {
            "loader": make_conninfo(url),
            "reader": make_conninfo(url, options="-c default_transaction_read_only=on"),
        }
    return Warehouse(
        url,
        role_conninfo,
        dedicated_roles=dedicated,
        manage_roles=bool(can_create),
        passwords=passwords,
    )


def _conninfo_as(url: str, user: str, password: str | None) -> str:
    params = conninfo_to_dict(url)
    params.pop("password", None)  # never reuse the admin's password for another role
    params["user"] = user
    if password:
        params["password"] = password
    return make_conninfo(**params)
