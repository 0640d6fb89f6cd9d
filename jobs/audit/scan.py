"""The audit's SQL toolkit: a read-only snapshot of PostgreSQL and the one-pass scan of a `dw` table.

Between the figures (`jobs.audit.figures`) and the checks: every check module (`messages`, `dimensions`,
`customers`, `trade`, `facts`) registers its checks on a `Scan` of one table, which runs them all in ONE query
(one aggregate per check) on the audit's `Snapshot` and turns the values into `Check`s (`jobs.audit.report`).

SQL: every statement is composed with `psycopg.sql`, none built by string formatting. A fragment (a condition, an
aggregate, a JOIN clause, an example expression) is either constant text of the audit's modules (a `str`, taken as
`sql.SQL`) or an `sql.Composable`: identifiers as `sql.Identifier`, values (batch numbers, figure dates, constant
lists) as `sql.Literal` -- the fragments of many checks are combined into one statement, so they carry no `%s`
parameters.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.audit.figures import Expected
from jobs.audit.report import FAILED, NOT_CHECKED, OK, SKIPPED, Check

# psycopg's `sql` module as streamdi.warehouse imports it: only streamdi/warehouse*.py import psycopg.
from streamdi.warehouse import sql

END_OF_TIME = dt.date(9999, 12, 31)
EOT = sql.SQL("DATE '9999-12-31'")
EXAMPLES = 3  # offending rows quoted in a detail

# An SQL fragment: constant text of the audit's modules (a str, composed as `sql.SQL`) or an `sql.Composable`.
Fragment = str | sql.Composable


def as_sql(fragment: Fragment) -> sql.Composable:
    """A fragment as a Composable; a str must be constant SQL text (never text built by formatting)."""
    return sql.SQL(fragment) if isinstance(fragment, str) else fragment


def date_sql(day: dt.date | None) -> sql.Composable:
    """A date of the figures as an SQL literal (`'1950-01-01'::date`), NULL::date for None."""
    if day is None:
        return sql.SQL("NULL::date")
    if not isinstance(day, dt.date):
        raise TypeError(f"not a date: {day!r}")
    return sql.Literal(day)


def ints_sql(values: Iterable[int]) -> sql.Composable:
    """An int[] array of `values` (`ARRAY[1, 2, 3]::int[]`)."""
    return sql.SQL("ARRAY[{}]::int[]").format(sql.SQL(", ").join(sql.Literal(int(v)) for v in values))


def texts_sql(values: Iterable[str]) -> sql.Composable:
    """SQL string literals, comma separated."""
    return sql.SQL(", ").join(map(sql.Literal, values))


def format_sql(template: str, *args: Fragment) -> sql.Composable:
    """`format('<template>', args...)`: an example row described by PostgreSQL's format()."""
    return sql.SQL("format({})").format(sql.SQL(", ").join([sql.Literal(template), *map(as_sql, args)]))


def version_join(
    table: str, alias: str, sk: str, fact: str, day: sql.Composable, valid_until: bool = True
) -> sql.Composable:
    """`LEFT JOIN dw.<table> <alias>` on the fact's (alias `fact`) surrogate key `sk` and a version effective on
    `day` (and, with `valid_until`, not ended before it)."""
    return sql.SQL("LEFT JOIN {table} {alias} ON {key} = {fact_key} AND {effective} <= {day}{until}").format(
        table=sql.Identifier("dw", table),
        alias=sql.Identifier(alias),
        key=sql.Identifier(alias, sk),
        fact_key=sql.Identifier(fact, sk),
        effective=sql.Identifier(alias, "effectivedate"),
        day=day,
        until=sql.SQL(" AND {} <= {}").format(day, sql.Identifier(alias, "enddate")) if valid_until else sql.SQL(""),
    )


class Snapshot:
    """The audit's view of PostgreSQL: one connection as the read-only role, in one read-only REPEATABLE READ
    transaction. Statements carry no parameters (values are `sql.Literal`s), so `%` in LIKE patterns and format()
    templates needs no escaping."""

    def __init__(self, conn) -> None:
        self.conn = conn
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self.tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'dw'")}

    def rows(self, statement: Fragment) -> list[tuple]:
        return self.conn.execute(as_sql(statement)).fetchall()

    def row(self, statement: Fragment) -> dict[str, Any]:
        cur = self.conn.execute(as_sql(statement))
        values = cur.fetchone()
        return dict(zip([d.name for d in cur.description], values, strict=True))

    def strings(self, statement: Fragment) -> list[str]:
        return [str(r[0]) for r in self.rows(statement)]


@dataclass(frozen=True)
class Join:
    """A table joined into a scan: `clause` is the JOIN clause, `after` the aliases it refers to."""

    alias: str
    table: str
    clause: Fragment
    after: tuple[str, ...] = ()


@dataclass
class _Item:
    """A check computed by a scan: its aggregates (local name -> SQL), the joins they use, and `judge`, which
    turns the aggregates' values into the Check."""

    name: str
    batch: int | None
    aggregates: dict[str, Fragment]
    joins: tuple[str, ...]
    judge: Callable[[dict[str, Any]], Check]
    tables: tuple[str, ...] = ()  # tables its subqueries read besides the scan's


