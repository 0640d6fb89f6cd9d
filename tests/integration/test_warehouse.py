"""The PostgreSQL warehouse on a real server: embedded server lifecycle, roles, DDL from declarations, drift
detection, exact value round-trips, upsert/delete/replay semantics and crashes inside the migration
transaction (real subprocesses killed with SIGKILL at each fault point)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path

import psutil
import psycopg
import psycopg.errors
import pyarrow as pa
import pytest

from schemas import windows as ws
from schemas.model import Column as C
from schemas.model import Table
from streamdi import embedded_pg
from streamdi.settings import Settings
from streamdi.warehouse import Warehouse, open_warehouse
from streamdi.warehouse_apply import BULK_LOAD_ROWS, COPY_CHUNK_ROWS
from streamdi.warehouse_ddl import WarehouseSchemaError, create_table_sql
from streamdi.warehouse_model import TableChange

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FAULT_POINTS = ("pg.during_copy", "pg.after_copy", "pg.before_commit")


# -- declarations and builders -------------------------------------------------------------------------


def values_table(name: str) -> Table:
    """A test-only warehouse table with one column of every logical type."""
    return Table(
        name=name,
        layer="warehouse",
        columns=(
            C("id", "int", False),
            C("label", "string"),
            C("code", "string", False),
            C("amount", "decimal(10,5)"),
            C("ratio", "double"),
            C("big", "bigint"),
            C("flag", "boolean"),
            C("event_day", "date"),
            C("event_at", "timestamp"),
            C("event_time", "time"),
        ),
        key=("id",),
        order_by=("id",),
        pg_indexes=(("event_day",), ("code", "flag")),
    )


def value_row(id_: int, **overrides) -> dict:
    row = {
        "id": id_,
        "label": f"label-{id_}",
        "code": f"C{id_}",
        "amount": Decimal("1.50000"),
        "ratio": 0.5,
        "big": 10**12 + id_,
        "flag": id_ % 2 == 0,
        "event_day": date(2024, 1, 31),
        "event_at": datetime(2024, 1, 31, 12, 30, 0, tzinfo=UTC),
        "event_time": "12:30:00",
    }
    row.update(overrides)
    return row


def pg_row(row: dict) -> tuple:
    """What PostgreSQL returns for a builder row: zone-less timestamps, real `time` values."""
    at = row["event_at"]
    clock = row["event_time"]
    return (
        row["id"],
        row["label"],
        row["code"],
        row["amount"],
        row["ratio"],
        row["big"],
        row["flag"],
        row["event_day"],
        None if at is None else at.replace(tzinfo=None),
        None if clock is None else time.fromisoformat(clock),
    )


def change(table: Table, version: int, batch: int, upserts: list[dict], deletes: list[int] = ()) -> TableChange:
    key_schema = pa.schema([table.arrow_schema().field(k) for k in table.key])
    return TableChange(
        table=table,
        delta_version=version,
        batch_id=batch,
        upserts=pa.Table.from_pylist(upserts, schema=table.arrow_schema()),
        deletes=pa.Table.from_pylist([{"id": i} for i in deletes], schema=key_schema),
    )


def rows_of(wh: Warehouse, table: Table) -> list[tuple]:
    return wh.query(f"SELECT * FROM dw.{table.name} ORDER BY id")[1]


def ledger_of(wh: Warehouse, *tables: Table) -> list[dict]:
    names = {t.name for t in tables}
    return [r for r in wh.ledger() if r["table_name"] in names]


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMDI_FAULT_AT", "DATABASE_URL")}
    env["STREAMDI_HOME"] = str(settings.home)
    if settings.database_url:
        env["DATABASE_URL"] = settings.database_url
    env.update(extra)
    return env


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


needs_embedded = pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="embedded server only")


# -- embedded server and roles --------------------------------------------------------------------------


@needs_embedded
def test_one_process_gets_each_database_it_asks_for_on_the_same_embedded_server(settings, warehouse):
    other = settings.model_copy(update={"pg_database": "streamdi_second"})

    first = embedded_pg.ensure_server(settings)
    second = embedded_pg.ensure_server(other)

    with psycopg.connect(first) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == settings.pg_database
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "streamdi_second"
    assert embedded_pg.ensure_server(settings) == first


@needs_embedded
def test_embedded_server_runs_as_pgserver_and_is_shared_with_another_process(settings, warehouse):
    url = embedded_pg.ensure_server(settings)
    postmaster = psutil.Process(int((settings.pgdata / "postmaster.pid").read_text().splitlines()[0]))
    if os.geteuid() == 0:
        assert postmaster.username() == "pgserver"  # PostgreSQL refuses root; the library runs it as pgserver
    started = warehouse.query("SELECT pg_postmaster_start_time()::text")[1][0][0]

    child = run_python(
        "import json\n"
        "from streamdi.settings import load_settings\n"
        "from streamdi.embedded_pg import ensure_server\n"
        "from streamdi.warehouse import open_warehouse\n"
        "import os\n"
        "s = load_settings()\n"
        "url = ensure_server(s)\n"
        "started = open_warehouse(s).query('SELECT pg_postmaster_start_time()::text')[1][0][0]\n"
        "print(json.dumps([url, started, os.getpid()]))\n",
        child_env(settings),
    )

    assert child.returncode == 0, child.stderr
    child_url, child_started, child_pid = json.loads(child.stdout)
    assert (child_url, child_started) == (url, started)
    # The child unregistered on exit; this process still uses the server, so it keeps running.
    assert embedded_pg.server_running(settings)
    assert psutil.Process(postmaster.pid).is_running()
    handles = json.loads((settings.pgdata / ".handle_pids.json").read_text())
    assert os.getpid() in handles
    assert child_pid not in handles


@needs_embedded
def test_every_login_to_the_embedded_server_needs_its_password_also_after_an_older_trusting_home(tmp_path):
    """A server of its own: pg_hba.conf is one SCRAM line, the passwords are in <home>/pgpass (0600), a conninfo
    without the file is refused for every role. Then the home is made as an older streamdi left it (trust, no
    password file): the next start converts it, the data stays."""
    from streamdi.warehouse import open_warehouse
    from streamdi.warehouse_model import LOADER_ROLE, READER_ROLE

    settings = Settings(home=tmp_path / "home")

    def refused_without_the_file(url: str, user: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(url)
        params.pop("passfile")
        with pytest.raises(psycopg.OperationalError, match="no password supplied|password authentication failed"):
            psycopg.connect(psycopg.conninfo.make_conninfo(**{**params, "user": user}), passfile="/dev/null")

    try:
        warehouse = open_warehouse(settings)
        warehouse.ensure_objects([])
        url = embedded_pg.ensure_server(settings)
        hba = (settings.pgdata / "pg_hba.conf").read_text()
        assert [line for line in hba.splitlines() if not line.startswith("#")] == ["local all all scram-sha-256"]
        pgpass = settings.home / "pgpass"
        assert pgpass.stat().st_mode & 0o777 == 0o600
        assert sorted(embedded_pg.role_passwords(settings)) == sorted(["postgres", LOADER_ROLE, READER_ROLE])
        assert "password" not in url.lower().replace("passfile", "")
        for user in ("postgres", LOADER_ROLE, READER_ROLE):
            refused_without_the_file(url, user)
        warehouse.query("CREATE TABLE dw.kept (id integer)", role="admin")
        warehouse.query("INSERT INTO dw.kept VALUES (1)", role="admin")
        assert warehouse.query("SELECT current_user", role="reader")[1] == [(READER_ROLE,)]

        embedded_pg.stop_server(settings)
        (settings.pgdata / "pg_hba.conf").write_text("local all all trust\n")
        pgpass.unlink()
        again = open_warehouse(settings)  # converts the home: new passwords, SCRAM only
        assert (settings.pgdata / "pg_hba.conf").read_text() == hba
        assert again.query("SELECT id FROM dw.kept", role="reader")[1] == [(1,)]
        assert again.query("SELECT current_user", role="loader")[1] == [(LOADER_ROLE,)]
        for user in ("postgres", LOADER_ROLE, READER_ROLE):
            refused_without_the_file(embedded_pg.ensure_server(settings), user)
    finally:
        embedded_pg.stop_server(settings)


def test_reader_selects_but_cannot_write_loader_writes(warehouse):
    table = values_table("wh_test_roles")
    warehouse.ensure_objects([table])
    warehouse.apply_changes([change(table, 1, 1, [value_row(1)])])

    assert warehouse.query("SELECT id, code FROM dw.wh_test_roles", role="reader") == (
        ["id", "code"],
        [(1, "C1")],
    )
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table wh_test_roles"):
        warehouse.query("INSERT INTO dw.wh_test_roles (id, code) VALUES (2, 'C2')", role="reader")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table migration_ledger"):
        warehouse.query("DELETE FROM streamdi.migration_ledger", role="reader")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner of table wh_test_roles"):
        warehouse.query("DROP TABLE dw.wh_test_roles", role="loader")

    warehouse.query("INSERT INTO dw.wh_test_roles (id, code) VALUES (2, 'C2')", role="loader")
    assert warehouse.query("SELECT id, code FROM dw.wh_test_roles ORDER BY id")[1] == [(1, "C1"), (2, "C2")]
    assert warehouse.query("SELECT current_user", role="reader")[1] == [("streamdi_reader",)]
    assert warehouse.query("SELECT current_user", role="loader")[1] == [("streamdi_loader",)]


def test_default_privileges_cover_tables_created_later(warehouse):
    warehouse.query("CREATE TABLE dw.wh_test_later (id integer PRIMARY KEY)", role="admin")
    warehouse.query("INSERT INTO dw.wh_test_later VALUES (7)", role="loader")
    assert warehouse.query("SELECT id FROM dw.wh_test_later", role="reader")[1] == [(7,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        warehouse.query("UPDATE dw.wh_test_later SET id = 8", role="reader")


# -- DDL from declarations ----------------------------------------------------------------------------


def test_create_table_sql_text():
    table = Table(
        name="wh_test_tiny",
        layer="warehouse",
        columns=(C("k1", "int", False), C("k2", "string", False), C("rate", "decimal(6,5)")),
        key=("k1", "k2"),
        pg_indexes=(("rate",),),
    )
    assert create_table_sql(table) == (
        'CREATE TABLE IF NOT EXISTS dw."wh_test_tiny" (\n'
        '    "k1" integer NOT NULL,\n'
        '    "k2" text NOT NULL,\n'
        '    "rate" numeric(6,5),\n'
        '    PRIMARY KEY ("k1", "k2")\n'
        ");\n"
        'CREATE INDEX IF NOT EXISTS "wh_test_tiny_rate_idx" ON dw."wh_test_tiny" ("rate");'
    )


def test_a_declared_fillfactor_is_set_on_new_and_existing_tables(warehouse, settings):
    table = Table(name="wh_test_fill", layer="warehouse", columns=(C("k", "int", False), C("v", "int")), key=("k",))
    assert "fillfactor" not in create_table_sql(table)
    warehouse.ensure_objects([table])  # created with PostgreSQL's default
    half = dataclasses.replace(table, pg_fillfactor=50)
    assert create_table_sql(half).endswith('ALTER TABLE dw."wh_test_fill" SET (fillfactor = 50);')
    open_warehouse(settings).ensure_objects([half])  # a handle that has not ensured it yet
    options = "SELECT reloptions FROM pg_class WHERE oid = to_regclass('dw.wh_test_fill')"
    assert warehouse.query(options)[1] == [(["fillfactor=50"],)]
    with pytest.raises(ValueError, match="pg_fillfactor must be 10 to 100"):
        dataclasses.replace(table, pg_fillfactor=5)


def test_ensuring_complete_objects_waits_for_no_migration_vacuum_or_query(warehouse, settings):
    """A process that starts while a migration writes a table, a VACUUM runs on it and a dashboard reads the batch
    metrics and a window view ensures what it finds complete without taking a lock on any of them: `CREATE INDEX IF
    NOT EXISTS` of an existing index waits for a SHARE lock, `ALTER TABLE ... SET` and `ADD COLUMN IF NOT EXISTS` and
    `CREATE OR REPLACE VIEW` for theirs, all behind those transactions (and ahead of the writers queued after)."""
    busy = Table(
        name="wh_test_busy",
        layer="warehouse",
        columns=(C("k", "int", False), C("v", "int")),
        key=("k",),
        pg_indexes=(("v",),),
        pg_fillfactor=60,
    )
    tables = [busy, ws.SLICE_TABLES[ws.TRADES], ws.WINDOW_LATEST]
    warehouse.ensure_objects(tables)
    with warehouse.connect("admin") as blocker:
        blocker.execute("INSERT INTO dw.wh_test_busy VALUES (1, 1)")  # a migration under way: ROW EXCLUSIVE
        blocker.execute("SELECT count(*) FROM streamdi.batch_metrics")  # a reader: ACCESS SHARE
        blocker.execute("SELECT count(*) FROM dw.trade_window_answers")  # a dashboard on a view
        with warehouse.connect("admin") as vacuum:  # a VACUUM's lock on the table, in a transaction of its own
            vacuum.execute("LOCK TABLE dw.wh_test_busy IN SHARE UPDATE EXCLUSIVE MODE")
            ensured = threading.Event()

            def ensure() -> None:
                open_warehouse(settings).ensure_objects(tables)  # a new process's handle
                ensured.set()

            starting = threading.Thread(target=ensure, daemon=True)
            starting.start()
            finished_alone = ensured.wait(30)
            vacuum.rollback()
        blocker.rollback()
    starting.join(60)
    assert finished_alone, "ensure_objects waited for the other transactions' locks"
    options = "SELECT reloptions FROM pg_class WHERE oid = to_regclass('dw.wh_test_busy')"
    assert warehouse.query(options)[1] == [(["fillfactor=60"],)]
    index = "SELECT to_regclass('dw.wh_test_busy_v_idx') IS NOT NULL"
    assert warehouse.query(index)[1] == [(True,)]


def test_ensuring_objects_makes_what_an_older_warehouse_lacks(warehouse, settings):
    """What a warehouse made by an earlier release lacks is made: a batch-metrics column added since, an index
    declared since, and a view whose statement changed (its comment holds the digest of the statement that made it)."""
    table = Table(name="wh_test_older", layer="warehouse", columns=(C("k", "int", False), C("v", "int")), key=("k",))
    tables = [table, ws.SLICE_TABLES[ws.TRADES], ws.WINDOW_LATEST]
    warehouse.ensure_objects(tables)
    warehouse.query("ALTER TABLE streamdi.batch_metrics DROP COLUMN staged_at", role="admin")
    warehouse.query("COMMENT ON VIEW dw.trade_window_answers IS 'made by an older release'", role="admin")
    indexed = dataclasses.replace(table, pg_indexes=(("v",),))
    open_warehouse(settings).ensure_objects([indexed, *tables[1:]])
    column = "SELECT 1 FROM pg_attribute WHERE attrelid = 'streamdi.batch_metrics'::regclass AND attname = 'staged_at'"
    assert warehouse.query(column)[1] == [(1,)]
    assert warehouse.query("SELECT to_regclass('dw.wh_test_older_v_idx') IS NOT NULL")[1] == [(True,)]
    comment = "SELECT obj_description('dw.trade_window_answers'::regclass, 'pg_class')"
    assert warehouse.query(comment)[1][0][0].startswith("streamdi ")


def test_create_table_sql_rejects_tables_outside_the_warehouse_or_without_key():
    with pytest.raises(ValueError, match="layer 'staging' has no PostgreSQL schema"):
        create_table_sql(Table(name="s", layer="staging", columns=(C("a", "int"),), key=("a",)))
    with pytest.raises(ValueError, match="needs a key"):
        create_table_sql(Table(name="s", layer="warehouse", columns=(C("a", "int"),)))


def test_ensure_objects_creates_declared_columns_key_and_indexes(warehouse):
    table = values_table("wh_test_ddl")
    warehouse.ensure_objects([table])
    warehouse.ensure_objects([table])  # idempotent

    columns = warehouse.query(
        """SELECT column_name, data_type, numeric_precision, numeric_scale, is_nullable
           FROM information_schema.columns WHERE table_schema = 'dw' AND table_name = 'wh_test_ddl'
           ORDER BY ordinal_position"""
    )[1]
    assert columns == [
        ("id", "integer", 32, 0, "NO"),
        ("label", "text", None, None, "YES"),
        ("code", "text", None, None, "NO"),
        ("amount", "numeric", 10, 5, "YES"),
        ("ratio", "double precision", 53, None, "YES"),
        ("big", "bigint", 64, 0, "YES"),
        ("flag", "boolean", None, None, "YES"),
        ("event_day", "date", None, None, "YES"),
        ("event_at", "timestamp without time zone", None, None, "YES"),
        ("event_time", "time without time zone", None, None, "YES"),
    ]
    key = warehouse.query(
        """SELECT kcu.column_name FROM information_schema.table_constraints tc
           JOIN information_schema.key_column_usage kcu USING (constraint_schema, constraint_name)
           WHERE tc.table_schema = 'dw' AND tc.table_name = 'wh_test_ddl'
             AND tc.constraint_type = 'PRIMARY KEY'
           ORDER BY kcu.ordinal_position""",
        role="admin",  # information_schema hides constraints from a user that may only SELECT
    )[1]
    assert key == [("id",)]
    indexes = warehouse.query(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'dw' AND tablename = 'wh_test_ddl' "
        "ORDER BY indexname"
    )[1]
    assert indexes == [
        (
            "wh_test_ddl_code_flag_idx",
            "CREATE INDEX wh_test_ddl_code_flag_idx ON dw.wh_test_ddl USING btree (code, flag)",
        ),
        (
            "wh_test_ddl_event_day_idx",
            "CREATE INDEX wh_test_ddl_event_day_idx ON dw.wh_test_ddl USING btree (event_day)",
        ),
        ("wh_test_ddl_pkey", "CREATE UNIQUE INDEX wh_test_ddl_pkey ON dw.wh_test_ddl USING btree (id)"),
    ]


def test_drift_from_the_declaration_is_a_clear_error_and_creates_nothing(warehouse):
    warehouse.query(
        "CREATE TABLE dw.wh_test_drift (id integer PRIMARY KEY, label varchar(10), code text, extra integer)",
        role="admin",
    )
    declared = Table(
        name="wh_test_drift",
        layer="warehouse",
        columns=(
            C("id", "int", False),
            C("label", "string"),
            C("code", "string", False),
            C("amount", "decimal(8,2)"),
        ),
        key=("id",),
    )
    fresh = values_table("wh_test_drift_fresh")

    with pytest.raises(WarehouseSchemaError) as excinfo:
        warehouse.ensure_objects([fresh, declared])

    message = str(excinfo.value)
    assert "dw.wh_test_drift.label: type is character varying(10), declared text" in message
    assert "dw.wh_test_drift.code: is nullable, declared NOT NULL" in message
    assert "dw.wh_test_drift: column amount (numeric(8,2)) is missing" in message
    assert "dw.wh_test_drift: column extra (integer) is not declared" in message
    assert len(message.splitlines()) == 5  # headline + exactly the four differences
    assert warehouse.query("SELECT to_regclass('dw.wh_test_drift_fresh')")[1] == [(None,)]


# -- values and upsert semantics ----------------------------------------------------------------------


def test_tricky_values_round_trip_exactly(warehouse):
    table = values_table("wh_test_values")
    warehouse.ensure_objects([table])
    base = {"amount": None, "ratio": None, "big": None, "flag": None, "event_day": None, "event_at": None}
    rows = [
        value_row(1, label="", code=""),  # empty strings, not NULL
        value_row(2, label=None, event_time=None, **base),  # NULL in every nullable column
        value_row(3, label="a,b", code='say "hi"'),
        value_row(4, label="line1\nline2\r\nline3", code="p|q|r"),
        value_row(5, label="\\.", code="x\n\\.\ny"),  # COPY's end-of-data marker as data
        value_row(6, label="back\\slash\ttab", code="NULL"),
        value_row(7, label="ünïcödé €", code=" "),
        value_row(
            8,
            amount=Decimal("0.15000"),
            ratio=-1.25e-7,
            big=-(2**63),
            flag=False,
            event_day=date(9999, 12, 31),
            event_at=datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            event_time="23:59:59",
        ),
        value_row(
            9,
            amount=Decimal("-12345.67891"),
            ratio=1e300,
            big=2**63 - 1,
            flag=True,
            event_day=date(1900, 1, 1),
            event_at=datetime(1900, 1, 1, 0, 0, 0, tzinfo=UTC),
            event_time="00:00:00",
        ),
    ]

    assert warehouse.apply_changes([change(table, 1, 1, rows)]) == {"wh_test_values": 9}

    ts = datetime(2024, 1, 31, 12, 30)
    noon = time(12, 30)
    d = date(2024, 1, 31)
    one = Decimal("1.50000")
    assert rows_of(warehouse, table) == [
        (1, "", "", one, 0.5, 10**12 + 1, False, d, ts, noon),
        (2, None, "C2", None, None, None, None, None, None, None),
        (3, "a,b", 'say "hi"', one, 0.5, 10**12 + 3, False, d, ts, noon),
        (4, "line1\nline2\r\nline3", "p|q|r", one, 0.5, 10**12 + 4, True, d, ts, noon),
        (5, "\\.", "x\n\\.\ny", one, 0.5, 10**12 + 5, False, d, ts, noon),
        (6, "back\\slash\ttab", "NULL", one, 0.5, 10**12 + 6, True, d, ts, noon),
        (7, "ünïcödé €", " ", one, 0.5, 10**12 + 7, False, d, ts, noon),
        (
            8,
            "label-8",
            "C8",
            Decimal("0.15000"),
            -1.25e-7,
            -(2**63),
            False,
            date(9999, 12, 31),
            datetime(9999, 12, 31, 23, 59, 59, 999999),
            time(23, 59, 59),
        ),
        (
            9,
            "label-9",
            "C9",
            Decimal("-12345.67891"),
            1e300,
            2**63 - 1,
            True,
            date(1900, 1, 1),
            datetime(1900, 1, 1, 0, 0, 0),
            time(0, 0, 0),
        ),
    ]
    # The text form shows the scale is kept (0.15000, not 0.15) and NULL is not ''.
    assert warehouse.query(
        "SELECT amount::text, label IS NULL, label = '' FROM dw.wh_test_values WHERE id IN (1, 2, 8) ORDER BY id"
    )[1] == [("1.50000", False, True), (None, True, None), ("0.15000", False, False)]


def test_null_in_a_not_null_column_fails_and_lands_nothing(warehouse):
    table = values_table("wh_test_not_null")
    warehouse.ensure_objects([table])
    with pytest.raises(psycopg.errors.NotNullViolation):
        warehouse.apply_changes([change(table, 1, 1, [value_row(1), value_row(2, code=None)])])
    assert rows_of(warehouse, table) == []
    assert warehouse.last_migrated_version("wh_test_not_null") is None


def test_change_with_wrong_columns_or_duplicate_keys_is_rejected(warehouse):
    table = values_table("wh_test_bad_change")
    good = change(table, 1, 1, [value_row(1)])
    reordered = TableChange(table, 1, 1, good.upserts.select(table.column_names[::-1]), good.deletes)
    with pytest.raises(ValueError, match="upserts have columns"):
        warehouse.apply_changes([reordered])
    with pytest.raises(ValueError, match="more than one row for some key"):
        warehouse.apply_changes([change(table, 1, 1, [value_row(1), value_row(1, label="again")])])


def test_upsert_update_delete_and_replay_is_a_no_op(warehouse):
    table = values_table("wh_test_upsert")
    other = values_table("wh_test_upsert_other")
    warehouse.ensure_objects([table, other])
    v1 = [
        change(table, 1, 1, [value_row(1), value_row(2), value_row(3)]),
        change(other, 4, 1, [value_row(10)]),
    ]
    v2 = [
        change(table, 2, 2, [value_row(2, label="updated", flag=None), value_row(4)], deletes=[3]),
        change(other, 5, 2, [], deletes=[10, 11]),  # 11 never existed
    ]

    assert warehouse.apply_changes(v1) == {"wh_test_upsert": 3, "wh_test_upsert_other": 1}
    assert warehouse.apply_changes(v2) == {"wh_test_upsert": 3, "wh_test_upsert_other": 1}

    final_rows = [
        pg_row(value_row(1)),
        pg_row(value_row(2, label="updated", flag=None)),
        pg_row(value_row(4)),
    ]
    assert rows_of(warehouse, table) == final_rows
    assert rows_of(warehouse, other) == []
    ledger = ledger_of(warehouse, table, other)
    assert [
        (r["table_name"], r["delta_version"], r["batch_id"], r["rows_upserted"], r["rows_deleted"]) for r in ledger
    ] == [
        ("wh_test_upsert", 1, 1, 3, 0),
        ("wh_test_upsert_other", 4, 1, 1, 0),
        ("wh_test_upsert", 2, 2, 2, 1),
        ("wh_test_upsert_other", 5, 2, 0, 1),
    ]
    assert all(r["started_at"] <= r["committed_at"] for r in ledger)
    assert warehouse.last_migrated_version("wh_test_upsert") == 2
    assert warehouse.last_migrated_version("wh_test_upsert_other") == 5
    assert warehouse.last_migrated_version("wh_test_never") is None
    # every table's newest version in one query (the ledger may hold other tests' tables too)
    versions = warehouse.migrated_versions()
    assert {k: versions[k] for k in ("wh_test_upsert", "wh_test_upsert_other")} == {
        "wh_test_upsert": 2,
        "wh_test_upsert_other": 5,
    }
    assert "wh_test_never" not in versions
    assert warehouse.migration_state()[1] == versions

    # Replays (the whole history, or an older version alone) change nothing, not even the ledger.
    assert warehouse.apply_changes(v1 + v2) == {"wh_test_upsert": 0, "wh_test_upsert_other": 0}
    assert warehouse.apply_changes([v1[0]]) == {"wh_test_upsert": 0}
    assert rows_of(warehouse, table) == final_rows
    assert rows_of(warehouse, other) == []
    assert ledger_of(warehouse, table, other) == ledger


# -- a large first load builds the indexes after its COPY ------------------------------------------------


def indexes_of(wh: Warehouse, name: str) -> list[tuple]:
    return wh.query(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'dw' AND tablename = %s ORDER BY indexname",
        (name,),
    )[1]


def declared_indexes(name: str) -> list[tuple]:
    return [
        (f"{name}_code_flag_idx", f"CREATE INDEX {name}_code_flag_idx ON dw.{name} USING btree (code, flag)"),
        (f"{name}_event_day_idx", f"CREATE INDEX {name}_event_day_idx ON dw.{name} USING btree (event_day)"),
        (f"{name}_pkey", f"CREATE UNIQUE INDEX {name}_pkey ON dw.{name} USING btree (id)"),
    ]


def test_a_large_first_load_lands_every_row_with_the_declared_indexes_and_key(warehouse):
    table = values_table("wh_test_bulk")
    warehouse.ensure_objects([table])
    rows = [value_row(i, label=f"bulk-{i}") for i in range(1, BULK_LOAD_ROWS + 2)]

    assert warehouse.apply_changes([change(table, 1, 1, rows)]) == {"wh_test_bulk": BULK_LOAD_ROWS + 1}

    assert indexes_of(warehouse, "wh_test_bulk") == declared_indexes("wh_test_bulk")
    assert warehouse.query("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM dw.wh_test_bulk")[1] == [
        (BULK_LOAD_ROWS + 1, BULK_LOAD_ROWS + 1, 1, BULK_LOAD_ROWS + 1)
    ]
    assert warehouse.query("SELECT * FROM dw.wh_test_bulk WHERE id = 777")[1] == [
        pg_row(value_row(777, label="bulk-777"))
    ]
    key = warehouse.query(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'dw.wh_test_bulk'::regclass "
        "AND contype = 'p'",
        role="admin",
    )[1]
    assert key == [("wh_test_bulk_pkey", "PRIMARY KEY (id)")]
    with pytest.raises(psycopg.errors.UniqueViolation):
        warehouse.query("INSERT INTO dw.wh_test_bulk (id, code) VALUES (5, 'again')", role="loader")
    # The loader still owns no table: the index rebuild ran through the two functions, not a table owner's rights.
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner of table wh_test_bulk"):
        warehouse.query("DROP TABLE dw.wh_test_bulk", role="loader")
    # A later change goes through the upsert path (the table is not empty) and keeps the indexes.
    warehouse.apply_changes([change(table, 2, 2, [value_row(i) for i in range(1, BULK_LOAD_ROWS + 10)])])
    assert warehouse.query("SELECT count(*) FROM dw.wh_test_bulk")[1] == [(BULK_LOAD_ROWS + 9,)]
    assert indexes_of(warehouse, "wh_test_bulk") == declared_indexes("wh_test_bulk")


@needs_embedded
def test_the_embedded_server_writes_no_wal_for_a_large_first_load_and_sorts_text_by_code_point(warehouse):
    assert warehouse.query("SHOW wal_level")[1] == [("minimal",)]
    assert warehouse.query("SELECT datlocprovider, datlocale FROM pg_database WHERE datname = current_database()")[
        1
    ] == [("b", "C.UTF-8")]
    # Code-point order, as the C library's C.UTF-8 sorts: upper case before lower case, accents after ASCII.
    assert warehouse.query("SELECT v FROM unnest(ARRAY['b', 'é', 'B', 'a', 'Z']) v ORDER BY v")[1] == [
        ("B",),
        ("Z",),
        ("a",),
        ("b",),
        ("é",),
    ]
    table = values_table("wh_test_bulk_wal")
    warehouse.ensure_objects([table])
    rows = [value_row(i, label=f"bulk-{i}" * 4) for i in range(1, BULK_LOAD_ROWS + 2)]
    before = warehouse.query("SELECT pg_current_wal_insert_lsn()", role="admin")[1][0][0]

    warehouse.apply_changes([change(table, 1, 1, rows)])

    wal, size = warehouse.query(
        f"SELECT pg_current_wal_insert_lsn() - '{before}'::pg_lsn, pg_total_relation_size('dw.wh_test_bulk_wal')",
        role="admin",
    )[1][0]
    assert size > 8 << 20  # the rows and their indexes: several MiB
    # The COPY into the truncated table wrote none of its rows to the WAL (a server at wal_level=replica writes more
    # than `size`); files under wal_skip_threshold (2 MB: the indexes here) are logged whole at COMMIT instead.
    assert wal < size / 2


def test_the_index_functions_serve_only_the_loader_on_empty_streamdi_tables(warehouse):
    table = values_table("wh_test_bulk_guard")
    warehouse.ensure_objects([table])
    drop = "SELECT streamdi.drop_indexes_for_load('dw.wh_test_bulk_guard'::regclass)"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"):
        warehouse.query(drop, role="reader")
    warehouse.query("CREATE TABLE IF NOT EXISTS public.wh_test_elsewhere (id integer PRIMARY KEY)", role="admin")
    with pytest.raises(psycopg.errors.RaiseException, match="is not a table of streamdi"):
        warehouse.query("SELECT streamdi.drop_indexes_for_load('public.wh_test_elsewhere'::regclass)", role="loader")
    # Dropped then rolled back (a transaction that ends before the rebuild): the indexes are all there.
    with warehouse.connect("loader") as conn:
        assert conn.execute(drop).fetchone() == (3,)
        conn.rollback()
    assert indexes_of(warehouse, "wh_test_bulk_guard") == declared_indexes("wh_test_bulk_guard")
    warehouse.apply_changes([change(table, 1, 1, [value_row(1)])])
    with pytest.raises(psycopg.errors.RaiseException, match="is not empty: its indexes stay"):
        warehouse.query(drop, role="loader")
    assert indexes_of(warehouse, "wh_test_bulk_guard") == declared_indexes("wh_test_bulk_guard")


# -- crashes inside the migration transaction -------------------------------------------------------------

BIG_ROWS = 12_000


def crash_tables(tag: str) -> tuple[Table, Table]:
    return values_table(f"wh_test_crash_{tag}_a"), values_table(f"wh_test_crash_{tag}_b")


def crash_base_changes(tag: str) -> list[TableChange]:
    a, b = crash_tables(tag)
    return [
        change(a, 1, 1, [value_row(i, label=f"base-{i}") for i in range(1, 6)]),
        change(b, 3, 1, [value_row(1), value_row(2), value_row(3)]),
    ]


def crash_changes(tag: str) -> list[TableChange]:
    """Batch 2: many rows for table a (more than one COPY chunk), an update and a delete in each table."""
    a, b = crash_tables(tag)
    return [
        change(
            a,
            2,
            2,
            [value_row(i, label=f"new-{i}", event_time="23:59:59") for i in range(3, 3 + BIG_ROWS)],
            [1],
        ),
        change(b, 4, 2, [value_row(2, label="", amount=Decimal("0.15000"))], [3]),
    ]


def child_apply_crash_changes(tag: str) -> None:
    """Entry point of the crash subprocess: apply batch 2 (dies at STREAMDI_FAULT_AT when it is set)."""
    from streamdi.settings import load_settings

    applied = open_warehouse(load_settings()).apply_changes(crash_changes(tag))
    print(json.dumps(applied, sort_keys=True))


CHILD = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); "
    "import test_warehouse as t; t.child_apply_crash_changes(sys.argv[1])"
)


@pytest.mark.faults
@pytest.mark.parametrize("fault", FAULT_POINTS)
def test_crash_inside_the_migration_transaction_leaves_the_previous_state(settings, warehouse, fault):
    assert BIG_ROWS > COPY_CHUNK_ROWS  # so pg.during_copy fires with only part of the data sent
    tag = fault.split(".")[1]
    a, b = crash_tables(tag)
    warehouse.ensure_objects([a, b])
    warehouse.apply_changes(crash_base_changes(tag))
    base_a = [pg_row(value_row(i, label=f"base-{i}")) for i in range(1, 6)]
    base_b = [pg_row(value_row(1)), pg_row(value_row(2)), pg_row(value_row(3))]
    assert rows_of(warehouse, a) == base_a
    assert rows_of(warehouse, b) == base_b
    ledger_before = ledger_of(warehouse, a, b)
    assert [(r["table_name"], r["delta_version"]) for r in ledger_before] == [(a.name, 1), (b.name, 3)]

    crashed = subprocess.run(
        [sys.executable, "-c", CHILD, tag],
        cwd=REPO,
        env=child_env(settings, STREAMDI_FAULT_AT=fault),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert rows_of(warehouse, a) == base_a
    assert rows_of(warehouse, b) == base_b
    assert ledger_of(warehouse, a, b) == ledger_before

    rerun = subprocess.run(
        [sys.executable, "-c", CHILD, tag],
        cwd=REPO,
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {a.name: BIG_ROWS + 1, b.name: 2}
    expected_a = [pg_row(value_row(2, label="base-2"))] + [
        pg_row(value_row(i, label=f"new-{i}", event_time="23:59:59")) for i in range(3, 3 + BIG_ROWS)
    ]
    assert rows_of(warehouse, a) == expected_a
    assert rows_of(warehouse, b) == [
        pg_row(value_row(1)),
        pg_row(value_row(2, label="", amount=Decimal("0.15000"))),
    ]
    assert [
        (r["table_name"], r["delta_version"], r["batch_id"], r["rows_upserted"], r["rows_deleted"])
        for r in ledger_of(warehouse, a, b)
    ] == [
        (a.name, 1, 1, 5, 0),
        (b.name, 3, 1, 3, 0),
        (a.name, 2, 2, BIG_ROWS, 1),
        (b.name, 4, 2, 1, 1),
    ]


def child_bulk_first_load(name: str) -> None:
    """Entry point of a crash subprocess: the first load of a large table (dies at STREAMDI_FAULT_AT when set)."""
    from streamdi.settings import load_settings

    table = values_table(name)
    rows = [value_row(i) for i in range(1, BULK_LOAD_ROWS + 2)]
    print(json.dumps(open_warehouse(load_settings()).apply_changes([change(table, 1, 1, rows)])))


BULK_CHILD = (
    f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_warehouse as t; t.child_bulk_first_load(sys.argv[1])"
)


@pytest.mark.faults
@pytest.mark.parametrize("fault", ("pg.during_copy", "pg.after_copy"))
def test_crash_inside_a_large_first_load_leaves_the_table_empty_with_its_indexes(settings, warehouse, fault):
    name = f"wh_test_bulk_crash_{fault.split('.')[1]}"
    warehouse.ensure_objects([values_table(name)])

    def child(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", BULK_CHILD, name],
            cwd=REPO,
            env=child_env(settings, **extra),
            capture_output=True,
            text=True,
            timeout=120,
        )

    crashed = child(STREAMDI_FAULT_AT=fault)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert warehouse.query(f"SELECT count(*) FROM dw.{name}")[1] == [(0,)]
    assert indexes_of(warehouse, name) == declared_indexes(name)

    rerun = child()
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {name: BULK_LOAD_ROWS + 1}
    assert warehouse.query(f"SELECT count(*) FROM dw.{name}")[1] == [(BULK_LOAD_ROWS + 1,)]
    assert indexes_of(warehouse, name) == declared_indexes(name)


# -- embedded server lifecycle on a server of its own ---------------------------------------------------

START_AND_EXIT = (
    "from streamdi.settings import load_settings; from streamdi.embedded_pg import ensure_server; "
    "ensure_server(load_settings())"
)
START_AND_DIE = START_AND_EXIT + "; import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@needs_embedded
def test_last_process_stops_the_server_even_after_killed_processes(tmp_path):
    settings = Settings(home=tmp_path / "home")
    env = child_env(settings)
    handles = settings.pgdata / ".handle_pids.json"

    assert run_python(START_AND_EXIT, env).returncode == 0
    assert (settings.pgdata / "PG_VERSION").exists()
    assert not embedded_pg.server_running(settings)  # the only user exited: stopped

    died = run_python(START_AND_DIE, env)
    assert died.returncode == -signal.SIGKILL
    assert embedded_pg.server_running(settings)  # a killed process cannot stop it ...
    assert len(json.loads(handles.read_text())) == 1  # ... and leaves its pid behind

    assert run_python(START_AND_EXIT, env).returncode == 0
    assert not embedded_pg.server_running(settings)  # the dead pid was pruned; the last live user stopped it
    assert json.loads(handles.read_text()) == []

    assert run_python(START_AND_DIE, env).returncode == -signal.SIGKILL
    assert embedded_pg.server_running(settings)
    assert embedded_pg.stop_server(settings) is True
    assert not embedded_pg.server_running(settings)
    assert embedded_pg.stop_server(settings) is False


WRITE_AND_EXIT = (
    "import psycopg; from streamdi.settings import load_settings; from streamdi.embedded_pg import ensure_server; "
    "c = psycopg.connect(ensure_server(load_settings()), autocommit=True); "
    "c.execute('CREATE TABLE t AS SELECT generate_series(1, 300000) AS n'); "
    "print(c.execute('SELECT pg_backend_pid(), pg_postmaster_start_time()::text').fetchone()[1]); c.close()"
)
READ_AND_EXIT = (
    "import json, psycopg; from streamdi.settings import load_settings; "
    "from streamdi.embedded_pg import ensure_server; "
    "c = psycopg.connect(ensure_server(load_settings()), autocommit=True); "
    "print(json.dumps(c.execute('SELECT count(*), pg_postmaster_start_time()::text FROM t').fetchone())); c.close()"
)


@needs_embedded
def test_the_last_user_asks_for_the_stop_and_the_next_process_waits_for_it(tmp_path):
    """The last user's exit does not wait for the shutdown's checkpoint; a process started right after it waits
    for that stop, starts the server again and finds every committed row."""
    settings = Settings(home=tmp_path / "home")
    env = child_env(settings)
    marker = settings.pgdata / embedded_pg.STOPPING

    wrote = run_python(WRITE_AND_EXIT, env)
    assert wrote.returncode == 0, wrote.stderr
    first_start = wrote.stdout.strip()
    assert marker.exists()  # the stopping postmaster's pid, left for the next process

    read = run_python(READ_AND_EXIT, env)  # at once: the old postmaster may still be writing its checkpoint
    assert read.returncode == 0, read.stderr
    count, second_start = json.loads(read.stdout)
    assert count == 300000
    assert second_start != first_start  # a new server, started after the old one had stopped

    assert not embedded_pg.server_running(settings)  # waits for the reader's stop
    assert not marker.exists()
    assert json.loads((settings.pgdata / ".handle_pids.json").read_text()) == []


@needs_embedded
def test_concurrent_first_starts_share_one_server(tmp_path):
    settings = Settings(home=tmp_path / "home")
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    # Each child waits until all four hold the server, so the four really overlap.
    code = (
        "import json, os, time\n"
        "from pathlib import Path\n"
        "from streamdi.settings import load_settings\n"
        "from streamdi.warehouse import open_warehouse\n"
        "wh = open_warehouse(load_settings())\n"
        "wh.ensure_objects([])\n"
        f"arrived = Path({str(arrived)!r})\n"
        "(arrived / str(os.getpid())).touch()\n"
        "deadline = time.monotonic() + 60\n"
        "while len(list(arrived.iterdir())) < 4 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(json.dumps(wh.query('SELECT pg_postmaster_start_time()::text, current_database()')[1][0]))\n"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=child_env(settings), stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [child.communicate(timeout=120)[0] for child in children]

    assert [child.returncode for child in children] == [0, 0, 0, 0]
    started = {json.loads(out)[0] for out in outputs}
    assert len(started) == 1  # one server (one start time), not four
    assert {json.loads(out)[1] for out in outputs} == {"streamdi"}
    assert not embedded_pg.server_running(settings)  # the last one out stopped it
    assert json.loads((settings.pgdata / ".handle_pids.json").read_text()) == []


@needs_embedded
def test_server_that_cannot_start_raises_with_the_log_tail(tmp_path):
    settings = Settings(home=tmp_path / "home")
    assert run_python(START_AND_EXIT, child_env(settings)).returncode == 0
    with (settings.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\nnot_a_setting = 1\n")

    with pytest.raises(RuntimeError, match="could not start") as excinfo:
        embedded_pg.ensure_server(settings)

    assert 'unrecognized configuration parameter "not_a_setting"' in str(excinfo.value)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    """A second embedded server (its cluster has no streamdi roles yet) and its superuser URL."""
    settings = Settings(home=tmp_path_factory.mktemp("own-server"))
    url = embedded_pg.ensure_server(settings)
    yield settings, url
    embedded_pg.stop_server(settings)


@needs_embedded
def test_user_that_cannot_create_roles_degrades_to_its_own_user(own_server, caplog):
    settings, admin_url = own_server
    admin = open_warehouse(settings)
    with admin.connect("admin") as conn:
        conn.autocommit = True
        conn.execute("CREATE ROLE wh_test_limited LOGIN PASSWORD 'limited-pw'")  # every login needs one
        conn.execute("CREATE DATABASE wh_test_limited_db OWNER wh_test_limited")
    limited_url = admin_url.replace("postgres:@", "wh_test_limited:limited-pw@").replace(
        "/streamdi?", "/wh_test_limited_db?"
    )
    table = values_table("wh_test_degraded")

    wh = open_warehouse(Settings(home=settings.home, database_url=limited_url))
    wh.ensure_objects([table])
    wh.apply_changes([change(table, 1, 1, [value_row(1)])])

    assert wh.dedicated_roles is False
    assert "cannot create roles" in caplog.text
    assert rows_of(wh, table) == [pg_row(value_row(1))]
    assert wh.query("SELECT current_user", role="loader")[1] == [("wh_test_limited",)]
    assert wh.query("SELECT current_user", role="reader")[1] == [("wh_test_limited",)]
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        wh.query("DELETE FROM dw.wh_test_degraded", role="reader")
    assert admin.query("SELECT rolname FROM pg_roles WHERE rolname LIKE 'streamdi%'", role="admin")[1] == []
    with pytest.raises(
        RuntimeError, match="role streamdi_reader does not exist yet; Warehouse.ensure_objects creates it"
    ):
        admin.query("SELECT 1")


@needs_embedded
def test_database_url_roles_get_passwords_from_settings(own_server):
    settings, admin_url = own_server
    wh = open_warehouse(
        Settings(
            home=settings.home,
            database_url=admin_url,
            loader_password="l0ad-secret-42",
            reader_password="r3ad-secret-42",
        )
    )
    wh.ensure_objects([])
    try:
        stored = wh.query(
            "SELECT rolname, rolcanlogin, rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid "
            "WHERE rolname LIKE 'streamdi%' ORDER BY rolname",
            role="admin",
        )[1]
        assert stored == [("streamdi_loader", True, True), ("streamdi_reader", True, True)]
        assert wh.query("SELECT current_user", role="reader")[1] == [("streamdi_reader",)]
    finally:  # leave this cluster without streamdi roles, as the degradation test expects
        wh.query(
            "DROP OWNED BY streamdi_loader, streamdi_reader; DROP ROLE streamdi_loader, streamdi_reader",
            role="admin",
        )
