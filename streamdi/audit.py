"""The TPC-DI automated audit (TPC-DI 1.1.0 automated audit script, `tpcdi_audit.sql`) for the tables streamdi builds.

`run_audit(ctx, data_dir=None)` checks the Delta warehouse (computed with Spark from `ctx.lake`) against the
generator's audit figures -- read from a data set directory (`DIR/BatchK/*_audit.csv`, `DIR/BatchK_audit.csv`)
when `data_dir` is given, else the figures staged from the landing zone (`staging.audit_figures`) -- and returns
an `AuditReport`: one `Check` per check and batch, `ok` overall, `table()`/`render()` for a rich table.

What is checked, per table (names follow the official script where it has the check):
- counts against the figures: DimBroker = HR_BROKERS; DimCompany <= FW_CMP; DimSecurity >= FW_SEC;
  Financial = FW_FIN; DimCustomer per batch >= C_NEW + C_INACT + C_UPDCUST - C_ID_HIST; DimAccount batch 1
  > C_NEW + CA_ADDACCT + CA_CLOSEACCT + CA_UPDACCT + C_UPDCUST + C_INACT - C_ID_HIST - CA_ID_HIST, later
  batches >= CA_ADDACCT + CA_CLOSEACCT + CA_UPDACCT - CA_ID_HIST; DimTrade rows = T_NEW of all batches,
  canceled = T_CanceledTrades; alert counts per batch: 'DOB out of range' = C_DOB_TO + C_DOB_TY,
  'Invalid customer tier' = C_TIER_INV, 'Invalid trade commission' = T_InvalidCommision,
  'Invalid trade fee' = T_InvalidCharge;
- SCD2 invariants of every SCD2 table (DimBroker, DimCompany, DimSecurity, DimCustomer, DimAccount): surrogate
  keys unique, end date = the next version's effective date (9999-12-31 for the last), no overlap, no two
  versions of a key starting the same day, no empty range, iscurrent <=> open end, exactly one current version
  per natural key, BatchID values, effective dates inside their batch's window;
- foreign keys resolving to a version valid at the right time: DimSecurity -> DimCompany and DimAccount ->
  DimCustomer/DimBroker (the parent version's range holds the child version's range), Financial -> DimCompany
  (any version), DimTrade -> DimSecurity/DimCompany/DimAccount/DimCustomer/DimBroker (a version valid on the
  trade's create date, end date inclusive as in the official script), DimTrade -> DimDate/DimTime; and a
  trade's company, customer and broker are those of its security and account versions;
- value domains (statuses, gender, exchange, issue, S&P rating, country, trade status and type, tax rates,
  TaxID/phone/email formats, Financial quarters and EPS) and trade dates inside the batch windows;
- DImessages: validation rows per batch (0..N) for the tables streamdi builds, PCR per batch, batch 0 all
  zero, row counts never decreasing, the last batch's counts equal to the tables, DimSecurity/DimCompany/
  Financial/DimTrade message counts against the figures (as the official script does), inactive customers.

Decisions where the official script is silent or does not fit:
- A figure of -1 (the generator did not count it) is "not checked": in a sum it is left out (the detail
  says so); a check that rests on it alone gets status "not checked", which does not fail the report.
- A check whose table does not exist, or whose figures are absent, is "skipped" with the reason; a skipped
  check makes the report not OK (nothing was shown to hold).
- Batch windows come from the `Batch` figures (FirstDay/LastDay); without them, from the staged BatchDate:
  batch 1 = [first DimDate day, BatchDate 1], batch k = [BatchDate k-1 + 1 day, BatchDate k].
- Gender NULL is a bad value (the spec maps anything but M/F to U). The official "DimCustomer LocalTaxRate"
  also asks for more than 300 distinct rates, which depends on the scale factor; only the join is checked.
  "DimCustomer demographic fields" needs Prospect, which streamdi does not build: not run.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from schemas import sources as src
from schemas import warehouse as wh
from schemas.audit import NOT_COUNTED
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.spark import literal_frame

OK = "ok"
FAILED = "failed"
SKIPPED = "skipped"
NOT_CHECKED = "not checked"

END_OF_TIME = dt.date(9999, 12, 31)
EXAMPLES = 3  # offending keys quoted in a detail


# ------------------------------------------------------------------------------------------------ report
@dataclass(frozen=True)
class Check:
    """One audit check: `status` is ok, failed, skipped or not checked; `detail` says what failed or why the
    check was skipped; `batch` is the TPC-DI batch for per-batch checks."""

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
        """True when no check failed or was skipped ("not checked" figures do not count against it)."""
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

        out = RichTable(title=f"TPC-DI audit: {'OK' if self.ok else 'NOT OK'}", show_lines=False)
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
@dataclass(frozen=True)
class Term:
    """One figure in a formula: `sign` * Value of (`dataset`, `attribute`) in the given batches."""

    sign: int
    dataset: str
    attribute: str


@dataclass(frozen=True)
class Expected:
    value: int | None  # None when a figure is absent
    missing: tuple[str, ...] = ()
    not_counted: tuple[str, ...] = ()
    counted: int = 0  # figures that went into `value`

    def note(self) -> str:
        if not self.not_counted:
            return ""
        return f" ({', '.join(self.not_counted)} not counted by the generator (-1), left out)"


class Figures:
    """The audit figures (rows of a parsed audit table), looked up by data set, attribute and batch."""

    def __init__(self, rows: Iterable[dict]) -> None:
        self.rows = list(rows)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Figures:
        return cls(table.to_pylist())

    def __bool__(self) -> bool:
        return bool(self.rows)

    @property
    def batches(self) -> tuple[int, ...]:
        """TPC-DI batches with figures (the Generator's parameters excluded)."""
        return tuple(sorted({r["batchid"] for r in self.rows if r["dataset"] != "Generator"}))

    def value(self, dataset: str, attribute: str, batch: int) -> int | None:
        """Sum of the figure over its files (FINWIRE has one file per quarter); NOT_COUNTED if any is -1;
        None if there is none."""
        values = [
            r["value"]
            for r in self.rows
            if r["dataset"] == dataset and r["attribute"] == attribute and r["batchid"] == batch
        ]
        values = [v for v in values if v is not None]
        if not values:
            return None
        if NOT_COUNTED in values:
            return NOT_COUNTED
        return sum(values)

    def day(self, attribute: str, batch: int) -> dt.date | None:
        for r in self.rows:
            if r["dataset"] == "Batch" and r["attribute"] == attribute and r["batchid"] == batch:
                return r["date"]
        return None

    def expected(self, terms: Sequence[Term], batches: Iterable[int]) -> Expected:
        """Value of a sum of figures over `batches`. A term is missing when no batch of `batches` has it (as in
        the official script's `sum(Value) ... BatchID <= b`, a source of Batch1 only adds nothing later)."""
        batches = list(batches)
        total, counted, missing, not_counted = 0, 0, [], []
        for t in terms:
            values = {b: self.value(t.dataset, t.attribute, b) for b in batches}
            found = {b: v for b, v in values.items() if v is not None}
            if not found:
                span = f" batch {batches[0]}" if len(batches) == 1 else f" batches {batches}" if batches else ""
                missing.append(f"{t.dataset}/{t.attribute}{span}")
            for b, v in found.items():
                if v == NOT_COUNTED:
                    not_counted.append(f"{t.dataset}/{t.attribute} batch {b}")
                else:
                    total += t.sign * v
                    counted += 1
        return Expected(None if missing else total, tuple(missing), tuple(not_counted), counted)


BatchWindow = tuple[dt.date | None, dt.date | None]  # (first day, last day) of a TPC-DI batch


# ------------------------------------------------------------------------------ pure DataFrame functions
SCD2_KINDS: tuple[tuple[str, str], ...] = (
    # (check suffix, what a violation is); the conditions are in `scd2_violations`
    ("distinct keys", "version(s) share a surrogate key"),
    ("EndDate", "version(s) whose end date is not the next version's effective date (or 9999-12-31 for the last)"),
    ("Overlap", "version(s) starting before the previous version ends"),
    ("same-day versions", "version(s) starting the same day as another version of the key"),
    ("consolidation", "version(s) ending on or before the day they start"),
    ("IsCurrent", "version(s) whose IsCurrent disagrees with an end date of 9999-12-31"),
    ("one current version", "key(s) without exactly one current version"),
)


def scd2_violations(df: DataFrame, natural: str, sk: str) -> DataFrame:
    """`kind, <natural>, <sk>, effectivedate` for every SCD2 invariant a version (or, for kind "one current
    version", a key's first version) breaks; `kind` is a suffix of `SCD2_KINDS`."""
    by_key = Window.partitionBy(natural).orderBy("effectivedate", sk)
    eot = F.lit(END_OF_TIME)
    v = df.select(
        natural,
        sk,
        "effectivedate",
        "enddate",
        "iscurrent",
        F.lead("effectivedate").over(by_key).alias("_next"),
        F.lag("effectivedate").over(by_key).alias("_prev_eff"),
        F.lag("enddate").over(by_key).alias("_prev_end"),
        F.row_number().over(by_key).alias("_n"),
        F.count(F.when(F.col("iscurrent"), 1)).over(Window.partitionBy(natural)).alias("_currents"),
        F.count(F.lit(1)).over(Window.partitionBy(sk)).alias("_sk_rows"),
    )
    conditions = {
        "distinct keys": F.col("_sk_rows") > 1,
        "EndDate": F.when(F.col("_next").isNull(), F.col("enddate") != eot).otherwise(
            F.col("enddate") != F.col("_next")
        ),
        "Overlap": F.col("_prev_end") > F.col("effectivedate"),
        "same-day versions": F.col("_prev_eff") == F.col("effectivedate"),
        "consolidation": F.col("enddate") <= F.col("effectivedate"),
        "IsCurrent": F.col("iscurrent") != (F.col("enddate") == eot),
        "one current version": (F.col("_n") == 1) & (F.col("_currents") != 1),
    }
    kinds = F.array_compact(F.array(*[F.when(cond, F.lit(kind)) for kind, cond in conditions.items()]))
    return v.select(F.explode(kinds).alias("kind"), natural, sk, "effectivedate")


def summarise(violations: DataFrame, group: str, example: Column) -> dict[str, tuple[int, list[str]]]:
    """{group value: (rows, up to EXAMPLES smallest example texts)} of a violations DataFrame (one Spark job)."""
    rows = (
        violations.groupBy(group)
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.slice(F.array_sort(F.collect_set(example.cast("string"))), 1, EXAMPLES).alias("examples"),
        )
        .collect()
    )
    return {r[group]: (r["n"], list(r["examples"])) for r in rows}