class Scan:
    """Every check on one table in ONE query: a pass over `dw.<table>` with the joins the checks need, one
    aggregate per figure (`count(*) FILTER (WHERE <offending>)`, ...). Offending rows are fetched only for the
    checks that fail. A missing table fails the checks that need it."""

    def __init__(self, db: Snapshot, table: str, alias: str, joins: Sequence[Join] = ()) -> None:
        self.db = db
        self.table = table
        self.alias = alias
        self.joins = {j.alias: j for j in joins}
        self.items: list[_Item] = []

    # -- registering checks
    def check(
        self,
        name: str,
        aggregates: dict[str, Fragment],
        judge: Callable[[dict[str, Any]], Check],
        batch: int | None = None,
        joins: Sequence[str] = (),
        tables: Sequence[str] = (),
    ) -> None:
        self.items.append(_Item(name, batch, aggregates, tuple(joins), judge, tuple(tables)))

    def rule(
        self,
        name: str,
        bad: Fragment,
        what: str,
        example: Fragment,
        batch: int | None = None,
        joins: Sequence[str] = (),
    ) -> None:
        """The official check holds when no row meets `bad`; the detail counts the rows and quotes a few
        (`example`, an SQL expression)."""

        def judge(v: dict[str, Any]) -> Check:
            n = v["bad"]
            if n == 0:
                return Check(name, OK, batch=batch)
            examples = self.examples(example, bad, joins)
            return Check(name, FAILED, f"{rows_text(n)} {what}, e.g. {'; '.join(examples)}", batch)

        self.check(name, {"bad": sql.SQL("count(*) FILTER (WHERE {})").format(as_sql(bad))}, judge, batch, joins)

    def skip(self, name: str, reason: str, batch: int | None = None) -> None:
        self.check(name, {}, lambda _: Check(name, SKIPPED, reason, batch), batch)

    # -- running
    def _joins_for(self, aliases: Iterable[str]) -> list[Join]:
        wanted: set[str] = set()
        stack = list(aliases)
        while stack:
            a = stack.pop()
            if a not in wanted:
                wanted.add(a)
                stack.extend(self.joins[a].after)
        return [j for a, j in self.joins.items() if a in wanted]

    def from_clause(self, aliases: Iterable[str]) -> sql.Composable:
        scanned = sql.SQL("{} {}").format(sql.Identifier("dw", self.table), sql.Identifier(self.alias))
        return sql.SQL(" ").join([scanned, *(as_sql(j.clause) for j in self._joins_for(aliases))])

    def examples(self, example: Fragment, bad: Fragment, joins: Sequence[str] = ()) -> list[str]:
        # no DISTINCT: a top-N sort of the offending rows instead of a sort of all of them
        found = self.db.strings(
            sql.SQL("SELECT {} AS e FROM {} WHERE {} ORDER BY 1 LIMIT {}").format(
                as_sql(example), self.from_clause(joins), as_sql(bad), sql.Literal(EXAMPLES * 4)
            )
        )
        return list(dict.fromkeys(found))[:EXAMPLES]

    def run(self) -> list[Check]:
        checks: dict[int, Check] = {}
        runnable: list[tuple[int, _Item]] = []
        for i, item in enumerate(self.items):
            needed = (self.table, *(j.table for j in self._joins_for(item.joins)), *item.tables)
            missing = sorted({t for t in needed if t not in self.db.tables})
            if missing:
                checks[i] = Check(item.name, FAILED, f"table dw.{missing[0]} does not exist", item.batch)
            else:
                runnable.append((i, item))
        columns = {f"c{i}_{local}": expr for i, item in runnable for local, expr in item.aggregates.items()}
        values: dict[str, Any] = {}
        if columns:
            joins = [a for _, item in runnable for a in item.joins]
            select = sql.SQL(",\n  ").join(
                sql.SQL("{} AS {}").format(as_sql(expr), sql.Identifier(key)) for key, expr in columns.items()
            )
            values = self.db.row(sql.SQL("SELECT\n  {}\nFROM {}").format(select, self.from_clause(joins)))
        for i, item in runnable:
            local = {k: values[f"c{i}_{k}"] for k in item.aggregates}
            checks[i] = item.judge(local)
        return [checks[i] for i in range(len(self.items))]


def rows_text(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


_OPERATORS = {"==": operator.eq, ">=": operator.ge, ">": operator.gt, "<=": operator.le}


def compare(name: str, actual: int, op: str, expected: Expected, what: str, batch: int | None = None) -> Check:
    """`actual <op> expected`; skipped without figures, not checked when every figure is -1."""
    if expected.value is None:
        return Check(name, SKIPPED, f"no audit figure {', '.join(expected.missing)}", batch)
    if expected.counted == 0 and expected.not_counted:
        return Check(name, NOT_CHECKED, f"{', '.join(expected.not_counted)} is -1 (not counted)", batch)
    if _OPERATORS[op](actual, expected.value):
        return Check(name, OK, batch=batch)
    detail = f"{what} is {actual}, expected {op} {expected.value} ({expected.formula}{expected.note()})"
    return Check(name, FAILED, detail, batch)
