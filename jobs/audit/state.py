"""One audit run's state and the checks shared by the tables: a batch window, "<table> batches", a foreign key, a
DImessages number against the figures.

The check modules (`messages`, `dimensions`, `customers`, `trade`, `facts`) are functions of an `AuditRun`: they read
its figures (`jobs.audit.figures`), scan its snapshot (`jobs.audit.scan`) and `add` their `Check`s to it;
`jobs.audit.run_audit` calls them in the script's order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from jobs.audit.figures import Expected, Figures, Term
from jobs.audit.report import FAILED, OK, Check
from jobs.audit.scan import Fragment, Scan, Snapshot, compare, format_sql, ints_sql
from streamdi.warehouse import sql

# The texts of the DImessages 'Validation' rows the checks compare with the figures.
ROW_COUNT = "Row count"
ROW_COUNT_JOINED = "Row count joined"


class AuditRun:
    """One audit run: the figures, the snapshot, the messages read from DImessages (`messages.read_messages`), and
    the checks so far, in the script's order."""

    def __init__(self, db: Snapshot, figures: Figures) -> None:
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

    def add(self, *checks: Check) -> None:
        self.checks.extend(checks)

    def expected(self, terms: Sequence[Term], batches: Sequence[int] | None = None) -> Expected:
        return self.figures.expected(terms, self.batches if batches is None else list(batches))

    def upto(self, batch: int) -> list[int]:
        return [b for b in self.batches if b <= batch]

    def window_rules(
        self,
        scan: Scan,
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

    def batches_check(self, scan: Scan, name: str, expected: Sequence[int]) -> None:
        """The official "<table> batches": the BatchID values of the scanned table are exactly `expected`."""
        if not self.batches:
            scan.skip(name, f"no audit figures {self.figures.where}: the batches are unknown")
            return
        wanted = list(expected)
        column = sql.Identifier(scan.alias, "batchid")
        aggregates: dict[str, Fragment] = {
            f"b{b}": sql.SQL("count(*) FILTER (WHERE {} = {})").format(column, sql.Literal(b)) for b in wanted
        }
        aggregates["other"] = sql.SQL("count(*) FILTER (WHERE {} <> ALL({}))").format(column, ints_sql(wanted))

        def judge(v: dict[str, Any]) -> Check:
            present = [b for b in wanted if v[f"b{b}"] > 0]
            if v["other"]:
                present += [
                    int(x)
                    for x in scan.db.strings(
                        sql.SQL(
                            "SELECT DISTINCT {column} FROM {source} WHERE {column} <> ALL({wanted}) ORDER BY 1 LIMIT 20"
                        ).format(column=column, source=scan.from_clause(()), wanted=ints_sql(wanted))
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
        return compare(name, value, op, self.expected(terms, self.upto(upto)), f"'{text}' of batch {upto}", batch)

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
            self.add(compare(name, now - before, "==", self.expected([Term(1, source, attribute)], [b]), what, b))

    def alerts_vs_figure(self, name: str, text: str, terms: Sequence[Term], per_batch: bool) -> None:
        if "dimessages" not in self.db.tables:
            for b in self.batches if per_batch else [None]:
                self.add(Check(name, FAILED, "table dw.dimessages does not exist", b))
            return
        if per_batch:
            for b in self.batches:
                found = self.alerts.get((b, text), 0)
                self.add(compare(name, found, "==", self.expected(terms, [b]), f"'{text}' alerts of batch {b}", b))
            return
        per = {b: n for (b, t), n in sorted(self.alerts.items()) if t == text}
        spread = f" ({', '.join(f'batch {b}: {n}' for b, n in per.items())})" if per else ""
        self.add(compare(name, sum(per.values()), "==", self.expected(terms), f"'{text}' alerts{spread}"))

    @staticmethod
    def value(column: str, alias: str = "v") -> sql.Composable:
        return sql.SQL("coalesce({}::text, 'NULL')").format(sql.Identifier(alias, column))

    def foreign_key(
        self, scan: Scan, name: str, alias: str, fk: str, what: str, ident: Fragment, batch: int | None = None
    ) -> None:
        """The official "<table> <SK>": every row joins a dimension row (`alias`, joined with the check's
        conditions); offending rows are quoted as `ident` -> fk."""
        example = format_sql(f"%s -> {fk}=%s", ident, sql.Identifier(scan.alias, fk))
        scan.rule(name, sql.SQL("{} IS NULL").format(sql.Identifier(alias, fk)), what, example, batch, [alias])


def official_sk(column: str) -> str:
    """The script's spelling of a surrogate key column: sk_customerid -> SK_CustomerID."""
    return "SK_" + column.removeprefix("sk_").capitalize().replace("id", "ID")