def fk_violations(
    child: DataFrame,
    child_id: Sequence[str],
    fk: str,
    parent: DataFrame,
    parent_sk: str,
    valid_from: Column | None = None,
    valid_to: Column | None = None,
) -> DataFrame:
    """Child rows whose `fk` does not resolve: `reason` ("NULL", "missing", "not valid"), the `child_id`
    columns and `fk`. With `valid_from`/`valid_to` (child columns), the parent version must also satisfy
    parent.effectivedate <= valid_from and valid_to <= parent.enddate; without them any row with the key does.
    """
    ids = list(child_id)
    ranged = valid_from is not None
    c = child.select(
        *ids,
        F.col(fk).alias("_fk"),
        *([valid_from.alias("_from"), valid_to.alias("_to")] if ranged else []),
    )
    p = parent.select(
        F.col(parent_sk).alias("_psk"),
        *([F.col("effectivedate").alias("_peff"), F.col("enddate").alias("_pend")] if ranged else []),
    )
    joined = c.join(p, c["_fk"] == p["_psk"], "left")
    valid = (F.col("_peff") <= F.col("_from")) & (F.col("_to") <= F.col("_pend")) if ranged else F.lit(True)
    per_child = joined.groupBy(*ids, "_fk").agg(
        F.count("_psk").alias("_found"),
        F.max(F.when(F.col("_psk").isNotNull(), F.coalesce(valid, F.lit(False)))).alias("_valid"),
    )
    reason = (
        F.when(F.col("_fk").isNull(), F.lit("NULL"))
        .when(F.col("_found") == 0, F.lit("missing"))
        .when(~F.col("_valid"), F.lit("not valid"))
    )
    key = [] if fk in ids else [F.col("_fk").alias(fk)]
    return per_child.select(reason.alias("reason"), *ids, *key).where(F.col("reason").isNotNull())


