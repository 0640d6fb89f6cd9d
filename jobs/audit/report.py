"""The audit's results: one `Check` per result row of the official script, gathered in an `AuditReport`.

The last link of the audit (`jobs.audit`): the check modules (`messages`, `dimensions`, `customers`, `trade`,
`facts`) each add `Check`s, and `run_audit` returns them as an `AuditReport`, which the CLI (`streamdi audit`) prints
as a table and the Airflow task `audit` writes to `<STREAMDI_HOME>/reports/audit.txt` as text.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

OK = "ok"
FAILED = "failed"
SKIPPED = "skipped"
NOT_CHECKED = "not checked"


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
