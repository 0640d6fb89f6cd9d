"""`streamdi audit`: the TPC-DI 1.1.0 automated audit (`tpcdi_audit.sql`) as an independent judge of the PostgreSQL
warehouse (`dw.*`, what users query) -- the last step of the data flow, after migration.

`run_audit(ctx, data_dir=None)` reads the generator's audit figures -- the `*_audit.csv` files of a data set
directory (`DIR/*_audit.csv` and `DIR/BatchK/*_audit.csv`) when `data_dir` is given, else the figures staged from
the landing zone (`staging.audit_figures`, one delivery per TPC-DI batch and file name: the one staged last) -- and
runs every check of the official script against PostgreSQL as the read-only role, in one REPEATABLE READ snapshot
(a migration running meanwhile is seen whole or not at all). It returns an `AuditReport`: one `Check` per result
row of the official script, named as the script's "Test" column, with `batch` where the script gives one result
per batch; `ok` is true when nothing failed or was skipped.

Independence: this module shares no code with what it audits. It does not import `jobs.*` or `schemas.warehouse`;
its SQL spells the specification's table and column names (lower case, schema `dw`), and it parses audit files
itself. It uses `streamdi.warehouse` only to connect and for psycopg's `sql` module, and `schemas.audit`/`streamdi.lake`
to read staged figures.

SQL: every statement is composed with `psycopg.sql`, none built by string formatting. A fragment (a condition, an
aggregate, a JOIN clause, an example expression) is either constant text of this module (a `str`, taken as `sql.SQL`)
or an `sql.Composable`: identifiers as `sql.Identifier`, values (batch numbers, figure dates, constant lists) as
`sql.Literal` -- the fragments of many checks are combined into one statement, so they carry no `%s` parameters.

The checks, as in the script (B = the batches of the audit figures, 1..N; 3 in the official data set):
- Audit table batches, Audit table sources (the 13 data sets).
- DImessages validation reports (per batch 0..N: 24 'Validation' rows), batches, Phase complete records, sources
  (the 17 validated sources), initial condition (batch 0 all '0').
- DimBroker row count, distinct keys (= HR_BROKERS), BatchID (batch 1), IsCurrent, EffectiveDate (= Batch1's
  FirstDay, which the script hard-codes as 1950-01-01), EndDate.
- The SCD2 tables DimAccount, DimCustomer, DimSecurity, DimCompany: distinct keys, EndDate (every end date is
  another version's effective date or 9999-12-31, counted through the script's self-join), Overlap, End of Time,
  consolidation, batches, IsCurrent (not for DimCompany, as in the script), EffectiveDate (per batch), Status.
- DimAccount row count (batch 1: `>` the customer and account figures; later batches: `>=` the account figures),
  TaxStatus, SK_CustomerID, SK_BrokerID, inactive customers. DimCustomer row count (per batch), inactive
  customers, age range alerts and customer tier alerts (per batch), Gender, TaxID, Phone1-3, Email1-2,
  LocalTaxRate, NationalTaxRate, demographic fields. DimSecurity row count (batch 1, from its message),
  SK_CompanyID, ExchangeID, Issue. DimCompany row count (per batch, from its message, `<=` FW_CMP), distinct
  names, Industry, SPrating, Country.
- Prospect SK_UpdateDateID, SK_RecordDateID (per batch), batches, Country, MarketingNameplate.
- FactWatches row count and active watches (per batch, from the messages), batches, SK_CustomerID,
  SK_SecurityID, date check (per batch).
- DimTrade row count (per batch, from its message), canceled trades, commission alerts, charge alerts (all
  batches together, as in the script), batches, distinct keys, SK_BrokerID/CompanyID/SecurityID/CustomerID/
  AccountID (a version valid on the create date), date check (per batch), Status, Type.
- Financial row count (batch 1's message), SK_CompanyID, FI_YEAR, FI_QTR, FI_QTR_START_DATE, EPS.
- FactMarketHistory row count (per batch, from the messages), batches, SK_CompanyID, SK_SecurityID, SK_DateID
  (per batch; the script's window is [FirstDay - 1 day, LastDay)), relative dates.
- FactHoldings row count (per batch), batches, SK_CustomerID/AccountID/CompanyID/SecurityID (effective on or
  before the holding's day), CurrentTradeID, SK_DateID (per batch). FactCashBalances batches, SK_CustomerID,
  SK_AccountID, SK_DateID (per batch).
- "Batch row count: <source>" and "Batch joined row count: <source>" per batch and source, the sources being
  those of batch 0's 'Row count' messages; "Data visibility row counts/joined row counts: <source>".
For three batches that is 238 results when every table and message is there (see docs/audit.md).

Semantics kept from the script, quirks included: `x NOT IN (...)` and `x NOT LIKE ...` never count a NULL (e.g. a
NULL Gender passes); foreign keys count the joined rows (every dimension surrogate key is the primary key of its
`dw` table, so a left join counts each row at most once, as the script's inner join does, and a single pass over a
fact table can check all of its keys); a message compared with figures must exist; an empty Prospect fails
MarketingNameplate (the script's sum over no rows is NULL); "DimAccount inactive customers" can never fail (the
script's WHERE keeps only inactive accounts, so no group has "fewer than one" row) -- it is run as written.

Decisions where the script does not fit streamdi:
- Batches: the script hard-codes 3 batches; here every "batches" check expects exactly the batches of the audit
  figures (B), per-batch checks run for each batch of B, and DImessages expects batches 0..N.
- A figure of -1 (not counted by the generator) is left out of a sum (the detail says so); a check resting only
  on such figures is "not checked". A figure that is absent makes its check "skipped", as does a window check
  of a batch without Batch FirstDay/LastDay figures (they are in `BatchK_audit.csv` at the data set's root).
- A check whose table is missing in PostgreSQL fails with "table dw.<name> does not exist".
- The scale-dependent parts: "DimCustomer LocalTaxRate" also asks for more than 300 distinct LocalTaxRateDesc and
  "DimCustomer NationalTaxRate" for at least 9 distinct NationalTaxRateDesc. Both are always evaluated. When the
  join part holds and only the distinct count falls short on a data set below scale factor 3 (the official
  generator's smallest; from the Generator SF figure, which is 1000 x the scale factor), the check is "not
  checked" with a detail saying the distinct-count part failed and why; with scale factor 3 or more, or when it
  is unknown, it fails.
- Visibility: streamdi writes no Visibility_1/Visibility_2 messages (they would need the wall clock during a
  batch), so "Data visibility row counts" and "Data visibility joined row counts" are reported once each as "not
  checked"; if such messages exist they are checked per source as in the script.
- Where the script reports nothing for a missing message ("Batch row count", "DImessages validation reports" of a
  batch absent from DImessages), this audit reports a failure naming the missing message.
- Financial EPS: a zero denominator gives no ratio (NULL, not counted) instead of the script's division error.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path, PurePosixPath
from typing import Any

from schemas.audit import AUDIT_FIGURES, NOT_COUNTED
from streamdi.context import JobContext

# psycopg's `sql` module as streamdi.warehouse imports it: only streamdi/warehouse*.py import psycopg.
from streamdi.warehouse import sql

OK = "ok"
FAILED = "failed"
SKIPPED = "skipped"
NOT_CHECKED = "not checked"

END_OF_TIME = dt.date(9999, 12, 31)
EOT = sql.SQL("DATE '9999-12-31'")
EXAMPLES = 3  # offending rows quoted in a detail

# The data sets the script's "Audit table sources" asks figures for.
AUDIT_DATASETS = (
    "Batch",
    "DimAccount",
    "DimBroker",
    "DimCompany",
    "DimCustomer",
    "DimSecurity",
    "DimTrade",
    "FactHoldings",
    "FactMarketHistory",
    "FactWatches",
    "Financial",
    "Generator",
    "Prospect",
)
# "DImessages sources": the validated tables that must have messages (the script's list has no DimCompany).
MESSAGE_SOURCES = (
    "DimAccount",
    "DimBroker",
    "DimCustomer",
    "DimDate",
    "DimSecurity",
    "DimTime",
    "DimTrade",
    "FactCashBalances",
    "FactHoldings",
    "FactMarketHistory",
    "FactWatches",
    "Financial",
    "Industry",
    "Prospect",
    "StatusType",
    "TaxRate",
    "TradeType",
)
# The spec's batch validation query: 18 'Row count', 4 'Row count joined' and 2 more rows per batch.
ROW_COUNT = "Row count"
ROW_COUNT_JOINED = "Row count joined"
SPEC_VALIDATION_ROWS = (
    *((s, ROW_COUNT) for s in sorted((*MESSAGE_SOURCES, "DimCompany"))),
    *((s, ROW_COUNT_JOINED) for s in ("FactCashBalances", "FactHoldings", "FactMarketHistory", "FactWatches")),
    ("DimCustomer", "Inactive customers"),
    ("FactWatches", "Inactive watches"),
)
VALIDATION_ROWS_PER_BATCH = len(SPEC_VALIDATION_ROWS)  # 24
NAMEPLATE_TAGS = ("HighValue", "Expenses", "Boomer", "MoneyAlert", "Spender", "Inherited")
# Below this scale factor a data set cannot reach the distinct tax-rate counts the script asks for.
DISTINCT_RATES_MIN_SCALE_FACTOR = 3


# ------------------------------------------------------------------------------------------------ report
@dataclass(frozen=True)
class Check:
    """One audit result: `status` is ok, failed, skipped or not checked; `detail` says what was found and what
    was expected (or why the check was not run); `batch` is the TPC-DI batch of a per-batch result."""

    name: str
    status: str
    detail: str = ""
    batch: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class AuditReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check failed or was skipped ("not checked" does not count against it)."""
        return all(c.status in (OK, NOT_CHECKED) for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAILED]

    @property
    def skipped(self) -> list[Check]:
        return [c for c in self.checks if c.status == SKIPPED]

    def get(self, name: str, batch: int | None = None) -> Check:
        """The check called `name` (for batch `batch`); KeyError if there is none."""
        for c in self.checks:
            if c.name == name and c.batch == batch:
                return c
        raise KeyError(f"no check {name!r} for batch {batch}")

    def table(self):
        """A rich Table: check, batch, and OK or the status with its detail."""
        from rich.table import Table as RichTable

        out = RichTable(title=f"TPC-DI audit of PostgreSQL: {'OK' if self.ok else 'NOT OK'}", show_lines=False)
        out.add_column("Check")
        out.add_column("Batch", justify="right")
        out.add_column("Result", overflow="fold")
        styles = {OK: "green", FAILED: "bold red", SKIPPED: "yellow", NOT_CHECKED: "dim"}
        for c in self.checks:
            result = "OK" if c.ok else f"{c.status.upper()}: {c.detail}"
            out.add_row(c.name, "" if c.batch is None else str(c.batch), f"[{styles[c.status]}]{result}[/]")
        return out

    def render(self, console=None, width: int = 160) -> str:
        """Print the report (the rich table, then the totals per status) on `console` (a rich Console) and
        return ""; without a console, return it as plain text `width` characters wide."""
        from rich.console import Console

        out = console or Console(file=io.StringIO(), width=width, color_system=None, record=True)
        out.print(self.table())
        totals = {s: sum(c.status == s for c in self.checks) for s in (OK, FAILED, SKIPPED, NOT_CHECKED)}
        out.print(", ".join(f"{n} {s}" for s, n in totals.items()))
        return "" if console is not None else out.export_text()