def out_of_window(
    df: DataFrame, day: Column, windows: DataFrame, lower: Column | None = None, also: Column | None = None
) -> DataFrame:
    """Rows of `df` (with `_day` = `day`) whose `day` is NULL or outside the window of their `batchid`
    (`windows`: batchid, firstday, lastday, batch1_firstday; a NULL bound is open). `lower` replaces the first
    day as lower bound (a Column over the window's and `df`'s columns); `also` flags further bad rows. Rows of
    a batch without a window are not returned."""
    joined = df.join(windows, "batchid", "inner").withColumn("_day", day)
    low = F.col("firstday") if lower is None else lower
    bad = F.coalesce((F.col("_day") < low) | (F.col("_day") > F.col("lastday")), F.lit(False)) | F.col("_day").isNull()
    if also is not None:
        bad = bad | F.coalesce(also, F.lit(False))
    return joined.where(bad).drop("firstday", "lastday", "batch1_firstday")


def null_or_not_in(column: str, values: Sequence[object]) -> Column:
    """Bad-row condition: the value is NULL or not one of `values`."""
    return ~F.coalesce(F.col(column).isin(*values), F.lit(False))


def set_and_not_in(column: str, values: Sequence[object]) -> Column:
    """Bad-row condition: the value is set and not one of `values` (NULL is allowed)."""
    return F.col(column).isNotNull() & ~F.col(column).isin(*values)


def badly_formatted(column: str, patterns: Sequence[str], *, empty_ok: bool = True) -> Column:
    """Bad-row condition: the value is set (and, with `empty_ok`, not empty) and matches none of the SQL LIKE
    `patterns`."""
    col = F.col(column)
    present = col.isNotNull() & (col != "") if empty_ok else col.isNotNull()
    return reduce(lambda acc, p: acc & ~col.like(p), patterns, present)


