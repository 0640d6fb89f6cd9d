"""The report's figures, derived from the gathered data without I/O: the grid of micro-batches x tables (the worst
action of each cell's latest attempt), the failure-rate trend per micro-batch and the headline summary.

Where it sits in `streamdi.report`: after `gather` (the lake read into `QualityData`), before `render` (HTML) and
`data_docs` (GX pages); `write_report` and the CLI's one line use `Summary`.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamdi.report.gather import CheckResult, QualityData

# Worst first: a cell shows the worst action of its checks. `overridden` (a halt check that failed after the
# operator resumed the batch) let rows through on a person's say-so, so it ranks above a plain warning; rows
# moved to quarantine and a halted table rank above it because data was actually held back.
SEVERITY: dict[str, int] = {"passed": 0, "warned": 1, "overridden": 2, "quarantined": 3, "halted": 4}
LABELS: dict[str, str] = {
    "passed": "pass",
    "warned": "warn",
    "overridden": "overridden",
    "quarantined": "quarantined",
    "halted": "HALTED",
}


@dataclass(frozen=True)
class Cell:
    """One (micro-batch, table): the checks of its latest attempt, their worst action and the failing ones."""

    batch_id: int
    table_name: str
    attempt: int
    checks: tuple[CheckResult, ...]
    earlier: tuple[tuple[int, str], ...] = ()  # (attempt, worst action) of the attempts before

    @property
    def worst(self) -> str:
        return max((c.action for c in self.checks), key=lambda a: SEVERITY.get(a, 1), default="passed")

    @property
    def failing(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.failed)


@dataclass(frozen=True)
class Grid:
    tables: tuple[str, ...]  # columns: staging tables first, then warehouse, then any other layer
    batch_ids: tuple[int, ...]  # rows: every micro-batch in the batch log or with results
    cells: dict[tuple[int, str], Cell]

    def row_worst(self, batch_id: int) -> str | None:
        actions = [c.worst for (b, _), c in self.cells.items() if b == batch_id]
        return max(actions, key=lambda a: SEVERITY.get(a, 1)) if actions else None


def table_order(name: str) -> tuple[int, str]:
    layer = name.split(".", 1)[0]
    return ({"staging": 0, "warehouse": 1}.get(layer, 2), name)


def build_grid(data: QualityData) -> Grid:
    """Cells of the latest attempt per (micro-batch, table); earlier attempts are kept as (attempt, worst)."""
    by_cell: dict[tuple[int, str], dict[int, list[CheckResult]]] = {}
    for r in data.results:
        by_cell.setdefault((r.batch_id, r.table_name), {}).setdefault(r.attempt, []).append(r)
    cells = {}
    for (b, table), attempts in by_cell.items():
        latest = max(attempts)
        earlier = tuple((a, Cell(b, table, a, tuple(attempts[a])).worst) for a in sorted(attempts) if a != latest)
        cells[(b, table)] = Cell(b, table, latest, tuple(attempts[latest]), earlier)
    tables = tuple(sorted({t for _, t in cells}, key=table_order))
    batch_ids = tuple(sorted({b.batch_id for b in data.batches} | {b for b, _ in cells}))
    return Grid(tables, batch_ids, cells)


@dataclass(frozen=True)
class BatchTrend:
    """Failure rates of a micro-batch's latest attempts: failed checks / checks, unexpected / values checked."""

    batch_id: int
    checks: int
    failed_checks: int
    values_checked: int  # sum of element_count over the checks
    unexpected: int  # sum of unexpected_count over the checks
    worst: str

    @property
    def check_rate(self) -> float:
        return self.failed_checks / self.checks if self.checks else 0.0

    @property
    def value_rate(self) -> float:
        return self.unexpected / self.values_checked if self.values_checked else 0.0


def trend(grid: Grid) -> list[BatchTrend]:
    out = []
    for b in grid.batch_ids:
        checks = [c for (cb, _), cell in grid.cells.items() if cb == b for c in cell.checks]
        if checks:
            out.append(
                BatchTrend(
                    batch_id=b,
                    checks=len(checks),
                    failed_checks=sum(1 for c in checks if c.failed),
                    values_checked=sum(c.element_count for c in checks),
                    unexpected=sum(c.unexpected_count for c in checks),
                    worst=grid.row_worst(b) or "passed",
                )
            )
    return out


@dataclass(frozen=True)
class Summary:
    """The headline figures (the page's first paragraph and the CLI's one line)."""

    batches: int
    batches_with_results: int
    tables: int
    actions: dict[str, int]  # cells per worst action
    halted: tuple[int, ...]
    skipped: tuple[int, ...]
    quarantined_rows: int

    def line(self) -> str:
        cells = ", ".join(f"{n} {LABELS[a]}" for a, n in sorted(self.actions.items(), key=lambda kv: SEVERITY[kv[0]]))
        text = (
            f"{self.batches} micro-batch(es), {self.batches_with_results} with results, {self.tables} table(s) "
            f"validated; cells: {cells or 'none'}; {self.quarantined_rows} row(s) in quarantine"
        )
        if self.halted:
            text += "; HALTED: " + ", ".join(f"micro-batch {b}" for b in self.halted)
        if self.skipped:
            text += "; skipped: " + ", ".join(str(b) for b in self.skipped)
        return text


def summarize(data: QualityData, grid: Grid | None = None) -> Summary:
    grid = grid or build_grid(data)
    actions: dict[str, int] = {}
    for cell in grid.cells.values():
        actions[cell.worst] = actions.get(cell.worst, 0) + 1
    return Summary(
        batches=len(grid.batch_ids),
        batches_with_results=len({b for b, _ in grid.cells}),
        tables=len(grid.tables),
        actions=actions,
        halted=tuple(b.batch_id for b in data.batches if b.halted_stage),
        skipped=tuple(b.batch_id for b in data.batches if b.state == "skipped"),
        quarantined_rows=sum(n for _, _, n in data.quarantined),
    )