# ----------------------------------------------------------------------------------------------- figures
AUDIT_FILE_GLOB = "*_audit.csv"
AUDIT_HEADER = ("dataset", "batchid", "date", "attribute", "value", "dvalue")


@dataclass(frozen=True)
class Figure:
    """One line of an audit file: a count (`value`, -1 when not counted), a day (`date`) or a parameter
    (`dvalue`) of a data set in a TPC-DI batch."""

    dataset: str
    batch: int
    attribute: str
    value: int | None = None
    date: dt.date | None = None
    dvalue: float | None = None


def parse_figures(text: str, source: str) -> list[Figure]:
    """The figures of one audit file's text (header `DataSet, BatchID, Date, Attribute, Value, DValue`, names
    compared without spaces and case; fields trimmed, empty = NULL; blank lines skipped). Raises ValueError naming
    `source` and the line of anything that does not parse: a bad figure must not pass silently."""
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines:
        return []
    header = tuple(h.strip().lower() for h in next(csv.reader([lines[0]])))
    if header != AUDIT_HEADER:
        raise ValueError(f"{source}: not an audit file, its header is {lines[0]!r}")
    figures = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = [f.strip() for f in next(csv.reader([line]))]
        try:
            if len(fields) != len(AUDIT_HEADER):
                raise ValueError(f"expected {len(AUDIT_HEADER)} fields, found {len(fields)}")
            dataset, batch, date, attribute, value, dvalue = fields
            if not dataset or not attribute:
                raise ValueError("DataSet and Attribute must not be empty")
            figures.append(
                Figure(
                    dataset=dataset,
                    batch=_typed(batch, int, "BatchID"),
                    attribute=attribute,
                    value=_typed(value, int, "Value") if value else None,
                    date=_typed(date, dt.date.fromisoformat, "Date") if date else None,
                    dvalue=_typed(dvalue, float, "DValue") if dvalue else None,
                )
            )
        except ValueError as e:
            raise ValueError(f"{source}:{number}: {e} in {line!r}") from None
    return figures


def _typed(text: str, parse: Callable[[str], Any], name: str) -> Any:
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not {'a date' if name == 'Date' else 'a number'}") from None


