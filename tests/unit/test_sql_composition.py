"""SQL that reaches psycopg is composed with `psycopg.sql` (quoted identifiers, %s parameters), never built by
string formatting: no f-string, `str.format`, `%` or `+` assembles a statement in the modules that run SQL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every module that sends SQL to PostgreSQL (through streamdi.warehouse, streamdi.warehouse_ddl and
# streamdi.warehouse_apply, the modules importing psycopg).
# streamdi/embedded_pg.py is left out on purpose: its psql scripts go through stdin to the bundled psql, not
# psycopg, and the values in them are generated tokens and constant role names.
SQL_MODULES = (
    "streamdi/warehouse.py",
    "streamdi/warehouse_ddl.py",
    "streamdi/warehouse_apply.py",
    "streamdi/queries.py",
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("streamdi/run/cli/*.py")),
    "streamdi/run/stream.py",
    "streamdi/migrator.py",
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("jobs/audit/*.py")),
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("bench/*.py")),
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("dags/*.py")),
)
SQL_START = re.compile(r"\s*(SELECT|INSERT|CREATE|GRANT|ALTER|DROP|DELETE|UPDATE|COPY|TRUNCATE|REVOKE|SET)\b")
LOGGERS = {"log", "logger", "logging"}


def _text(node: ast.expr) -> str | None:
    """The literal text of a str constant or an f-string (placeholders as `{}`); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _built_text(node: ast.AST) -> str | None:
    """The text a formatting expression starts with: an f-string, `"..." % x`, `"..." + x`, `"...".format(x)`."""
    if isinstance(node, ast.JoinedStr):
        return _text(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        left = node.left
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
            left = left.left
        return _text(left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _text(node.func.value)
    return None


def _message_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside `raise ...` and `log.*(...)`: messages, not SQL."""
    found = set()
    for node in ast.walk(tree):
        is_log = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in LOGGERS
        )
        if isinstance(node, ast.Raise) or is_log:
            found.update(id(n) for n in ast.walk(node))
    return found


def formatted_sql(source: str) -> list[str]:
    """`line: first line of the text` for every SQL statement `source` builds by string formatting."""
    tree = ast.parse(source)
    messages = _message_nodes(tree)
    findings = []
    for node in ast.walk(tree):
        text = None if id(node) in messages else _built_text(node)
        if text is not None and SQL_START.match(text):
            findings.append(f"{node.lineno}: {text.strip().splitlines()[0]}")
    return sorted(set(findings), key=lambda f: int(f.split(":")[0]))


@pytest.mark.parametrize("module", SQL_MODULES)
def test_sql_is_composed_with_psycopg_sql(module):
    assert formatted_sql((ROOT / module).read_text()) == []


def test_the_globs_find_the_benchmarks_and_dags():
    assert any(m.startswith("bench/") for m in SQL_MODULES) and any(m.startswith("dags/") for m in SQL_MODULES)


@pytest.mark.parametrize(
    "code",
    [
        'conn.execute(f"SELECT max(delta_version) FROM {LEDGER_TABLE} WHERE table_name = %s", (key,))',
        'DDL = f"""\n  CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (id int);"""',
        'stmt = f"GRANT EXECUTE ON FUNCTION {FN}(regclass) TO {{loader}}"',
        'stmt = "CREATE TABLE x (\\n" + "\\n".join(lines) + "\\n);"',
        'stmt = "DELETE FROM %s" % table',
        'stmt = "TRUNCATE {}".format(table)',
        'stmt = sql.SQL(f"UPDATE {table} SET x = 1")',
    ],
)
def test_the_check_flags_sql_built_by_formatting(code):
    assert len(formatted_sql(code)) == 1


@pytest.mark.parametrize(
    "code",
    [
        'stmt = sql.SQL("SELECT max(batch_id) FROM {}").format(sql.Identifier("streamdi", "batch_metrics"))',
        'conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))',
        'raise ValueError(f"DROP of {name} refused")',
        'log.info(f"CREATE TABLE {name} done")',
        'name = f"{table}_{column}_idx"',
        'message = f"role {user} does not exist"',
    ],
)
def test_the_check_leaves_messages_names_and_composed_sql_alone(code):
    assert formatted_sql(code) == []