ACTIVE_INACTIVE = ("Active", "Inactive")
SP_RATINGS = tuple("AAA AA A BBB BB B CCC CC C D AA+ A+ BBB+ BB+ B+ CCC+ AA- A- BBB- BB- B- CCC-".split())
EXCHANGES = ("NYSE", "NASDAQ", "AMEX", "PCX")
ISSUES = ("COMMON", "PREF_A", "PREF_B", "PREF_C", "PREF_D")
COUNTRIES = ("Canada", "United States of America", "")
TRADE_STATUSES = ("Canceled", "Pending", "Submitted", "Active", "Completed")
TRADE_TYPES = ("Market Buy", "Market Sell", "Stop Loss", "Limit Sell", "Limit Buy")
PHONE_FORMATS = ("+1 (___) ___-____%", "(___) ___-____%", "___-____%")
EMAIL_FORMAT = ("_%.%@%.%",)
OFFICIAL_FK_NAMES = {
    "sk_brokerid": "SK_BrokerID",
    "sk_companyid": "SK_CompanyID",
    "sk_securityid": "SK_SecurityID",
    "sk_customerid": "SK_CustomerID",
    "sk_accountid": "SK_AccountID",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _examples(examples: Sequence[str], sep: str = ", ") -> str:
    return sep.join(str(e) for e in examples)


# ------------------------------------------------------------------------------------------------- audit
class _Audit:
    """The checks of one audit run; each table method adds its checks to `checks`."""

    def __init__(self, ctx: JobContext, figures: Figures, windows: dict[int, BatchWindow]) -> None:
        self.ctx = ctx
        self.figures = figures
        self.windows = windows
        self.batches = figures.batches  # TPC-DI batches audited (from the figures)
        self.checks: list[Check] = []
        self._frames: dict[str, DataFrame | None] = {}
        self._validation: dict[tuple[int, str, str], str | None] = {}  # (batch, source, text) -> data
        self._alerts: dict[tuple[int, str], int] = {}  # (batch, text) -> alerts

    # -- plumbing
    def frame(self, table: Table) -> DataFrame | None:
        """The table's rows, None when it does not exist (read once per run)."""
        if table.name not in self._frames:
            self._frames[table.name] = self.ctx.lake.read(table) if self.ctx.lake.exists(table) else None
        return self._frames[table.name]

    def add(self, name: str, ok: bool, detail: str = "", batch: int | None = None) -> None:
        self.checks.append(Check(name, OK if ok else FAILED, "" if ok else detail, batch))

    def skip(self, name: str, reason: str, batch: int | None = None) -> None:
        self.checks.append(Check(name, SKIPPED, reason, batch))

    def absent(self, table: Table, *names: str) -> bool:
        """True (after skipping `names`) when `table` does not exist."""
        if self.frame(table) is not None:
            return False
        for name in names:
            self.skip(name, f"table {table.qualified_name} does not exist")
        return True

    def compare(self, name: str, actual: int, op: str, expected: Expected, what: str, batch: int | None = None):
        """Check `actual <op> expected` (op: ==, >=, >, <=); skipped without figures, not checked when every
        figure is -1."""
        if expected.value is None:
            self.skip(name, f"no audit figure {', '.join(expected.missing)}", batch)
            return
        if expected.counted == 0 and expected.not_counted:
            self.checks.append(Check(name, NOT_CHECKED, f"{', '.join(expected.not_counted)} is -1", batch))
            return
        holds = {
            "==": actual == expected.value,
            ">=": actual >= expected.value,
            ">": actual > expected.value,
            "<=": actual <= expected.value,
        }[op]
        self.add(name, holds, f"{what} is {actual}, expected {op} {expected.value}{expected.note()}", batch)

    def count_bad(self, name: str, bad: DataFrame, example: Column, what: str, batch: int | None = None) -> None:
        """Check that `bad` (the offending rows) is empty; the detail quotes the smallest `example` values."""
        row = bad.agg(
            F.count(F.lit(1)).alias("n"),
            F.slice(F.array_sort(F.collect_set(example.cast("string"))), 1, EXAMPLES).alias("e"),
        ).first()
        self.add(name, row["n"] == 0, f"{_plural(row['n'], 'row')} {what}, e.g. {_examples(row['e'])}", batch)

    def domain(self, df: DataFrame, rules: Sequence[tuple[str, str, Column]]) -> None:
        """Value checks on one table in one Spark job: (check name, column quoted, condition of a bad row)."""
        aggs = []
        for i, (_, shown, bad) in enumerate(rules):
            value = F.coalesce(F.col(shown).cast("string"), F.lit("NULL"))
            aggs.append(F.count_if(bad).alias(f"n{i}"))
            aggs.append(F.slice(F.array_sort(F.collect_set(F.when(bad, value))), 1, EXAMPLES).alias(f"e{i}"))
        row = df.agg(*aggs).first()
        for i, (name, shown, _) in enumerate(rules):
            n = row[f"n{i}"]
            self.add(name, n == 0, f"{_plural(n, 'row')} with a bad {shown}, e.g. {_examples(row[f'e{i}'])}")

    def window_frame(self) -> DataFrame:
        first1 = self.windows.get(1, (None, None))[0]
        rows = [(b, first, last, first1) for b, (first, last) in sorted(self.windows.items())]
        return literal_frame(self.ctx.spark, rows, "batchid int, firstday date, lastday date, batch1_firstday date")

    def figure(self, terms: Sequence[Term], batches: Iterable[int] | None = None) -> Expected:
        return self.figures.expected(terms, self.batches if batches is None else batches)

    # -- generic checks
    def row_count(self, label: str, table: Table, op: str, terms: Sequence[Term]) -> None:
        """The table's row count against the sum of `terms` over all batches."""
        if not self.absent(table, f"{label} row count"):
            self.compare(f"{label} row count", self.frame(table).count(), op, self.figure(terms), "row count")

    def batch_row_counts(self, label: str, table: Table, rule: Callable[[int], tuple[str, list[Term]]]) -> None:
        """Rows of each batch (`batchid`) against that batch's figures; `rule(batch)` gives (op, terms)."""
        if self.absent(table, f"{label} row count"):
            return
        counts = {r["batchid"]: r["count"] for r in self.frame(table).groupBy("batchid").count().collect()}
        for b in self.batches:
            op, terms = rule(b)
            self.compare(f"{label} row count", counts.get(b, 0), op, self.figure(terms, [b]), f"rows of batch {b}", b)

    def scd2(self, label: str, table: Table, natural: str, batches: Sequence[int]) -> None:
        """SCD2 invariants, BatchID values and effective dates of one SCD2 table."""
        names = [f"{label} {suffix}" for suffix, _ in SCD2_KINDS]
        if self.absent(table, *names, f"{label} batches", f"{label} EffectiveDate"):
            return
        df = self.frame(table)
        found = summarise(scd2_violations(df, natural, table.key[0]), "kind", F.col(natural))
        for suffix, what in SCD2_KINDS:
            n, examples = found.get(suffix, (0, []))
            shown = ", ".join(f"{natural}={e}" for e in examples)
            self.add(f"{label} {suffix}", n == 0, f"{n} {what}, e.g. {shown}")
        present = sorted(r["batchid"] for r in df.select("batchid").distinct().collect())
        wanted = sorted(batches)
        self.add(f"{label} batches", present == wanted, f"BatchID values are {present}, expected {wanted}")
        self.dates_in_windows(f"{label} EffectiveDate", df, F.col("effectivedate"), natural, "version")

    def dates_in_windows(
        self,
        name: str,
        df: DataFrame,
        day: Column,
        ident: str,
        noun: str,
        lower: Column | None = None,
        also: Column | None = None,
    ) -> None:
        """Per batch: every row's `day` lies in its batch's window (see `out_of_window`)."""
        if not self.windows:
            self.skip(name, "no batch windows (no Batch figures, no staged BatchDate)")
            return
        bad = out_of_window(df, day, self.window_frame(), lower, also)
        example = F.concat_ws(" ", F.col(ident).cast("string"), F.coalesce(F.col("_day").cast("string"), F.lit("NULL")))
        found = summarise(bad, "batchid", example)
        present = {r["batchid"] for r in df.select("batchid").distinct().collect()}
        for b in sorted(present | set(self.windows)):
            if b not in self.windows:
                self.skip(name, f"no window for batch {b}", b)
                continue
            n, examples = found.get(b, (0, []))
            first, last = self.windows[b]
            detail = f"{_plural(n, noun)} outside [{first}, {last}], e.g. {ident} day: {_examples(examples, '; ')}"
            self.add(name, n == 0, detail, b)

    def foreign_key(
        self,
        name: str,
        child: DataFrame,
        child_id: Sequence[str],
        fk: str,
        parent_table: Table,
        valid_from: Column | None = None,
        valid_to: Column | None = None,
        parent_sk: str | None = None,
    ) -> None:
        """Every child row's `fk` resolves to a `parent_table` row (valid over [valid_from, valid_to])."""
        if self.absent(parent_table, name):
            return
        parent = self.frame(parent_table)
        bad = fk_violations(child, child_id, fk, parent, parent_sk or fk, valid_from, valid_to)
        ident = F.concat_ws(" ", *[F.concat(F.lit(f"{c}="), F.col(c).cast("string")) for c in child_id])
        example = F.concat(ident, F.lit(f" -> {fk}="), F.coalesce(F.col(fk).cast("string"), F.lit("NULL")))
        found = summarise(bad, "reason", example)
        texts = {
            "NULL": "NULL",
            "missing": f"no {parent_table.name} row",
            "not valid": f"a {parent_table.name} version not valid at the date",
        }
        parts = [f"{found[r][0]} with {texts[r]} (e.g. {_examples(found[r][1], '; ')})" for r in texts if r in found]
        total = sum(n for n, _ in found.values())
        self.add(name, total == 0, f"{total} unresolved: {', '.join(parts)}")

    # -- DImessages
    def messages(self) -> None:
        """The validation rows and phase complete records of every batch (0..N)."""
        from jobs.messages import INITIAL_BATCH, PCR, ROW_COUNT, VALIDATED_TABLES, VALIDATION, VALIDATION_MESSAGES

        label = "DImessages"
        names = [f"{label} {n}" for n in ("validation reports", "batches", "Phase complete records")]
        names += [f"{label} initial condition", f"{label} row counts"]
        if self.absent(wh.DI_MESSAGES, *names):
            return
        if not self.batches:
            for n in names:
                self.skip(n, "no audit figures: the batches are unknown")
            return
        df = self.frame(wh.DI_MESSAGES)
        rows = (
            df.where(F.col("messagetype").isin(VALIDATION, PCR))
            .select("batchid", "messagesource", "messagetext", "messagetype", "messagedata")
            .collect()
        )
        alerts = df.where(F.col("messagetype") == "Alert").groupBy("batchid", "messagetext").count().collect()
        self._alerts = {(r["batchid"], r["messagetext"]): r["count"] for r in alerts}
        validation = [r for r in rows if r["messagetype"] == VALIDATION]
        self._validation = {(r["batchid"], r["messagesource"], r["messagetext"]): r["messagedata"] for r in validation}
        wanted = [INITIAL_BATCH, *self.batches]
        for b in wanted:
            got = [(r["messagesource"], r["messagetext"]) for r in validation if r["batchid"] == b]
            missing, extra = sorted(set(VALIDATION_MESSAGES) - set(got)), sorted(set(got) - set(VALIDATION_MESSAGES))
            detail = f"missing {missing}, unexpected {extra}"
            self.add(f"{label} validation reports", not missing and not extra, detail, b)
        present = sorted(r["batchid"] for r in df.select("batchid").distinct().collect())
        self.add(f"{label} batches", present == wanted, f"BatchID values are {present}, expected {wanted}")
        pcr = sorted(r["batchid"] for r in rows if r["messagetype"] == PCR)
        self.add(f"{label} Phase complete records", pcr == wanted, f"PCR rows for batches {pcr}, expected {wanted}")
        nonzero = sorted(
            r["messagesource"] for r in validation if r["batchid"] == INITIAL_BATCH and r["messagedata"] != "0"
        )
        self.add(f"{label} initial condition", not nonzero, f"batch 0 reports rows in {nonzero}")
        last = self.batches[-1]
        wrong = []
        for source, table in VALIDATED_TABLES:
            actual = 0 if self.frame(table) is None else self.frame(table).count()
            reported = self._validation.get((last, source, ROW_COUNT))
            if reported != str(actual):
                wrong.append(f"{source} reports {reported}, the table has {actual}")
        self.add(f"{label} row counts", not wrong, "; ".join(wrong), last)
        for source, _ in VALIDATED_TABLES:  # official "Batch row count": counts never decrease
            series = [(b, self._validation.get((b, source, ROW_COUNT))) for b in wanted]
            drops = [
                f"batch {b0}: {n0} -> batch {b1}: {n1}"
                for (b0, n0), (b1, n1) in zip(series, series[1:], strict=False)
                if n0 is not None and n1 is not None and int(n1) < int(n0)
            ]
            self.add(f"Batch row count: {source}", not drops, f"row count decreased: {', '.join(drops)}")

    def message_vs_figure(
        self, name: str, source: str, text: str, op: str, terms: Sequence[Term], batches: Sequence[int]
    ) -> None:
        """A validation message of each batch against the figures of the batches up to it (official checks)."""
        for b in batches:
            if self.frame(wh.DI_MESSAGES) is None:
                self.skip(name, f"table {wh.DI_MESSAGES.qualified_name} does not exist", b)
                continue
            reported = self._validation.get((b, source, text))
            if reported is None:
                self.add(name, False, f"no '{text}' validation message for {source}", b)
                continue
            upto = [x for x in self.batches if x <= b]
            self.compare(name, int(reported), op, self.figure(terms, upto), f"{source} '{text}' message", b)

    def alerts_vs_figure(self, name: str, text: str, terms: Sequence[Term]) -> None:
        """Alerts of each batch against that batch's figures."""
        for b in self.batches:
            if self.frame(wh.DI_MESSAGES) is None:
                self.skip(name, f"table {wh.DI_MESSAGES.qualified_name} does not exist", b)
                continue
            actual = self._alerts.get((b, text), 0)
            self.compare(name, actual, "==", self.figure(terms, [b]), f"count of '{text}' alerts", b)

    # -- tables
    def broker(self) -> None:
        label = "DimBroker"
        self.row_count(label, wh.DIM_BROKER, "==", [Term(1, label, "HR_BROKERS")])
        checks = [f"{label} {n}" for n in ("BatchID", "all current", "Batch1 first day", "end of time")]
        if not self.absent(wh.DIM_BROKER, *checks):
            df = self.frame(wh.DIM_BROKER)
            first = self.windows.get(1, (None, None))[0]
            rules = [
                (checks[0], "batchid", F.col("batchid") != 1),
                (checks[1], "iscurrent", ~F.col("iscurrent")),
                (checks[3], "enddate", F.col("enddate") != F.lit(END_OF_TIME)),
            ]
            if first is None:
                self.skip(checks[2], "no first day of batch 1 (no Batch figure, no DimDate)")
            else:  # the official script: every broker is effective from Batch1's first day
                rules.append((checks[2], "effectivedate", F.col("effectivedate") != F.lit(first)))
            self.domain(df, rules)
        self.scd2(label, wh.DIM_BROKER, "brokerid", [1])

    def company(self) -> None:
        label = "DimCompany"
        terms = [Term(1, label, "FW_CMP")]
        self.row_count(label, wh.DIM_COMPANY, "<=", terms)
        self.message_vs_figure(f"{label} row count message", label, ROW_COUNT_TEXT, "<=", terms, self.batches)
        self.scd2(label, wh.DIM_COMPANY, "companyid", [1])
        names = [f"{label} {n}" for n in ("Status", "SPrating", "Country", "distinct names", "Industry")]
        if self.absent(wh.DIM_COMPANY, *names):
            return
        df = self.frame(wh.DIM_COMPANY)
        self.domain(
            df,
            [
                (names[0], "status", null_or_not_in("status", ACTIVE_INACTIVE)),
                (names[1], "sprating", set_and_not_in("sprating", SP_RATINGS)),
                (names[2], "country", set_and_not_in("country", COUNTRIES)),
            ],
        )
        shared = df.groupBy("name").agg(F.countDistinct("companyid").alias("n")).where(F.col("n") > 1)
        self.count_bad(names[3], shared, F.col("name"), "naming several companies")
        if not self.absent(wh.INDUSTRY, names[4]):
            industries = self.frame(wh.INDUSTRY).select(F.col("in_name").alias("industry")).distinct()
            self.count_bad(
                names[4], df.join(industries, "industry", "left_anti"), F.col("industry"), "with an unknown industry"
            )

    def security(self) -> None:
        label = "DimSecurity"
        terms = [Term(1, label, "FW_SEC")]
        self.row_count(label, wh.DIM_SECURITY, ">=", terms)
        self.message_vs_figure(f"{label} row count message", label, ROW_COUNT_TEXT, ">=", terms, self.batches[:1])
        self.scd2(label, wh.DIM_SECURITY, "symbol", [1])
        names = [f"{label} {n}" for n in ("Status", "ExchangeID", "Issue", "SK_CompanyID")]
        if self.absent(wh.DIM_SECURITY, *names):
            return
        df = self.frame(wh.DIM_SECURITY)
        self.domain(
            df,
            [
                (names[0], "status", null_or_not_in("status", ACTIVE_INACTIVE)),
                (names[1], "exchangeid", null_or_not_in("exchangeid", EXCHANGES)),
                (names[2], "issue", null_or_not_in("issue", ISSUES)),
            ],
        )
        period = (F.col("effectivedate"), F.col("enddate"))
        self.foreign_key(names[3], df, ["sk_securityid"], "sk_companyid", wh.DIM_COMPANY, *period)

    def financial(self) -> None:
        label = "Financial"
        terms = [Term(1, label, "FW_FIN")]
        self.row_count(label, wh.FINANCIAL, "==", terms)
        self.message_vs_figure(f"{label} row count message", label, ROW_COUNT_TEXT, "==", terms, self.batches[:1])
        names = [f"{label} {n}" for n in ("SK_CompanyID", "FI_YEAR", "FI_QTR", "FI_QTR_START_DATE", "EPS")]
        if self.absent(wh.FINANCIAL, *names):
            return
        df = self.frame(wh.FINANCIAL)
        self.foreign_key(names[0], df, ["sk_companyid", "fi_year", "fi_qtr"], "sk_companyid", wh.DIM_COMPANY)
        start = F.col("fi_qtr_start_date")

        def off(numerator: str, denominator: str, reported: str) -> Column:
            ratio = F.round(F.try_divide(F.col(numerator), F.col(denominator)), 2)
            return ~F.coalesce(F.abs(ratio - F.col(reported)) <= 0.4, F.lit(True))

        rules = [
            (names[2], "fi_qtr", null_or_not_in("fi_qtr", (1, 2, 3, 4))),
            (
                names[3],
                "fi_qtr_start_date",
                (F.year(start) != F.col("fi_year"))
                | (F.month(start) != (F.col("fi_qtr") - 1) * 3 + 1)
                | (F.dayofmonth(start) != 1),
            ),
            (
                names[4],
                "sk_companyid",
                off("fi_net_earn", "fi_out_basic", "fi_basic_eps")
                | off("fi_net_earn", "fi_out_dilut", "fi_dilut_eps")
                | off("fi_net_earn", "fi_revenue", "fi_margin"),
            ),
        ]
        first, last = self.windows.get(1, (None, None))
        if first is None or last is None:
            self.skip(names[1], "no window for batch 1")
        else:  # every year within Batch1's window
            rules.append((names[1], "fi_year", (F.col("fi_year") < first.year) | (F.col("fi_year") > last.year)))
        self.domain(df, rules)

    def customer(self) -> None:
        label = "DimCustomer"
        terms = [Term(1, label, "C_NEW"), Term(1, label, "C_INACT"), Term(1, label, "C_UPDCUST")]
        self.batch_row_counts(label, wh.DIM_CUSTOMER, lambda b: (">=", [*terms, Term(-1, label, "C_ID_HIST")]))
        self.scd2(label, wh.DIM_CUSTOMER, "customerid", self.batches or (1,))
        inactive = [Term(1, label, "C_INACT")]
        self.message_vs_figure(f"{label} inactive customers", label, "Inactive customers", "==", inactive, self.batches)
        dob = [Term(1, label, "C_DOB_TO"), Term(1, label, "C_DOB_TY")]
        self.alerts_vs_figure(f"{label} age range alerts", "DOB out of range", dob)
        self.alerts_vs_figure(f"{label} customer tier alerts", "Invalid customer tier", [Term(1, label, "C_TIER_INV")])
        values = ["Status", "Gender", "TaxID", "Phone1", "Phone2", "Phone3", "Email1", "Email2"]
        names = [f"{label} {n}" for n in values] + [f"{label} LocalTaxRate", f"{label} NationalTaxRate"]
        if self.absent(wh.DIM_CUSTOMER, *names):
            return
        df = self.frame(wh.DIM_CUSTOMER)
        self.domain(
            df,
            [
                (names[0], "status", null_or_not_in("status", ACTIVE_INACTIVE)),
                (names[1], "gender", null_or_not_in("gender", ("M", "F", "U"))),
                (names[2], "taxid", ~F.coalesce(F.col("taxid").like("___-__-____"), F.lit(False))),
                *[(names[2 + i], f"phone{i}", badly_formatted(f"phone{i}", PHONE_FORMATS)) for i in (1, 2, 3)],
                (names[6], "email1", badly_formatted("email1", EMAIL_FORMAT, empty_ok=False)),
                (names[7], "email2", badly_formatted("email2", EMAIL_FORMAT)),
            ],
        )
        for name, kind in zip(names[8:], ("local", "national"), strict=True):
            if self.absent(wh.TAX_RATE, name):
                continue
            desc, rate = f"{kind}taxratedesc", f"{kind}taxrate"
            rates = self.frame(wh.TAX_RATE).select(
                F.col("tx_name").alias(desc), F.col("tx_rate").cast(wh.DIM_CUSTOMER.column(rate).type).alias(rate)
            )
            bad = df.join(rates, [desc, rate], "left_anti")
            example = F.concat_ws(" ", F.col("sk_customerid").cast("string"), F.coalesce(F.col(desc), F.lit("NULL")))
            self.count_bad(name, bad, example, f"whose {desc}/{rate} is not a TaxRate row (sk_customerid desc)")

    def account(self) -> None:
        label = "DimAccount"

        def rule(b: int) -> tuple[str, list[Term]]:
            # the official script: more rows than the figures in Batch1, at least as many in later batches
            account = [Term(1, label, a) for a in ("CA_ADDACCT", "CA_CLOSEACCT", "CA_UPDACCT")]
            account.append(Term(-1, label, "CA_ID_HIST"))
            if b != 1:
                return ">=", account
            customer = [Term(1, "DimCustomer", a) for a in ("C_NEW", "C_UPDCUST", "C_INACT")]
            return ">", [*customer, Term(-1, "DimCustomer", "C_ID_HIST"), *account]

        self.batch_row_counts(label, wh.DIM_ACCOUNT, rule)
        self.scd2(label, wh.DIM_ACCOUNT, "accountid", self.batches or (1,))
        names = [f"{label} {n}" for n in ("Status", "TaxStatus", "SK_CustomerID", "SK_BrokerID", "inactive customers")]
        if self.absent(wh.DIM_ACCOUNT, *names):
            return
        df = self.frame(wh.DIM_ACCOUNT)
        self.domain(
            df,
            [
                (names[0], "status", null_or_not_in("status", ACTIVE_INACTIVE)),
                (names[1], "taxstatus", (F.col("batchid") == 1) & null_or_not_in("taxstatus", (0, 1, 2))),
            ],
        )
        period = (F.col("effectivedate"), F.col("enddate"))
        self.foreign_key(names[2], df, ["sk_accountid"], "sk_customerid", wh.DIM_CUSTOMER, *period)
        self.foreign_key(names[3], df, ["sk_accountid"], "sk_brokerid", wh.DIM_BROKER, *period)
        if not self.absent(wh.DIM_CUSTOMER, names[4]):
            inactive = self.frame(wh.DIM_CUSTOMER).where(F.col("status") == "Inactive").select("sk_customerid")
            active = df.where(F.col("status") != "Inactive").join(inactive, "sk_customerid", "left_semi")
            self.count_bad(names[4], active, F.col("accountid"), "active for an inactive customer version (accountid)")

    def trade(self) -> None:
        label = "DimTrade"
        self.message_vs_figure(
            f"{label} row count", label, ROW_COUNT_TEXT, "==", [Term(1, label, "T_NEW")], self.batches
        )
        self.alerts_vs_figure(
            f"{label} commission alerts", "Invalid trade commission", [Term(1, label, "T_InvalidCommision")]
        )
        self.alerts_vs_figure(f"{label} charge alerts", "Invalid trade fee", [Term(1, label, "T_InvalidCharge")])
        fks = [f"{label} {OFFICIAL_FK_NAMES[fk]}" for fk, _ in TRADE_KEYS]
        dates = [f"{label} {n}" for n in ("SK_CreateDateID", "SK_CloseDateID", "SK_CreateTimeID", "SK_CloseTimeID")]
        names = [
            f"{label} {n}" for n in ("table row count", "canceled trades", "batches", "distinct keys", "Status", "Type")
        ]
        consistency = [f"{label} {OFFICIAL_FK_NAMES[c]} matches {p.name}" for p, _, c in TRADE_CONSISTENCY]
        if self.absent(wh.DIM_TRADE, *names, *fks, *dates, f"{label} date check", *consistency):
            return
        df = self.frame(wh.DIM_TRADE)
        summary = df.agg(
            F.count(F.lit(1)).alias("rows"),
            F.countDistinct("tradeid").alias("ids"),
            F.count_if(F.col("status") == "Canceled").alias("canceled"),
            F.array_sort(F.collect_set("batchid")).alias("batches"),
        ).first()
        self.compare(names[0], summary["rows"], "==", self.figure([Term(1, label, "T_NEW")]), "row count")
        canceled = self.figure([Term(1, label, "T_CanceledTrades")])
        self.compare(names[1], summary["canceled"], "==", canceled, "canceled trades")
        present, wanted = list(summary["batches"]), list(self.batches)
        self.add(names[2], present == wanted, f"BatchID values are {present}, expected {wanted}")
        self.add(names[3], summary["ids"] == summary["rows"], f"{summary['rows'] - summary['ids']} duplicated TradeIDs")
        self.domain(
            df,
            [
                (names[4], "status", null_or_not_in("status", TRADE_STATUSES)),
                (names[5], "type", null_or_not_in("type", TRADE_TYPES)),
            ],
        )
        self.trade_references(df, fks, dates)
        self.trade_consistency(df, consistency)

    def trade_references(self, df: DataFrame, fks: list[str], dates: list[str]) -> None:
        """DimTrade -> DimDate/DimTime, the dimensions (valid on the create date), and the date windows."""
        ids = ["tradeid"]
        if not self.absent(wh.DIM_TIME, *dates[2:]):
            self.foreign_key(dates[2], df, ids, "sk_createtimeid", wh.DIM_TIME, parent_sk="sk_timeid")
            closed = df.where(F.col("sk_closetimeid").isNotNull())
            self.foreign_key(dates[3], closed, ids, "sk_closetimeid", wh.DIM_TIME, parent_sk="sk_timeid")
        if self.absent(wh.DIM_DATE, *dates[:2], *fks, "DimTrade date check"):
            return
        days = self.frame(wh.DIM_DATE).select("sk_dateid", "datevalue")
        trades = (
            df.join(days.toDF("sk_createdateid", "_create"), "sk_createdateid", "left")
            .join(days.toDF("sk_closedateid", "_close"), "sk_closedateid", "left")
            .cache()
        )
        try:
            self.foreign_key(dates[0], trades, ids, "sk_createdateid", wh.DIM_DATE, parent_sk="sk_dateid")
            closed = trades.where(F.col("sk_closedateid").isNotNull())
            self.foreign_key(dates[1], closed, ids, "sk_closedateid", wh.DIM_DATE, parent_sk="sk_dateid")
            dated = trades.where(F.col("_create").isNotNull())  # the others are reported by SK_CreateDateID
            day = F.col("_create")
            for name, (fk, parent) in zip(fks, TRADE_KEYS, strict=True):
                self.foreign_key(name, dated, ids, fk, parent, day, day)
            open_ = F.col("sk_closedateid").isNull()
            # an open trade is dated by its creation, a closed one by its close; limit orders may have been
            # placed before their batch, but not before Batch1 (official "DimTrade date check")
            day = F.when(open_, F.col("_create")).otherwise(F.col("_close"))
            lower = F.when(open_ & F.col("type").like("Limit%"), F.col("batch1_firstday")).otherwise(F.col("firstday"))
            closed_early = F.col("sk_closedateid") < F.col("sk_createdateid")
            self.dates_in_windows("DimTrade date check", trades, day, "tradeid", "trade", lower, closed_early)
        finally:
            trades.unpersist()

    def trade_consistency(self, df: DataFrame, names: list[str]) -> None:
        """A trade's company is its security version's; its customer and broker are its account version's."""
        for name, (parent_table, sk, col) in zip(names, TRADE_CONSISTENCY, strict=True):
            if self.absent(parent_table, name):
                continue
            parent = self.frame(parent_table).select(F.col(sk), F.col(col).alias("_parent"))
            bad = df.join(parent, sk, "inner").where(~F.col(col).eqNullSafe(F.col("_parent")))
            self.count_bad(
                name, bad, F.col("tradeid"), f"whose {col} is not its {parent_table.name} version's (tradeid)"
            )


ROW_COUNT_TEXT = "Row count"
TRADE_KEYS: tuple[tuple[str, Table], ...] = (
    ("sk_brokerid", wh.DIM_BROKER),
    ("sk_companyid", wh.DIM_COMPANY),
    ("sk_securityid", wh.DIM_SECURITY),
    ("sk_customerid", wh.DIM_CUSTOMER),
    ("sk_accountid", wh.DIM_ACCOUNT),
)
TRADE_CONSISTENCY: tuple[tuple[Table, str, str], ...] = (
    (wh.DIM_SECURITY, "sk_securityid", "sk_companyid"),
    (wh.DIM_ACCOUNT, "sk_accountid", "sk_customerid"),
    (wh.DIM_ACCOUNT, "sk_accountid", "sk_brokerid"),
)


# ------------------------------------------------------------------------------------------------ entry
def batch_windows(
    figures: Figures, batch_dates: dict[int, dt.date], first_day: dt.date | None
) -> dict[int, BatchWindow]:
    """(first day, last day) per TPC-DI batch: the Batch figures (FirstDay, LastDay) where present, else from
    the BatchDates: batch 1 from `first_day` (the first DimDate day), batch k from the day after BatchDate k-1;
    the last day is the batch's BatchDate."""
    windows: dict[int, BatchWindow] = {}
    for b in sorted(set(figures.batches) | set(batch_dates)):
        first, last = figures.day("FirstDay", b), figures.day("LastDay", b)
        if last is None:
            last = batch_dates.get(b)
        if first is None:
            previous = batch_dates.get(b - 1)
            first = first_day if b == 1 else (previous + dt.timedelta(days=1) if previous else None)
        if first is not None or last is not None:
            windows[b] = (first, last)
    return windows


def staged_batch_dates(ctx: JobContext) -> dict[int, dt.date]:
    """BatchDate per TPC-DI batch from `staging.batchdate` (a redelivered date: the latest wins, as in
    `jobs.scope`)."""
    table = src.BATCH_DATE.staging
    if not ctx.lake.exists(table):
        return {}
    dates: dict[int, dt.date] = {}
    for r in sorted(
        ctx.lake.read_arrow(table).to_pylist(), key=lambda r: (r["batch_id"], r["source_file"], r["line_no"])
    ):
        dates[r["source_batch"]] = r["batchdate"]
    return dates


def run_audit(ctx: JobContext, data_dir: Path | None = None) -> AuditReport:
    """Audit the warehouse against the figures of `data_dir` (a TPC-DI data set directory), or against the
    staged figures when `data_dir` is None."""
    from jobs import audit_figures

    table = audit_figures.read_dir(Path(data_dir)) if data_dir is not None else audit_figures.staged_figures(ctx)
    figures = Figures.from_arrow(table)
    first_day = None
    if ctx.lake.exists(wh.DIM_DATE):
        first_day = ctx.lake.read(wh.DIM_DATE).agg(F.min("datevalue")).first()[0]
    audit = _Audit(ctx, figures, batch_windows(figures, staged_batch_dates(ctx), first_day))
    where = f"in {data_dir}" if data_dir is not None else "staged (staging.audit_figures)"
    if not figures:
        audit.skip("Audit table batches", f"no audit figures {where}")
    else:
        wanted = list(range(1, max(figures.batches) + 1))
        audit.add(
            "Audit table batches", list(figures.batches) == wanted, f"figures for batches {list(figures.batches)}"
        )
    audit.messages()
    audit.broker()
    audit.company()
    audit.security()
    audit.financial()
    audit.customer()
    audit.account()
    audit.trade()
    return AuditReport(audit.checks)