def read_figures(data_dir: Path) -> Figures:
    """Every figure of a data set directory: `DIR/*_audit.csv` (BatchK_audit.csv, Generator_audit.csv) and
    `DIR/BatchK/*_audit.csv`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir} is not a directory")
    files = sorted([*data_dir.glob(AUDIT_FILE_GLOB), *data_dir.glob(f"Batch*/{AUDIT_FILE_GLOB}")])
    figures = [f for path in files if path.is_file() for f in parse_figures(path.read_text("utf-8"), str(path))]
    return Figures(figures, f"in {data_dir}")


def staged_figures(ctx: JobContext) -> Figures:
    """The figures staged from the landing zone (`staging.audit_figures`). A file delivered again (same TPC-DI
    batch and file name, e.g. under another folder) counts once: the delivery staged last (highest micro-batch,
    then greatest landing path) wins."""
    where = "staged (staging.audit_figures)"
    if not ctx.lake.exists(AUDIT_FIGURES):
        return Figures([], where)
    rows = ctx.lake.read_arrow(AUDIT_FIGURES).to_pylist()
    latest: dict[tuple[int, str], tuple[int, str]] = {}
    for r in rows:
        ident = (r["source_batch"], PurePosixPath(r["source_file"]).name)
        latest[ident] = max(latest.get(ident, (r["batch_id"], r["source_file"])), (r["batch_id"], r["source_file"]))
    figures = [
        Figure(r["dataset"], r["batchid"], r["attribute"], r["value"], r["date"], r["dvalue"])
        for r in rows
        if latest[(r["source_batch"], PurePosixPath(r["source_file"]).name)] == (r["batch_id"], r["source_file"])
    ]
    return Figures(figures, where)


@dataclass(frozen=True)
class Term:
    """One figure in a formula: `sign` * Value of (`dataset`, `attribute`)."""

    sign: int
    dataset: str
    attribute: str


@dataclass(frozen=True)
class Expected:
    """The value of a formula of figures over some batches, and what went into it."""

    value: int | None  # None when a figure is absent
    formula: str
    missing: tuple[str, ...] = ()
    not_counted: tuple[str, ...] = ()
    counted: int = 0  # figures that went into `value`

    def note(self) -> str:
        if not self.not_counted:
            return ""
        return f"; {', '.join(self.not_counted)} not counted by the generator (-1), left out"


class Figures:
    """The audit figures, looked up by data set, attribute and batch. `where` says where they were read."""

    def __init__(self, figures: Iterable[Figure], where: str) -> None:
        self.figures = list(figures)
        self.where = where

    def __bool__(self) -> bool:
        return bool(self.figures)

    @property
    def batches(self) -> tuple[int, ...]:
        """Every BatchID of the figures (the script's `Audit` table: all data sets)."""
        return tuple(sorted({f.batch for f in self.figures}))

    @property
    def datasets(self) -> set[str]:
        return {f.dataset for f in self.figures}

    def value(self, dataset: str, attribute: str, batch: int) -> int | None:
        """The figure summed over its files (FINWIRE has one per quarter); -1 if any file says -1; None if absent."""
        values = [
            f.value
            for f in self.figures
            if f.dataset == dataset and f.attribute == attribute and f.batch == batch and f.value is not None
        ]
        if not values:
            return None
        return NOT_COUNTED if NOT_COUNTED in values else sum(values)

    def day(self, attribute: str, batch: int) -> dt.date | None:
        days = [f.date for f in self.figures if f.dataset == "Batch" and f.attribute == attribute and f.batch == batch]
        return days[0] if days else None

    def window(self, batch: int) -> tuple[dt.date, dt.date] | None:
        """(FirstDay, LastDay) of a batch, None unless both figures are there."""
        first, last = self.day("FirstDay", batch), self.day("LastDay", batch)
        return (first, last) if first is not None and last is not None else None

    @property
    def scale_factor(self) -> float | None:
        """The Generator's SF figure divided by 1000 (the generator writes 1000 x the scale factor)."""
        sf = [f.dvalue for f in self.figures if f.dataset == "Generator" and f.attribute == "SF" and f.dvalue]
        return sf[0] / 1000 if sf else None

    def expected(self, terms: Sequence[Term], batches: Sequence[int]) -> Expected:
        """A sum of figures over `batches` (as the script's `sum(Value) ... BatchID <= b`: a figure of one batch
        only adds nothing in the others). A term is missing when no batch of `batches` has it."""
        formula = " ".join(f"{'-' if t.sign < 0 else '+'} {t.attribute}" for t in terms).removeprefix("+ ")
        span = _span(batches)
        total, counted, missing, not_counted = 0, 0, [], []
        for t in terms:
            found = {b: v for b in batches if (v := self.value(t.dataset, t.attribute, b)) is not None}
            if not found:
                missing.append(f"{t.dataset} {t.attribute}" + (f" ({span})" if batches else ""))
            for b, v in found.items():
                if v == NOT_COUNTED:
                    not_counted.append(f"{t.attribute} of batch {b}")
                else:
                    total += t.sign * v
                    counted += 1
        return Expected(None if missing else total, f"{formula} of {span}", tuple(missing), tuple(not_counted), counted)


def _span(batches: Sequence[int]) -> str:
    """`batch 2`, `batches 1-3` or `batches [1, 3]`."""
    if not batches:
        return "no batch"
    if len(batches) == 1:
        return f"batch {batches[0]}"
    if list(batches) == list(range(batches[0], batches[-1] + 1)):
        return f"batches {batches[0]}-{batches[-1]}"
    return f"batches {list(batches)}"


# -------------------------------------------------------------------------------------------- PostgreSQL
# An SQL fragment: constant text of this module (a str, composed as `sql.SQL`) or an `sql.Composable`.
Fragment = str | sql.Composable


def _sql(fragment: Fragment) -> sql.Composable:
    """A fragment as a Composable; a str must be constant SQL text (never text built by formatting)."""
    return sql.SQL(fragment) if isinstance(fragment, str) else fragment


def _date(day: dt.date | None) -> sql.Composable:
    """A date of the figures as an SQL literal (`'1950-01-01'::date`), NULL::date for None."""
    if day is None:
        return sql.SQL("NULL::date")
    if not isinstance(day, dt.date):
        raise TypeError(f"not a date: {day!r}")
    return sql.Literal(day)


def _ints(values: Iterable[int]) -> sql.Composable:
    """An int[] array of `values` (`ARRAY[1, 2, 3]::int[]`)."""
    return sql.SQL("ARRAY[{}]::int[]").format(sql.SQL(", ").join(sql.Literal(int(v)) for v in values))


def _texts(values: Iterable[str]) -> sql.Composable:
    """SQL string literals, comma separated."""
    return sql.SQL(", ").join(map(sql.Literal, values))


def _format(template: str, *args: Fragment) -> sql.Composable:
    """`format('<template>', args...)`: an example row described by PostgreSQL's format()."""
    return sql.SQL("format({})").format(sql.SQL(", ").join([sql.Literal(template), *map(_sql, args)]))


def _version_join(
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


class _Snapshot:
    """The audit's view of PostgreSQL: one connection as the read-only role, in one read-only REPEATABLE READ
    transaction. Statements carry no parameters (values are `sql.Literal`s), so `%` in LIKE patterns and format()
    templates needs no escaping."""

    def __init__(self, conn) -> None:
        self.conn = conn
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self.tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'dw'")}

    def rows(self, statement: Fragment) -> list[tuple]:
        return self.conn.execute(_sql(statement)).fetchall()

    def row(self, statement: Fragment) -> dict[str, Any]:
        cur = self.conn.execute(_sql(statement))
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


class _Scan:
    """Every check on one table in ONE query: a pass over `dw.<table>` with the joins the checks need, one
    aggregate per figure (`count(*) FILTER (WHERE <offending>)`, ...). Offending rows are fetched only for the
    checks that fail. A missing table fails the checks that need it."""

    def __init__(self, db: _Snapshot, table: str, alias: str, joins: Sequence[Join] = ()) -> None:
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
            return Check(name, FAILED, f"{_rows(n)} {what}, e.g. {'; '.join(examples)}", batch)

        self.check(name, {"bad": sql.SQL("count(*) FILTER (WHERE {})").format(_sql(bad))}, judge, batch, joins)

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
        return sql.SQL(" ").join([scanned, *(_sql(j.clause) for j in self._joins_for(aliases))])

    def examples(self, example: Fragment, bad: Fragment, joins: Sequence[str] = ()) -> list[str]:
        # no DISTINCT: a top-N sort of the offending rows instead of a sort of all of them
        found = self.db.strings(
            sql.SQL("SELECT {} AS e FROM {} WHERE {} ORDER BY 1 LIMIT {}").format(
                _sql(example), self.from_clause(joins), _sql(bad), sql.Literal(EXAMPLES * 4)
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
                sql.SQL("{} AS {}").format(_sql(expr), sql.Identifier(key)) for key, expr in columns.items()
            )
            values = self.db.row(sql.SQL("SELECT\n  {}\nFROM {}").format(select, self.from_clause(joins)))
        for i, item in runnable:
            local = {k: values[f"c{i}_{k}"] for k in item.aggregates}
            checks[i] = item.judge(local)
        return [checks[i] for i in range(len(self.items))]


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


_OPERATORS = {"==": operator.eq, ">=": operator.ge, ">": operator.gt, "<=": operator.le}


def _compare(name: str, actual: int, op: str, expected: Expected, what: str, batch: int | None = None) -> Check:
    """`actual <op> expected`; skipped without figures, not checked when every figure is -1."""
    if expected.value is None:
        return Check(name, SKIPPED, f"no audit figure {', '.join(expected.missing)}", batch)
    if expected.counted == 0 and expected.not_counted:
        return Check(name, NOT_CHECKED, f"{', '.join(expected.not_counted)} is -1 (not counted)", batch)
    if _OPERATORS[op](actual, expected.value):
        return Check(name, OK, batch=batch)
    detail = f"{what} is {actual}, expected {op} {expected.value} ({expected.formula}{expected.note()})"
    return Check(name, FAILED, detail, batch)


# ------------------------------------------------------------------------------------------------- audit
@dataclass(frozen=True)
class _Scd2:
    """An SCD2 table: `label` (the spec's name), PostgreSQL table, natural key and surrogate key."""

    label: str
    table: str
    natural: str
    sk: str


ACCOUNTS = _Scd2("DimAccount", "dimaccount", "accountid", "sk_accountid")
CUSTOMERS = _Scd2("DimCustomer", "dimcustomer", "customerid", "sk_customerid")
SECURITIES = _Scd2("DimSecurity", "dimsecurity", "symbol", "sk_securityid")
COMPANIES = _Scd2("DimCompany", "dimcompany", "companyid", "sk_companyid")


class _Audit:
    """One audit run: the figures, the snapshot, and the checks in the script's order."""

    def __init__(self, db: _Snapshot, figures: Figures) -> None:
        self.db = db
        self.figures = figures
        self.batches = [b for b in figures.batches if b >= 1]  # B: the script's `BatchID in (1, 2, 3)`
        self.checks: list[Check] = []
        self.validation: dict[tuple[int, str, str], str | None] = {}  # (batch, source, text) -> MessageData
        self.validation_rows: list[tuple[int, str, str, str | None]] = []  # (batch, source, text, data)
        self.alerts: dict[tuple[int, str], int] = {}  # (batch, text) -> Alert rows
        self.message_batches: list[int] = []
        self.pcr_batches: list[int] = []
        self.visibility: list[tuple] = []

    def run(self) -> list[Check]:
        self.audit_table()
        self.read_messages()
        self.messages()
        self.broker()
        self.account()
        self.customer()
        self.security()
        self.company()
        self.prospect()
        self.watches()
        self.trade()
        self.financial()
        self.market_history()
        self.holdings()
        self.cash_balances()
        self.batch_validation()
        self.data_visibility()
        return self.checks

    # -- helpers
    def add(self, *checks: Check) -> None:
        self.checks.extend(checks)

    def expected(self, terms: Sequence[Term], batches: Sequence[int] | None = None) -> Expected:
        return self.figures.expected(terms, self.batches if batches is None else list(batches))

    def upto(self, batch: int) -> list[int]:
        return [b for b in self.batches if b <= batch]

    def window_rules(
        self,
        scan: _Scan,
        name: str,
        bad: Callable[[int, dt.date, dt.date], Fragment],
        what: str,
        example: Fragment,
        joins: Sequence[str] = (),
    ) -> None:
        """One rule per batch of B over the batch's window: `bad(batch, first, last)` is the offending condition,
        `what` describes the offending rows with `{window}` standing for the window."""
        for b in self.batches:
            window = self.figures.window(b)
            if window is None:
                scan.skip(name, f"no Batch FirstDay/LastDay figures for batch {b}", b)
                continue
            first, last = window
            scan.rule(name, bad(b, first, last), what.format(window=f"[{first}, {last}]"), example, b, joins)

    def batches_check(self, scan: _Scan, name: str, expected: Sequence[int]) -> None:
        """The official "<table> batches": the BatchID values of the scanned table are exactly `expected`."""
        if not self.batches:
            scan.skip(name, f"no audit figures {self.figures.where}: the batches are unknown")
            return
        wanted = list(expected)
        column = sql.Identifier(scan.alias, "batchid")
        aggregates: dict[str, Fragment] = {
            f"b{b}": sql.SQL("count(*) FILTER (WHERE {} = {})").format(column, sql.Literal(b)) for b in wanted
        }
        aggregates["other"] = sql.SQL("count(*) FILTER (WHERE {} <> ALL({}))").format(column, _ints(wanted))

        def judge(v: dict[str, Any]) -> Check:
            present = [b for b in wanted if v[f"b{b}"] > 0]
            if v["other"]:
                present += [
                    int(x)
                    for x in scan.db.strings(
                        sql.SQL(
                            "SELECT DISTINCT {column} FROM {source} WHERE {column} <> ALL({wanted}) ORDER BY 1 LIMIT 20"
                        ).format(column=column, source=scan.from_clause(()), wanted=_ints(wanted))
                    )
                ]
            if sorted(present) == wanted and not v["other"]:
                return Check(name, OK)
            return Check(name, FAILED, f"BatchID values are {sorted(present)}, expected {wanted}")

        scan.check(name, aggregates, judge)

    def reported(self, batch: int, source: str, text: str) -> tuple[int | None, str]:
        """A validation message's number, or None and why there is none."""
        if (batch, source, text) not in self.validation:
            return None, f"no '{text}' validation message for {source} in batch {batch}"
        data = self.validation[(batch, source, text)]
        try:
            return int(str(data).strip()), ""
        except ValueError:
            return None, f"the '{text}' validation message of {source} in batch {batch} says {data!r}, not a number"

    def message_vs_figures(
        self, name: str, source: str, text: str, op: str, terms: Sequence[Term], batch: int | None, upto: int
    ) -> Check:
        """A message of batch `upto` against the figures of batches 1..upto (`batch` is the result's batch)."""
        if "dimessages" not in self.db.tables:
            return Check(name, FAILED, "table dw.dimessages does not exist", batch)
        value, problem = self.reported(upto, source, text)
        if value is None:
            return Check(name, FAILED, problem, batch)
        return _compare(name, value, op, self.expected(terms, self.upto(upto)), f"'{text}' of batch {upto}", batch)

    def message_increase_vs_figure(self, name: str, source: str, attribute: str) -> None:
        """Per batch: the 'Row count' message minus the previous batch's equals the batch's figure."""
        for b in self.batches:
            if "dimessages" not in self.db.tables:
                self.add(Check(name, FAILED, "table dw.dimessages does not exist", b))
                continue
            now, problem_now = self.reported(b, source, ROW_COUNT)
            before, problem_before = self.reported(b - 1, source, ROW_COUNT)
            if now is None or before is None:
                self.add(Check(name, FAILED, problem_now or problem_before, b))
                continue
            what = f"'Row count' of batch {b} minus batch {b - 1} ({now} - {before})"
            self.add(_compare(name, now - before, "==", self.expected([Term(1, source, attribute)], [b]), what, b))

    def alerts_vs_figure(self, name: str, text: str, terms: Sequence[Term], per_batch: bool) -> None:
        if "dimessages" not in self.db.tables:
            for b in self.batches if per_batch else [None]:
                self.add(Check(name, FAILED, "table dw.dimessages does not exist", b))
            return
        if per_batch:
            for b in self.batches:
                found = self.alerts.get((b, text), 0)
                self.add(_compare(name, found, "==", self.expected(terms, [b]), f"'{text}' alerts of batch {b}", b))
            return
        per = {b: n for (b, t), n in sorted(self.alerts.items()) if t == text}
        spread = f" ({', '.join(f'batch {b}: {n}' for b, n in per.items())})" if per else ""
        self.add(_compare(name, sum(per.values()), "==", self.expected(terms), f"'{text}' alerts{spread}"))

    # -- Audit table
    def audit_table(self) -> None:
        if not self.figures:
            reason = f"no audit figures {self.figures.where}"
            self.add(Check("Audit table batches", SKIPPED, reason), Check("Audit table sources", SKIPPED, reason))
            return
        found = list(self.figures.batches)
        wanted = list(range(1, max(found) + 1))
        detail = f"figures for batches {found}, expected every batch 1..{max(found)}"
        self.add(Check("Audit table batches", OK if found == wanted else FAILED, "" if found == wanted else detail))
        missing = [d for d in AUDIT_DATASETS if d not in self.figures.datasets]
        detail = f"no figures for data set(s) {', '.join(missing)} {self.figures.where}"
        self.add(Check("Audit table sources", FAILED if missing else OK, detail if missing else ""))

    # -- DImessages
    def read_messages(self) -> None:
        if "dimessages" not in self.db.tables:
            return
        rows = self.db.rows(
            "SELECT batchid, messagetype, messagesource, messagetext, messagedata, messagedateandtime "
            "FROM dw.dimessages WHERE messagetype IN ('Validation', 'PCR', 'Visibility_1', 'Visibility_2')"
        )
        counts = self.db.rows(
            "SELECT batchid, messagetype, messagetext, count(*) FROM dw.dimessages "
            "WHERE messagetype NOT IN ('Validation', 'PCR', 'Visibility_1', 'Visibility_2') GROUP BY 1, 2, 3"
        )
        self.validation = {(b, s, t): d for b, kind, s, t, d, _ in rows if kind == "Validation"}
        self.validation_rows = [(b, s, t, d) for b, kind, s, t, d, _ in rows if kind == "Validation"]
        self.pcr_batches = sorted({r[0] for r in rows if r[1] == "PCR"})
        self.visibility = [r for r in rows if r[1] in ("Visibility_1", "Visibility_2")]
        self.alerts = {(b, t): n for b, kind, t, n in counts if kind == "Alert"}
        self.message_batches = sorted({r[0] for r in rows} | {r[0] for r in counts})

    def messages(self) -> None:
        names = ["DImessages batches", "DImessages Phase complete records", "DImessages sources"]
        names.append("DImessages initial condition")
        if "dimessages" not in self.db.tables:
            for b in [0, *self.batches]:
                self.add(Check("DImessages validation reports", FAILED, "table dw.dimessages does not exist", b))
            self.add(*(Check(n, FAILED, "table dw.dimessages does not exist") for n in names))
            return
        wanted = [0, *self.batches]
        for b in sorted(set(self.message_batches) | set(wanted)):
            got = [(s, t) for (mb, s, t, _) in self.validation_rows if mb == b]
            if len(got) == VALIDATION_ROWS_PER_BATCH:
                self.add(Check("DImessages validation reports", OK, batch=b))
                continue
            missing = [f"{s}/{t}" for s, t in SPEC_VALIDATION_ROWS if (s, t) not in got]
            extra = sorted(f"{s}/{t}" for s, t in got if (s, t) not in SPEC_VALIDATION_ROWS)
            detail = f"{len(got)} 'Validation' rows, expected {VALIDATION_ROWS_PER_BATCH}"
            if not got:
                missing = []  # listing all 24 says nothing more
            detail += f"; missing {', '.join(missing)}" if missing else ""
            detail += f"; unexpected {', '.join(extra)}" if extra else ""
            self.add(Check("DImessages validation reports", FAILED, detail, b))
        if not self.batches:
            reason = f"no audit figures {self.figures.where}: the batches are unknown"
            self.add(Check(names[0], SKIPPED, reason), Check(names[1], SKIPPED, reason))
        else:
            for name, found, what in (
                (names[0], self.message_batches, "BatchID values are"),
                (names[1], self.pcr_batches, "'PCR' rows are for batches"),
            ):
                ok = found == wanted
                self.add(Check(name, OK if ok else FAILED, "" if ok else f"{what} {found}, expected {wanted}"))
        present = {s for (_, s, _, _) in self.validation_rows}
        missing = [s for s in MESSAGE_SOURCES if s not in present]
        detail = f"no 'Validation' messages from {', '.join(missing)}"
        self.add(Check(names[2], FAILED if missing else OK, detail if missing else ""))
        nonzero = sorted(
            f"{s}/{t} = {d}" for (b, s, t, d) in self.validation_rows if b == 0 and d is not None and d != "0"
        )
        detail = f"batch 0 reports {', '.join(nonzero)} (every table must be empty before Batch1)"
        self.add(Check(names[3], FAILED if nonzero else OK, detail if nonzero else ""))

    # -- DimBroker
    def broker(self) -> None:
        scan = _Scan(self.db, "dimbroker", "v")
        brokers = self.expected([Term(1, "DimBroker", "HR_BROKERS")])
        scan.check(
            "DimBroker row count",
            {"n": "count(*)"},
            lambda v: _compare("DimBroker row count", v["n"], "==", brokers, "row count"),
        )
        scan.check(
            "DimBroker distinct keys",
            {"n": "count(DISTINCT v.sk_brokerid)"},
            lambda v: _compare("DimBroker distinct keys", v["n"], "==", brokers, "distinct SK_BrokerID"),
        )
        example = "format('brokerid=%s %s..%s batch %s', v.brokerid, v.effectivedate, v.enddate, v.batchid)"
        scan.rule("DimBroker BatchID", "v.batchid <> 1", "with a BatchID other than 1", example, batch=1)
        scan.rule("DimBroker IsCurrent", "NOT v.iscurrent", "not current", example)
        first = self.figures.day("FirstDay", 1)
        if first is None:
            scan.skip("DimBroker EffectiveDate", "no Batch FirstDay figure for batch 1")
        else:
            what = f"with an EffectiveDate other than Batch1's first day {first}"
            scan.rule("DimBroker EffectiveDate", sql.SQL("v.effectivedate <> {}").format(_date(first)), what, example)
        not_eot = sql.SQL("v.enddate <> {}").format(EOT)
        scan.rule("DimBroker EndDate", not_eot, "with an EndDate other than 9999-12-31", example)
        self.add(*scan.run())

    # -- the SCD2 invariants shared by DimAccount, DimCustomer, DimSecurity, DimCompany
    def scd2_scan(self, t: _Scd2, joins: Sequence[Join] = ()) -> _Scan:
        chain = Join(
            "nx",
            t.table,
            sql.SQL(
                "LEFT JOIN (SELECT {natural} AS nk, effectivedate AS eff, count(*) AS n FROM {table} "
                "GROUP BY 1, 2) nx ON nx.nk = {version_natural} AND nx.eff = v.enddate"
            ).format(
                natural=sql.Identifier(t.natural),
                table=sql.Identifier("dw", t.table),
                version_natural=sql.Identifier("v", t.natural),
            ),
        )
        return _Scan(self.db, t.table, "v", [chain, *joins])

    def version_example(self, t: _Scd2) -> sql.Composable:
        return _format(f"{t.natural}=%s %s..%s", sql.Identifier("v", t.natural), "v.effectivedate", "v.enddate")

    def scd2_checks(self, scan: _Scan, t: _Scd2, batches: Sequence[int], is_current: bool = True) -> None:
        """distinct keys, EndDate, Overlap, End of Time, consolidation, batches, IsCurrent, EffectiveDate."""
        label, example = t.label, self.version_example(t)
        table, natural, sk = sql.Identifier("dw", t.table), sql.Identifier(t.natural), sql.Identifier(t.sk)
        version_natural = sql.Identifier("v", t.natural)
        ends_eot = sql.SQL("count(*) FILTER (WHERE v.enddate = {})").format(EOT)

        def distinct(v: dict[str, Any]) -> Check:
            if v["keys"] == v["rows"]:
                return Check(f"{label} distinct keys", OK)
            dupes = scan.db.strings(
                sql.SQL("SELECT {} FROM {} GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT {}").format(
                    sk, table, sql.Literal(EXAMPLES)
                )
            )
            detail = f"{v['keys']} distinct {t.sk} for {_rows(v['rows'])}, e.g. {t.sk}={', '.join(dupes)}"
            return Check(f"{label} distinct keys", FAILED, detail)

        keys = sql.SQL("count(DISTINCT {})").format(sql.Identifier("v", t.sk))
        scan.check(f"{label} distinct keys", {"keys": keys, "rows": "count(*)"}, distinct)

        def end_date(v: dict[str, Any]) -> Check:
            if v["rows"] == v["chained"] + v["eot"]:
                return Check(f"{label} EndDate", OK)
            bad = sql.SQL("coalesce(nx.n, 0) + (v.enddate = {})::int <> 1").format(EOT)
            detail = (
                f"{_rows(v['rows'])}, but {v['chained']} end on another version's EffectiveDate and {v['eot']} on "
                f"9999-12-31 (they must add up), e.g. {'; '.join(scan.examples(example, bad, ['nx']))}"
            )
            return Check(f"{label} EndDate", FAILED, detail)

        aggregates: dict[str, Fragment] = {"rows": "count(*)", "chained": "coalesce(sum(nx.n), 0)", "eot": ends_eot}
        scan.check(f"{label} EndDate", aggregates, end_date, joins=["nx"])

        pairs = sql.SQL(
            "FROM {table} a JOIN {table} b ON {a_natural} = {b_natural} AND {a_sk} <> {b_sk} "
            "AND a.effectivedate >= b.effectivedate AND a.effectivedate < b.enddate"
        ).format(
            table=table,
            a_natural=sql.Identifier("a", t.natural),
            b_natural=sql.Identifier("b", t.natural),
            a_sk=sql.Identifier("a", t.sk),
            b_sk=sql.Identifier("b", t.sk),
        )

        def overlap(v: dict[str, Any]) -> Check:
            if v["pairs"] == 0:
                return Check(f"{label} Overlap", OK)
            pair = _format(
                f"{t.natural}=%s: %s..%s starts inside %s..%s",
                sql.Identifier("a", t.natural),
                "a.effectivedate",
                "a.enddate",
                "b.effectivedate",
                "b.enddate",
            )
            shown = scan.db.strings(
                sql.SQL("SELECT DISTINCT {} {} ORDER BY 1 LIMIT {}").format(pair, pairs, sql.Literal(EXAMPLES))
            )
            detail = f"{v['pairs']} pair(s) of versions of one {t.natural} overlap, e.g. {'; '.join(shown)}"
            return Check(f"{label} Overlap", FAILED, detail)

        scan.check(f"{label} Overlap", {"pairs": sql.SQL("(SELECT count(*) {})").format(pairs)}, overlap)

        def end_of_time(v: dict[str, Any]) -> Check:
            if v["keys"] == v["eot"]:
                return Check(f"{label} End of Time", OK)
            open_versions = sql.SQL("count(*) FILTER (WHERE enddate = {})").format(EOT)
            shown = scan.db.strings(
                sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING {} <> 1 ORDER BY {} LIMIT {}").format(
                    _format(f"{t.natural}=%s (%s)", natural, open_versions),
                    table,
                    natural,
                    open_versions,
                    natural,
                    sql.Literal(EXAMPLES),
                )
            )
            detail = (
                f"{v['keys']} distinct {t.natural} but {v['eot']} versions end on 9999-12-31, e.g. (versions "
                f"open to the end of time) {'; '.join(shown)}"
            )
            return Check(f"{label} End of Time", FAILED, detail)

        aggregates = {"keys": sql.SQL("count(DISTINCT {})").format(version_natural), "eot": ends_eot}
        scan.check(f"{label} End of Time", aggregates, end_of_time)
        scan.rule(
            f"{label} consolidation", "v.effectivedate = v.enddate", "starting and ending on the same day", example
        )
        self.batches_check(scan, f"{label} batches", batches)
        if is_current:
            scan.rule(
                f"{label} IsCurrent",
                sql.SQL(
                    "NOT coalesce((v.enddate = {eot} AND v.iscurrent) "
                    "OR (v.enddate < {eot} AND NOT v.iscurrent), false)"
                ).format(eot=EOT),
                "whose IsCurrent disagrees with an EndDate of 9999-12-31",
                _format(
                    f"{t.natural}=%s %s..%s iscurrent=%s",
                    version_natural,
                    "v.effectivedate",
                    "v.enddate",
                    "v.iscurrent::text",
                ),
            )
        self.window_rules(
            scan,
            f"{label} EffectiveDate",
            lambda b, first, last: sql.SQL("v.batchid = {} AND (v.effectivedate < {} OR v.effectivedate > {})").format(
                sql.Literal(b), _date(first), _date(last)
            ),
            "of the batch with an EffectiveDate outside {window}",
            example,
        )
        scan.rule(
            f"{label} Status",
            "v.status NOT IN ('Active', 'Inactive')",
            "with a Status not in (Active, Inactive)",
            _format(f"{t.natural}=%s %s", version_natural, self.value("status")),
        )

    @staticmethod
    def value(column: str, alias: str = "v") -> sql.Composable:
        return sql.SQL("coalesce({}::text, 'NULL')").format(sql.Identifier(alias, column))

    def foreign_key(
        self, scan: _Scan, name: str, alias: str, fk: str, what: str, ident: Fragment, batch: int | None = None
    ) -> None:
        """The official "<table> <SK>": every row joins a dimension row (`alias`, joined with the check's
        conditions); offending rows are quoted as `ident` -> fk."""
        example = _format(f"%s -> {fk}=%s", ident, sql.Identifier(scan.alias, fk))
        scan.rule(name, sql.SQL("{} IS NULL").format(sql.Identifier(alias, fk)), what, example, batch, [alias])

    # -- DimAccount
    def account(self) -> None:
        t = ACCOUNTS
        scan = self.scd2_scan(
            t,
            [
                Join(
                    "cu",
                    "dimcustomer",
                    "LEFT JOIN dw.dimcustomer cu ON cu.sk_customerid = v.sk_customerid "
                    "AND cu.effectivedate <= v.effectivedate AND v.enddate <= cu.enddate",
                ),
                Join(
                    "br",
                    "dimbroker",
                    "LEFT JOIN dw.dimbroker br ON br.sk_brokerid = v.sk_brokerid "
                    "AND br.effectivedate <= v.effectivedate AND v.enddate <= br.enddate",
                ),
            ],
        )
        customer_terms = [Term(1, "DimCustomer", a) for a in ("C_NEW", "C_UPDCUST", "C_INACT")]
        account_terms = [Term(1, "DimAccount", a) for a in ("CA_ADDACCT", "CA_CLOSEACCT", "CA_UPDACCT")]
        for b in self.batches:
            if b == 1:
                op = ">"
                terms = [customer_terms[0], *account_terms, *customer_terms[1:]]
                terms += [Term(-1, "DimCustomer", "C_ID_HIST"), Term(-1, "DimAccount", "CA_ID_HIST")]
            else:
                op, terms = ">=", [*account_terms, Term(-1, "DimAccount", "CA_ID_HIST")]
            expected = self.expected(terms, [b])
            scan.check(
                "DimAccount row count",
                {"n": sql.SQL("count(*) FILTER (WHERE v.batchid = {})").format(sql.Literal(b))},
                lambda v, b=b, op=op, expected=expected: _compare(
                    "DimAccount row count", v["n"], op, expected, f"rows of batch {b}", b
                ),
                batch=b,
            )
        self.scd2_checks(scan, t, self.batches)
        scan.rule(
            "DimAccount TaxStatus",
            "v.batchid = 1 AND v.taxstatus NOT IN (0, 1, 2)",
            "of batch 1 with a TaxStatus not in (0, 1, 2)",
            _format("accountid=%s taxstatus=%s", "v.accountid", self.value("taxstatus")),
        )
        ident = "format('accountid=%s %s..%s', v.accountid, v.effectivedate, v.enddate)"
        self.foreign_key(
            scan,
            "DimAccount SK_CustomerID",
            "cu",
            "sk_customerid",
            "without a DimCustomer version over their dates",
            ident,
        )
        self.foreign_key(
            scan, "DimAccount SK_BrokerID", "br", "sk_brokerid", "without a DimBroker version over their dates", ident
        )
        # As written in the script: its WHERE keeps only inactive accounts, so no group has fewer than one row.
        inactive = (
            "(SELECT count(*) FROM (SELECT c.sk_customerid FROM dw.dimcustomer c "
            "LEFT JOIN dw.dimaccount a ON a.sk_customerid = c.sk_customerid "
            "WHERE c.status = 'Inactive' AND a.status = 'Inactive' GROUP BY c.sk_customerid "
            "HAVING count(*) < 1) z)"
        )
        scan.check(
            "DimAccount inactive customers",
            {"n": inactive},
            lambda v: (
                Check("DimAccount inactive customers", OK)
                if v["n"] == 0
                else Check("DimAccount inactive customers", FAILED, f"{v['n']} inactive customer version(s)")
            ),
            tables=["dimcustomer"],
        )
        self.add(*scan.run())

    # -- DimCustomer
    def customer(self) -> None:
        t = CUSTOMERS
        person = sql.SQL(
            "upper({a}.firstname || {a}.lastname || {a}.addressline1 || coalesce({a}.addressline2, '') "
            "|| {a}.postalcode)"
        )
        scan = self.scd2_scan(
            t,
            [
                Join(
                    "lt",
                    "taxrate",
                    "LEFT JOIN (SELECT tx_name, tx_rate, count(*) AS n FROM dw.taxrate GROUP BY 1, 2) lt "
                    "ON lt.tx_name = v.localtaxratedesc AND lt.tx_rate = v.localtaxrate",
                ),
                Join(
                    "nt",
                    "taxrate",
                    "LEFT JOIN (SELECT tx_name, tx_rate, count(*) AS n FROM dw.taxrate GROUP BY 1, 2) nt "
                    "ON nt.tx_name = v.nationaltaxratedesc AND nt.tx_rate = v.nationaltaxrate",
                ),
                Join(
                    "pr",
                    "prospect",
                    sql.SQL(
                        "LEFT JOIN (SELECT {prospect} AS person, coalesce(p.creditrating, 0) AS cr, "
                        "coalesce(p.networth, 0) AS nw, coalesce(p.marketingnameplate, '') AS mn, count(*) AS n "
                        "FROM dw.prospect p GROUP BY 1, 2, 3, 4) pr ON v.iscurrent "
                        "AND pr.person = {customer} AND pr.cr = coalesce(v.creditrating, 0) "
                        "AND pr.nw = coalesce(v.networth, 0) AND pr.mn = coalesce(v.marketingnameplate, '')"
                    ).format(
                        prospect=person.format(a=sql.Identifier("p")), customer=person.format(a=sql.Identifier("v"))
                    ),
                ),
            ],
        )
        for b in self.batches:
            terms = [Term(1, "DimCustomer", a) for a in ("C_NEW", "C_INACT", "C_UPDCUST")]
            expected = self.expected([*terms, Term(-1, "DimCustomer", "C_ID_HIST")], [b])
            scan.check(
                "DimCustomer row count",
                {"n": sql.SQL("count(*) FILTER (WHERE v.batchid = {})").format(sql.Literal(b))},
                lambda v, b=b, expected=expected: _compare(
                    "DimCustomer row count", v["n"], ">=", expected, f"rows of batch {b}", b
                ),
                batch=b,
            )
        self.scd2_checks(scan, t, self.batches)
        ident = sql.SQL("format('customerid=%s %s', v.customerid, {})")
        scan.rule(
            "DimCustomer Gender",
            "v.gender NOT IN ('M', 'F', 'U')",
            "with a Gender not in (M, F, U)",
            ident.format(self.value("gender")),
        )
        scan.rule(
            "DimCustomer TaxID",
            "v.taxid NOT LIKE '___-__-____'",
            "with a TaxID not like ___-__-____",
            ident.format(self.value("taxid")),
        )
        for phone in ("phone1", "phone2", "phone3"):
            column = sql.Identifier("v", phone)
            bad = sql.SQL(
                "{phone} NOT LIKE '+1 (___) ___-____%' AND {phone} NOT LIKE '(___) ___-____%' "
                "AND {phone} NOT LIKE '___-____%' AND {phone} <> '' AND {phone} IS NOT NULL"
            ).format(phone=column)
            scan.rule(
                f"DimCustomer {phone.capitalize()}",
                bad,
                f"with a badly formatted {phone.capitalize()}",
                ident.format(column),
            )
        scan.rule(
            "DimCustomer Email1",
            "v.email1 NOT LIKE '_%.%@%.%' AND v.email1 IS NOT NULL",
            "with an Email1 not like _%.%@%.%",
            ident.format(sql.Identifier("v", "email1")),
        )
        scan.rule(
            "DimCustomer Email2",
            "v.email2 NOT LIKE '_%.%@%.%' AND v.email2 <> '' AND v.email2 IS NOT NULL",
            "with an Email2 not like _%.%@%.%",
            ident.format(sql.Identifier("v", "email2")),
        )
        self.tax_rate_check(scan, "DimCustomer LocalTaxRate", "lt", "localtaxrate", ">", 300)
        self.tax_rate_check(scan, "DimCustomer NationalTaxRate", "nt", "nationaltaxrate", ">=", 9)

        def demographics(v: dict[str, Any]) -> Check:
            name = "DimCustomer demographic fields"
            if v["matched"] == v["agency"]:
                return Check(name, OK)
            bad = "v.iscurrent AND (v.agencyid IS NOT NULL) <> (coalesce(pr.n, 0) = 1)"
            shown = scan.examples(
                "format('customerid=%s agencyid=%s with %s matching prospect(s)', v.customerid, "
                "coalesce(v.agencyid, 'NULL'), coalesce(pr.n, 0))",
                bad,
                ["pr"],
            )
            detail = (
                f"{v['matched']} current version(s) match a Prospect with the same CreditRating, NetWorth and "
                f"MarketingNameplate, but {v['agency']} current version(s) have an AgencyID, e.g. {'; '.join(shown)}"
            )
            return Check(name, FAILED, detail)

        scan.check(
            "DimCustomer demographic fields",
            {
                "matched": "coalesce(sum(pr.n), 0)",
                "agency": "count(*) FILTER (WHERE v.agencyid IS NOT NULL AND v.iscurrent)",
            },
            demographics,
            joins=["pr"],
        )
        self.add(*scan.run())
        # the checks that compare DImessages with the figures
        inactive = [Term(1, "DimCustomer", "C_INACT")]
        for b in self.batches:
            self.add(
                self.message_vs_figures(
                    "DimCustomer inactive customers", "DimCustomer", "Inactive customers", "==", inactive, b, b
                )
            )
        dob = [Term(1, "DimCustomer", "C_DOB_TO"), Term(1, "DimCustomer", "C_DOB_TY")]
        self.alerts_vs_figure("DimCustomer age range alerts", "DOB out of range", dob, per_batch=True)
        tier = [Term(1, "DimCustomer", "C_TIER_INV")]
        self.alerts_vs_figure("DimCustomer customer tier alerts", "Invalid customer tier", tier, per_batch=True)

    def tax_rate_check(self, scan: _Scan, name: str, alias: str, column: str, op: str, distinct: int) -> None:
        """The official tax-rate check: every row joins TaxRate on (desc, rate), and enough distinct descs exist
        (a scale-dependent part, see the module docstring)."""
        desc = f"{column}desc"

        def judge(v: dict[str, Any]) -> Check:
            joined, rows, found = v["joined"], v["rows"], v["distinct"]
            enough = found > distinct if op == ">" else found >= distinct
            if joined == rows and enough:
                return Check(name, OK)
            parts = []
            if joined != rows:
                shown = scan.examples(
                    _format(
                        "customerid=%s %s %s",
                        "v.customerid",
                        sql.SQL("coalesce({}, 'NULL')").format(sql.Identifier("v", desc)),
                        self.value(column),
                    ),
                    sql.SQL("{} IS DISTINCT FROM 1").format(sql.Identifier(alias, "n")),
                    [alias],
                )
                parts.append(
                    f"{joined} TaxRate rows join {_rows(rows)} on ({desc}, {column}) (must be equal), "
                    f"e.g. {'; '.join(shown)}"
                )
            if not enough:
                parts.append(f"{found} distinct {desc}, the script asks for {op} {distinct}")
            sf = self.figures.scale_factor
            if joined == rows and sf is not None and sf < DISTINCT_RATES_MIN_SCALE_FACTOR:
                detail = (
                    f"the join holds; the distinct-count part failed: {parts[0]}, which a data set of scale factor "
                    f"{sf:g} is too small to reach (checked from scale factor {DISTINCT_RATES_MIN_SCALE_FACTOR})"
                )
                return Check(name, NOT_CHECKED, detail)
            if joined == rows and sf is None:
                parts[-1] += " (scale factor unknown: no Generator SF figure)"
            return Check(name, FAILED, "; ".join(parts))

        aggregates: dict[str, Fragment] = {
            "joined": sql.SQL("coalesce(sum({}), 0)").format(sql.Identifier(alias, "n")),
            "rows": "count(*)",
            "distinct": sql.SQL("count(DISTINCT {})").format(sql.Identifier("v", desc)),
        }
        scan.check(name, aggregates, judge, joins=[alias])

    # -- DimSecurity
    def security(self) -> None:
        t = SECURITIES
        scan = self.scd2_scan(
            t,
            [
                Join(
                    "co",
                    "dimcompany",
                    "LEFT JOIN dw.dimcompany co ON co.sk_companyid = v.sk_companyid AND "
                    "co.effectivedate <= v.effectivedate AND v.enddate <= co.enddate",
                )
            ],
        )
        if 1 in self.batches:  # the script checks batch 1 only
            self.add(
                self.message_vs_figures(
                    "DimSecurity row count", "DimSecurity", ROW_COUNT, ">=", [Term(1, "DimSecurity", "FW_SEC")], 1, 1
                )
            )
        self.scd2_checks(scan, t, [1])
        ident = "format('symbol=%s %s..%s', v.symbol, v.effectivedate, v.enddate)"
        self.foreign_key(
            scan,
            "DimSecurity SK_CompanyID",
            "co",
            "sk_companyid",
            "without a DimCompany version over their dates",
            ident,
        )
        scan.rule(
            "DimSecurity ExchangeID",
            "v.exchangeid NOT IN ('NYSE', 'NASDAQ', 'AMEX', 'PCX')",
            "with an ExchangeID not in (NYSE, NASDAQ, AMEX, PCX)",
            _format("symbol=%s %s", "v.symbol", self.value("exchangeid")),
        )
        scan.rule(
            "DimSecurity Issue",
            "v.issue NOT IN ('COMMON', 'PREF_A', 'PREF_B', 'PREF_C', 'PREF_D')",
            "with an Issue not in (COMMON, PREF_A..PREF_D)",
            _format("symbol=%s %s", "v.symbol", self.value("issue")),
        )
        self.add(*scan.run())

    # -- DimCompany
    def company(self) -> None:
        t = COMPANIES
        scan = self.scd2_scan(
            t,
            [
                Join(
                    "ind",
                    "industry",
                    "LEFT JOIN (SELECT DISTINCT in_name FROM dw.industry) ind ON ind.in_name = v.industry",
                )
            ],
        )
        for b in self.batches:
            self.add(
                self.message_vs_figures(
                    "DimCompany row count", "DimCompany", ROW_COUNT, "<=", [Term(1, "DimCompany", "FW_CMP")], b, b
                )
            )
        self.scd2_checks(scan, t, [1], is_current=False)
        names = sql.SQL("FROM dw.dimcompany a JOIN dw.dimcompany b ON a.name = b.name AND a.companyid <> b.companyid")

        def distinct_names(v: dict[str, Any]) -> Check:
            if v["pairs"] == 0:
                return Check("DimCompany distinct names", OK)
            shown = scan.db.strings(
                sql.SQL(
                    "SELECT DISTINCT format('%s: companyid %s and %s', a.name, least(a.companyid, b.companyid), "
                    "greatest(a.companyid, b.companyid)) {} ORDER BY 1 LIMIT {}"
                ).format(names, sql.Literal(EXAMPLES))
            )
            detail = f"{v['pairs']} pair(s) of rows of different companies share a name, e.g. {'; '.join(shown)}"
            return Check("DimCompany distinct names", FAILED, detail)

        pairs = sql.SQL("(SELECT count(*) {})").format(names)
        scan.check("DimCompany distinct names", {"pairs": pairs}, distinct_names)
        ident = sql.SQL("format('companyid=%s %s', v.companyid, {})")
        scan.rule(
            "DimCompany Industry",
            "ind.in_name IS NULL",
            "with an Industry that is no Industry's IN_NAME",
            ident.format(self.value("industry")),
            joins=["ind"],
        )
        ratings = "AAA AA A BBB BB B CCC CC C D AA+ A+ BBB+ BB+ B+ CCC+ AA- A- BBB- BB- B- CCC-".split()
        scan.rule(
            "DimCompany SPrating",
            sql.SQL("v.sprating NOT IN ({}) AND v.sprating IS NOT NULL").format(_texts(ratings)),
            "with an SPRating that is no S&P rating",
            ident.format(sql.Identifier("v", "sprating")),
        )
        scan.rule(
            "DimCompany Country",
            "v.country NOT IN ('Canada', 'United States of America', '') AND v.country IS NOT NULL",
            "with a Country not in (Canada, United States of America, '')",
            ident.format(sql.Identifier("v", "country")),
        )
        self.add(*scan.run())

    # -- Prospect
    def prospect(self) -> None:
        scan = _Scan(
            self.db,
            "prospect",
            "p",
            [Join("rd", "dimdate", "LEFT JOIN dw.dimdate rd ON rd.sk_dateid = p.sk_recorddateid")],
        )
        scan.rule(
            "Prospect SK_UpdateDateID",
            "p.sk_recorddateid < p.sk_updatedateid",
            "with an SK_RecordDateID before their SK_UpdateDateID",
            "format('agencyid=%s record %s update %s', p.agencyid, p.sk_recorddateid, p.sk_updatedateid)",
        )
        for b in self.batches:
            window = self.figures.window(b)
            if window is None:
                scan.skip("Prospect SK_RecordDateID", f"no Batch FirstDay/LastDay figures for batch {b}", b)
                continue
            scan.rule(
                "Prospect SK_RecordDateID",
                sql.SQL("p.batchid = {} AND rd.datevalue < {}").format(sql.Literal(b), _date(window[0])),
                f"of batch {b} recorded before the batch's first day {window[0]}",
                "format('agencyid=%s recorded %s', p.agencyid, rd.datevalue)",
                b,
                ["rd"],
            )
        self.batches_check(scan, "Prospect batches", self.batches)
        scan.rule(
            "Prospect Country",
            "p.country NOT IN ('Canada', 'United States of America') AND p.country IS NOT NULL",
            "with a Country not in (Canada, United States of America)",
            _format("agencyid=%s %s", "p.agencyid", self.value("country", "p")),
        )
        plate = sql.Identifier("p", "marketingnameplate")
        tag_rules = [
            ("HighValue", "(coalesce(p.networth, 0) > 1000000 OR coalesce(p.income, 0) > 200000)"),
            ("Expenses", "(coalesce(p.numberchildren, 0) > 3 OR coalesce(p.numbercreditcards, 0) > 5)"),
            ("Boomer", "coalesce(p.age, 0) > 45"),
            (
                "MoneyAlert",
                "(coalesce(p.income, 50000) < 50000 OR coalesce(p.creditrating, 600) < 600 "
                "OR coalesce(p.networth, 100000) < 100000)",
            ),
            ("Spender", "(coalesce(p.numbercars, 0) > 3 OR coalesce(p.numbercreditcards, 0) > 7)"),
            ("Inherited", "(coalesce(p.age, 25) < 25 AND coalesce(p.networth, 0) > 1000000)"),
        ]
        conditions = {
            f"without {tag}": sql.SQL("{} AND {} NOT LIKE {}").format(sql.SQL(when), plate, sql.Literal(f"%{tag}%"))
            for tag, when in tag_rules
        }
        conditions["not a combination of the tags"] = sql.SQL("coalesce({}, '') NOT IN ({})").format(
            plate, _texts(nameplates())
        )
        aggregates: dict[str, Fragment] = {
            f"r{i}": sql.SQL("count(*) FILTER (WHERE {})").format(c) for i, c in enumerate(conditions.values())
        }
        aggregates["rows"] = "count(*)"

        def nameplate(v: dict[str, Any]) -> Check:
            name = "Prospect MarketingNameplate"
            if v["rows"] == 0:
                return Check(name, FAILED, "Prospect is empty (the script's sum over no rows is NULL, which fails)")
            counts = [v[f"r{i}"] for i in range(len(conditions))]
            if not any(counts):
                return Check(name, OK)
            parts = []
            for (what, condition), n in zip(conditions.items(), counts, strict=True):
                if n:
                    shown = scan.examples(
                        _format(
                            "agencyid=%s %s", "p.agencyid", sql.SQL("coalesce(quote_literal({}), 'NULL')").format(plate)
                        ),
                        condition,
                    )
                    parts.append(f"{_rows(n)} {what} (e.g. {'; '.join(shown)})")
            return Check(name, FAILED, f"{sum(counts)} violation(s): {', '.join(parts)}")

        scan.check("Prospect MarketingNameplate", aggregates, nameplate)
        self.add(*scan.run())

    # -- FactWatches
    def watches(self) -> None:
        placed = sql.Identifier("dp", "datevalue")
        scan = _Scan(
            self.db,
            "factwatches",
            "w",
            [
                Join("dp", "dimdate", "LEFT JOIN dw.dimdate dp ON dp.sk_dateid = w.sk_dateid_dateplaced"),
                Join("dr", "dimdate", "LEFT JOIN dw.dimdate dr ON dr.sk_dateid = w.sk_dateid_dateremoved"),
                Join("cu", "dimcustomer", _version_join("dimcustomer", "cu", "sk_customerid", "w", placed), ("dp",)),
                Join("se", "dimsecurity", _version_join("dimsecurity", "se", "sk_securityid", "w", placed), ("dp",)),
            ],
        )
        self.message_increase_vs_figure("FactWatches row count", "FactWatches", "WH_ACTIVE")
        self.batches_check(scan, "FactWatches batches", self.batches)
        for b in self.batches:
            if "dimessages" not in self.db.tables:
                self.add(Check("FactWatches active watches", FAILED, "table dw.dimessages does not exist", b))
                continue
            active, p1 = self.reported(b, "FactWatches", ROW_COUNT)
            inactive, p2 = self.reported(b, "FactWatches", "Inactive watches")
            if active is None or inactive is None:
                self.add(Check("FactWatches active watches", FAILED, p1 or p2, b))
                continue
            expected = self.expected([Term(1, "FactWatches", "WH_RECORDS")], self.upto(b))
            what = f"'Row count' + 'Inactive watches' of batch {b} ({active} + {inactive})"
            self.add(_compare("FactWatches active watches", active + inactive, "==", expected, what, b))
        ident = "format('sk_customerid=%s sk_securityid=%s placed %s', w.sk_customerid, w.sk_securityid, dp.datevalue)"
        self.foreign_key(
            scan,
            "FactWatches SK_CustomerID",
            "cu",
            "sk_customerid",
            "without a DimCustomer version valid on the day placed",
            ident,
        )
        self.foreign_key(
            scan,
            "FactWatches SK_SecurityID",
            "se",
            "sk_securityid",
            "without a DimSecurity version valid on the day placed",
            ident,
        )
        self.window_rules(
            scan,
            "FactWatches date check",
            lambda b, first, last: sql.SQL(
                "w.batchid = {b} AND ((w.sk_dateid_dateremoved IS NULL AND (dp.datevalue > {last} "
                "OR dp.datevalue < {first})) OR (w.sk_dateid_dateremoved IS NOT NULL AND "
                "(dr.datevalue > {last} OR dr.datevalue < {first} "
                "OR w.sk_dateid_dateplaced > w.sk_dateid_dateremoved)))"
            ).format(b=sql.Literal(b), first=_date(first), last=_date(last)),
            "of the batch placed (removed, for removed watches) outside {window}, or removed before placed",
            "format('sk_customerid=%s sk_securityid=%s placed %s removed %s', w.sk_customerid, w.sk_securityid, "
            "dp.datevalue, coalesce(dr.datevalue::text, '-'))",
            ["dp", "dr"],
        )
        self.add(*scan.run())

    # -- DimTrade
    def trade(self) -> None:
        created = sql.Identifier("cd", "datevalue")
        joins = [
            Join("cd", "dimdate", "LEFT JOIN dw.dimdate cd ON cd.sk_dateid = t.sk_createdateid"),
            Join("xd", "dimdate", "LEFT JOIN dw.dimdate xd ON xd.sk_dateid = t.sk_closedateid"),
        ]
        dimensions = [
            ("br", "dimbroker", "sk_brokerid", "DimBroker"),
            ("co", "dimcompany", "sk_companyid", "DimCompany"),
            ("se", "dimsecurity", "sk_securityid", "DimSecurity"),
            ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
            ("ac", "dimaccount", "sk_accountid", "DimAccount"),
        ]
        for alias, table, sk, _ in dimensions:
            joins.append(Join(alias, table, _version_join(table, alias, sk, "t", created), ("cd",)))
        scan = _Scan(self.db, "dimtrade", "t", joins)
        for b in self.batches:
            self.add(
                self.message_vs_figures(
                    "DimTrade row count", "DimTrade", ROW_COUNT, "==", [Term(1, "DimTrade", "T_NEW")], b, b
                )
            )
        canceled = self.expected([Term(1, "DimTrade", "T_CanceledTrades")])
        scan.check(
            "DimTrade canceled trades",
            {"n": "count(*) FILTER (WHERE t.status = 'Canceled')"},
            lambda v: _compare("DimTrade canceled trades", v["n"], "==", canceled, "Canceled trades"),
        )
        commission = [Term(1, "DimTrade", "T_InvalidCommision")]
        charge = [Term(1, "DimTrade", "T_InvalidCharge")]
        self.batches_check(scan, "DimTrade batches", self.batches)

        def distinct(v: dict[str, Any]) -> Check:
            if v["keys"] == v["rows"]:
                return Check("DimTrade distinct keys", OK)
            return Check("DimTrade distinct keys", FAILED, f"{v['keys']} distinct TradeID for {_rows(v['rows'])}")

        scan.check("DimTrade distinct keys", {"keys": "count(DISTINCT t.tradeid)", "rows": "count(*)"}, distinct)
        ident = "format('tradeid=%s created %s', t.tradeid, cd.datevalue)"
        for alias, _, sk, label in dimensions:
            self.foreign_key(
                scan,
                f"DimTrade {_official_sk(sk)}",
                alias,
                sk,
                f"without a {label} version valid on the create date",
                ident,
            )

        def date_check(b: int, first: dt.date, last: dt.date) -> sql.Composable:
            first1 = (self.figures.window(1) or (None, None))[0]
            return sql.SQL(
                "t.batchid = {b} AND ((t.sk_closedateid IS NULL AND (cd.datevalue > {last} OR cd.datevalue < "
                "CASE WHEN t.type LIKE 'Limit%' THEN {first1} ELSE {first} END)) OR "
                "(t.sk_closedateid IS NOT NULL AND (xd.datevalue > {last} OR xd.datevalue < {first} "
                "OR t.sk_closedateid < t.sk_createdateid)))"
            ).format(b=sql.Literal(b), first1=_date(first1), first=_date(first), last=_date(last))

        self.window_rules(
            scan,
            "DimTrade date check",
            date_check,
            "of the batch created (open trades; open limit orders may start on Batch1's first day) or closed "
            "outside {window}, or closed before created",
            "format('tradeid=%s %s created %s closed %s', t.tradeid, t.type, cd.datevalue, "
            "coalesce(xd.datevalue::text, '-'))",
            ["cd", "xd"],
        )
        statuses = ("Canceled", "Pending", "Submitted", "Active", "Completed")
        scan.rule(
            "DimTrade Status",
            sql.SQL("t.status NOT IN ({})").format(_texts(statuses)),
            f"with a Status not in ({', '.join(statuses)})",
            "format('tradeid=%s %s', t.tradeid, t.status)",
        )
        types = ("Market Buy", "Market Sell", "Stop Loss", "Limit Sell", "Limit Buy")
        scan.rule(
            "DimTrade Type",
            sql.SQL("t.type NOT IN ({})").format(_texts(types)),
            f"with a Type not in ({', '.join(types)})",
            "format('tradeid=%s %s', t.tradeid, t.type)",
        )
        self.add(*scan.run())
        self.alerts_vs_figure("DimTrade commission alerts", "Invalid trade commission", commission, per_batch=False)
        self.alerts_vs_figure("DimTrade charge alerts", "Invalid trade fee", charge, per_batch=False)

    # -- Financial
    def financial(self) -> None:
        scan = _Scan(
            self.db,
            "financial",
            "f",
            [Join("co", "dimcompany", "LEFT JOIN dw.dimcompany co ON co.sk_companyid = f.sk_companyid")],
        )
        if "dimessages" not in self.db.tables:
            self.add(Check("Financial row count", FAILED, "table dw.dimessages does not exist"))
        else:
            value, problem = self.reported(1, "Financial", ROW_COUNT)
            terms = [Term(1, "Financial", "FW_FIN")]
            self.add(
                Check("Financial row count", FAILED, problem)
                if value is None
                else _compare("Financial row count", value, "==", self.expected(terms), "'Row count' of batch 1")
            )
        ident = sql.SQL("format('sk_companyid=%s %s Q%s', f.sk_companyid, f.fi_year, f.fi_qtr)")
        scan.rule("Financial SK_CompanyID", "co.sk_companyid IS NULL", "without a DimCompany row", ident, joins=["co"])
        window = self.figures.window(1)
        if window is None:
            scan.skip("Financial FI_YEAR", "no Batch FirstDay/LastDay figures for batch 1")
        else:
            first, last = window[0].year, window[1].year
            scan.rule(
                "Financial FI_YEAR",
                sql.SQL("f.fi_year < {} OR f.fi_year > {}").format(sql.Literal(first), sql.Literal(last)),
                f"with an FI_YEAR outside Batch1's years {first}-{last}",
                ident,
            )
        scan.rule("Financial FI_QTR", "f.fi_qtr NOT IN (1, 2, 3, 4)", "with an FI_QTR not in (1, 2, 3, 4)", ident)
        scan.rule(
            "Financial FI_QTR_START_DATE",
            "f.fi_year <> extract(year FROM f.fi_qtr_start_date) "
            "OR extract(month FROM f.fi_qtr_start_date) <> (f.fi_qtr - 1) * 3 + 1 "
            "OR extract(day FROM f.fi_qtr_start_date) <> 1",
            "whose FI_QTR_START_DATE is not the first day of their quarter",
            _format("%s starts %s", ident, "f.fi_qtr_start_date"),
        )

        def off(numerator: str, denominator: str, reported: str) -> sql.Composable:
            return sql.SQL("round({} / nullif({}, 0), 2) - {} NOT BETWEEN -0.4 AND 0.4").format(
                sql.Identifier("f", numerator), sql.Identifier("f", denominator), sql.Identifier("f", reported)
            )

        scan.rule(
            "Financial EPS",
            sql.SQL(" OR ").join(
                (
                    off("fi_net_earn", "fi_out_basic", "fi_basic_eps"),
                    off("fi_net_earn", "fi_out_dilut", "fi_dilut_eps"),
                    off("fi_net_earn", "fi_revenue", "fi_margin"),
                )
            ),
            "whose EPS, diluted EPS or margin is more than 0.4 off the computed ratio",
            _format("%s eps %s dilut %s margin %s", ident, "f.fi_basic_eps", "f.fi_dilut_eps", "f.fi_margin"),
        )
        self.add(*scan.run())

    # -- FactMarketHistory
    def market_history(self) -> None:
        day = sql.Identifier("d", "datevalue")
        scan = _Scan(
            self.db,
            "factmarkethistory",
            "m",
            [
                Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = m.sk_dateid"),
                *(
                    Join(alias, table, _version_join(table, alias, sk, "m", day), ("d",))
                    for alias, table, sk in (
                        ("co", "dimcompany", "sk_companyid"),
                        ("se", "dimsecurity", "sk_securityid"),
                    )
                ),
            ],
        )
        self.message_increase_vs_figure("FactMarketHistory row count", "FactMarketHistory", "DM_RECORDS")
        self.batches_check(scan, "FactMarketHistory batches", self.batches)
        ident = "format('sk_securityid=%s on %s', m.sk_securityid, d.datevalue)"
        self.foreign_key(
            scan,
            "FactMarketHistory SK_CompanyID",
            "co",
            "sk_companyid",
            "without a DimCompany version valid on the day",
            ident,
        )
        self.foreign_key(
            scan,
            "FactMarketHistory SK_SecurityID",
            "se",
            "sk_securityid",
            "without a DimSecurity version valid on the day",
            ident,
        )
        for b in self.batches:
            window = self.figures.window(b)
            if window is None:
                scan.skip("FactMarketHistory SK_DateID", f"no Batch FirstDay/LastDay figures for batch {b}", b)
                continue
            low, high = window[0] - dt.timedelta(days=1), window[1]
            scan.rule(
                "FactMarketHistory SK_DateID",
                sql.SQL("m.batchid = {} AND (d.datevalue < {} OR d.datevalue >= {})").format(
                    sql.Literal(b), _date(low), _date(high)
                ),
                f"of batch {b} dated outside [{low}, {high}) (the script's window: FirstDay - 1 day to LastDay)",
                ident,
                b,
                ["d"],
            )
        scan.rule(
            "FactMarketHistory relative dates",
            "m.fiftytwoweeklow > m.daylow OR m.daylow > m.closeprice OR m.closeprice > m.dayhigh "
            "OR m.dayhigh > m.fiftytwoweekhigh",
            "not ordered 52-week low <= day low <= close <= day high <= 52-week high",
            "format('sk_securityid=%s sk_dateid=%s: %s <= %s <= %s <= %s <= %s', m.sk_securityid, m.sk_dateid, "
            "m.fiftytwoweeklow, m.daylow, m.closeprice, m.dayhigh, m.fiftytwoweekhigh)",
        )
        self.add(*scan.run())

    # -- FactHoldings
    def holdings(self) -> None:
        day = sql.Identifier("d", "datevalue")
        dimensions = [
            ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
            ("ac", "dimaccount", "sk_accountid", "DimAccount"),
            ("co", "dimcompany", "sk_companyid", "DimCompany"),
            ("se", "dimsecurity", "sk_securityid", "DimSecurity"),
        ]
        joins = [Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = h.sk_dateid")]
        for alias, table, sk, _ in dimensions:
            # The script only asks the version to be effective by the holding's day: the dimension may have
            # changed between the trade's creation and its completion.
            clause = _version_join(table, alias, sk, "h", day, valid_until=False)
            joins.append(Join(alias, table, clause, ("d",)))
        joins.append(
            Join(
                "tr",
                "dimtrade",
                "LEFT JOIN dw.dimtrade tr ON tr.tradeid = h.currenttradeid AND h.sk_dateid = tr.sk_closedateid "
                "AND h.sk_timeid = tr.sk_closetimeid",
            )
        )
        scan = _Scan(self.db, "factholdings", "h", joins)
        self.message_increase_vs_figure("FactHoldings row count", "FactHoldings", "HH_RECORDS")
        self.batches_check(scan, "FactHoldings batches", self.batches)
        ident = "format('currenttradeid=%s on %s', h.currenttradeid, d.datevalue)"
        for alias, _, sk, label in dimensions:
            self.foreign_key(
                scan,
                f"FactHoldings {_official_sk(sk)}",
                alias,
                sk,
                f"without a {label} version effective by the day",
                ident,
            )
        scan.rule(
            "FactHoldings CurrentTradeID",
            "tr.tradeid IS NULL",
            "whose CurrentTradeID is no DimTrade row closed on their SK_DateID and SK_TimeID",
            "format('currenttradeid=%s sk_dateid=%s sk_timeid=%s', h.currenttradeid, h.sk_dateid, h.sk_timeid)",
            joins=["tr"],
        )
        self.window_rules(
            scan,
            "FactHoldings SK_DateID",
            lambda b, first, last: sql.SQL("h.batchid = {} AND (d.datevalue < {} OR d.datevalue > {})").format(
                sql.Literal(b), _date(first), _date(last)
            ),
            "of the batch dated outside {window}",
            ident,
            ["d"],
        )
        self.add(*scan.run())

    # -- FactCashBalances
    def cash_balances(self) -> None:
        day = sql.Identifier("d", "datevalue")
        joins = [Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = f.sk_dateid")]
        dimensions = [
            ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
            ("ac", "dimaccount", "sk_accountid", "DimAccount"),
        ]
        for alias, table, sk, _ in dimensions:
            joins.append(Join(alias, table, _version_join(table, alias, sk, "f", day), ("d",)))
        scan = _Scan(self.db, "factcashbalances", "f", joins)
        self.batches_check(scan, "FactCashBalances batches", self.batches)
        ident = "format('sk_customerid=%s on %s', f.sk_customerid, d.datevalue)"
        for alias, _, sk, label in dimensions:
            self.foreign_key(
                scan,
                f"FactCashBalances {_official_sk(sk)}",
                alias,
                sk,
                f"without a {label} version valid on the day",
                ident,
            )
        self.window_rules(
            scan,
            "FactCashBalances SK_DateID",
            lambda b, first, last: sql.SQL("f.batchid = {} AND (d.datevalue < {} OR d.datevalue > {})").format(
                sql.Literal(b), _date(first), _date(last)
            ),
            "of the batch dated outside {window}",
            ident,
            ["d"],
        )
        self.add(*scan.run())

    # -- the batch validation query's row counts
    def batch_validation(self) -> None:
        if "dimessages" not in self.db.tables:
            for name in ("Batch row count", "Batch joined row count"):
                self.add(Check(name, FAILED, "table dw.dimessages does not exist"))
            return
        sources = sorted({s for (b, s, t, _) in self.validation_rows if b == 0 and t == ROW_COUNT})
        for source in sources:
            for b in self.batches:
                now, p1 = self.reported(b, source, ROW_COUNT)
                before, p2 = self.reported(b - 1, source, ROW_COUNT)
                name = f"Batch row count: {source}"
                if now is None or before is None:
                    self.add(Check(name, FAILED, p1 or p2, b))
                elif before > now:
                    self.add(Check(name, FAILED, f"row count decreased from {before} (batch {b - 1}) to {now}", b))
                else:
                    self.add(Check(name, OK, batch=b))
        joined = sorted({s for (_, s, t, _) in self.validation_rows if t == ROW_COUNT_JOINED} & set(sources))
        for source in joined:
            for b in self.batches:
                rows, p1 = self.reported(b, source, ROW_COUNT)
                matched, p2 = self.reported(b, source, ROW_COUNT_JOINED)
                name = f"Batch joined row count: {source}"
                if rows is None or matched is None:
                    self.add(Check(name, FAILED, p1 or p2, b))
                elif rows != matched:
                    detail = (
                        f"'Row count' is {rows} but '{ROW_COUNT_JOINED}' (rows joined to the dimensions) is {matched}"
                    )
                    self.add(Check(name, FAILED, detail, b))
                else:
                    self.add(Check(name, OK, batch=b))

    # -- the data visibility query's row counts
    def data_visibility(self) -> None:
        counts = [r for r in self.visibility if r[3] == ROW_COUNT]
        if not counts:
            reason = (
                "streamdi writes no Visibility_1/Visibility_2 messages (taking them would need the wall clock "
                "while a batch runs)"
            )
            self.add(
                Check("Data visibility row counts", NOT_CHECKED, reason),
                Check("Data visibility joined row counts", NOT_CHECKED, reason),
            )
            return

        def number(data: str | None) -> int | None:
            try:
                return int(str(data).strip())
            except ValueError:
                return None

        # rows: (batchid, type, source, text, data, time)
        for source in sorted({r[2] for r in counts}):
            mine = [r for r in counts if r[2] == source]
            regressions = sum(
                1
                for a in mine
                for b in mine
                if a[5] is not None and b[5] is not None and b[5] > a[5] and (number(a[4]) or 0) > (number(b[4]) or 0)
            )
            name = f"Data visibility row counts: {source}"
            detail = f"{regressions} later 'Row count' message(s) smaller than an earlier one"
            self.add(Check(name, FAILED if regressions else OK, detail if regressions else ""))
        joined = [r for r in self.visibility if r[1] == "Visibility_1" and r[3] == ROW_COUNT_JOINED]
        for source in sorted({r[2] for r in counts if r[1] == "Visibility_1"}):
            mismatches = sum(
                1
                for a in counts
                if a[1] == "Visibility_1" and a[2] == source
                for b in joined
                if b[2] == source and b[5] == a[5] and (number(a[4]) or 0) > (number(b[4]) or 0)
            )
            name = f"Data visibility joined row counts: {source}"
            detail = f"{mismatches} 'Row count' message(s) larger than the 'Row count joined' taken with them"
            self.add(Check(name, FAILED if mismatches else OK, detail if mismatches else ""))


def _official_sk(column: str) -> str:
    """The script's spelling of a surrogate key column: sk_customerid -> SK_CustomerID."""
    return "SK_" + column.removeprefix("sk_").capitalize().replace("id", "ID")


def nameplates() -> list[str]:
    """Every MarketingNameplate the script accepts: '' and each '+'-joined combination of the tags, in tag
    order."""
    return ["+".join(t for t, on in zip(NAMEPLATE_TAGS, mask, strict=True) if on) for mask in product((0, 1), repeat=6)]


# ------------------------------------------------------------------------------------------------ entry
def run_audit(ctx: JobContext, data_dir: Path | None = None) -> AuditReport:
    """Audit the PostgreSQL warehouse against the figures of `data_dir` (a TPC-DI data set directory), or
    against the staged figures when `data_dir` is None. Every check reads one snapshot as the read-only role;
    nothing is written. Raises ValueError when an audit file does not parse."""
    figures = read_figures(Path(data_dir)) if data_dir is not None else staged_figures(ctx)
    with ctx.warehouse.connect("reader") as conn:
        checks = _Audit(_Snapshot(conn), figures).run()
    return AuditReport(checks)
