"""HTML of the report pages, from Jinja2 templates (`streamdi/report/templates/`, autoescaped): the second half of
`streamdi.report`.

Where it sits: `gather` has read the lake into `QualityData` and `figures` derived the grid, the trend and the
summary; here they become the summary page (`render_summary`, `index.html` of the report folder), with the charts
from `streamdi.report.charts` inlined. The live-windows page (`streamdi.report.windows`), the batch-log page
(`render_batch_log`, written by `streamdi.run.orchestration`) and the Airflow plugin's placeholder
(`render_placeholder`) use the same environment. No I/O besides loading the templates; every value is escaped by
the template, and only the charts' SVG (built by matplotlib, its text escaped by ElementTree) is passed as markup.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass

import jinja2
from markupsafe import Markup

from streamdi.batchlog import HALTED, STAGES, operator_commands, percentile
from streamdi.report.charts import trend_bars
from streamdi.report.data_docs import DATA_DOCS
from streamdi.report.figures import LABELS, SEVERITY, Cell, Grid, build_grid, summarize, table_order, trend
from streamdi.report.gather import QualityData

ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("streamdi.report", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["thousands"] = lambda n: f"{n:,}"
ENV.filters["label"] = lambda action: LABELS.get(action, action)

LATENCY_ROWS = 20  # the latest micro-batches listed in the latency section
TREND_PANELS = (
    ("failed checks / checks", lambda p: p.check_rate, lambda p: f"{p.failed_checks} of {p.checks} checks"),
    (
        "unexpected values / values checked",
        lambda p: p.value_rate,
        lambda p: f"{p.unexpected:,} of {p.values_checked:,} row-checks",
    ),
)


def render(template: str, **context) -> str:
    """One page of `templates/`, ending in a newline."""
    return ENV.get_template(template).render(**context).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------------ summary page
@dataclass(frozen=True)
class Failing:
    """A failing check as a cell and a halt box list it."""

    check_id: str
    action: str
    what: str  # "3 of 100 rows" or "error: ..."
    expectation: str
    columns: str  # the column(s) it is about
    policy: str
    why: str | None
    unexpected: int
    elements: int
    link: str | None  # the Data Docs page of its cell
    table_name: str

    @property
    def call(self) -> str:
        """expect_...(column), or the bare expectation when it names no column."""
        return self.expectation + (f"({self.columns})" if self.columns else "")


def render_summary(
    data: QualityData,
    pages: dict[tuple[int, int, str], str],
    generated_at: dt.datetime,
    late_records: int | None = None,
) -> str:
    """The summary page (`index.html`). `pages` are the Data Docs pages by (micro-batch, attempt, table), relative
    to the page; a cell without one is not linked. `late_records`: the live windows' late records, with a link to
    their page (`streamdi.report.windows`), when it was written. Deterministic for the same data except the
    generation time."""
    grid = build_grid(data)
    points = trend(grid)
    return render(
        "summary.html",
        summary=summarize(data, grid).line(),
        generated=generated_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        lake_root=data.lake_root,
        data_docs_index=f"{DATA_DOCS}/index.html" if pages else None,
        halts=_halts(data, grid, pages),
        legend=[(a, LABELS[a]) for a in SEVERITY],
        tables=grid.tables,
        rows=[_grid_row(data, grid, pages, b) for b in grid.batch_ids],
        trend=Markup(trend_bars(TREND_PANELS, points)) if points else None,
        latency=_latency(data),
        late_records=late_records,
        quarantine=_quarantine(data),
    )


def _failing(data: QualityData, cell: Cell, pages: dict) -> list[Failing]:
    return [
        Failing(
            check_id=c.check_id,
            action=c.action,
            what=f"error: {c.error}" if c.error else f"{c.unexpected_count:,} of {c.element_count:,} rows",
            expectation=c.expectation,
            columns=c.columns,
            policy=c.policy,
            why=data.why.get((c.table_name, c.check_id)),
            unexpected=c.unexpected_count,
            elements=c.element_count,
            link=pages.get((cell.batch_id, cell.attempt, cell.table_name)),
            table_name=c.table_name,
        )
        for c in cell.checks
        if c.failed
    ]


def _halts(data: QualityData, grid: Grid, pages: dict) -> list[dict]:
    out = []
    for b in (b for b in data.batches if b.halted_stage):
        cells = [cell for (cb, _), cell in sorted(grid.cells.items()) if cb == b.batch_id]
        halting = [f for cell in cells for f in _failing(data, cell, pages) if f.action == HALTED]
        out.append(
            {
                "batch_id": b.batch_id,
                "stage": b.halted_stage,
                "at": f" at {b.halted_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" if b.halted_at else "",
                "reason": b.halt_reason or "not recorded",
                "checks": halting,
                "options": operator_commands(b.batch_id, b.halted_stage or ""),
            }
        )
    return out


def _grid_row(data: QualityData, grid: Grid, pages: dict, batch_id: int) -> dict:
    state = data.batch(batch_id)
    label = state.state
    detail, detail_class = "", "small"
    if state.halted_stage:
        detail = f"at its {state.halted_stage} step"
    elif state.skip_reason is not None:
        detail = f"reason: {state.skip_reason}"
    elif "in progress" in label:
        detail, detail_class = ", ".join(f"{s} {st}" for s, st in state.stages), "small muted"
    cells = []
    for table in grid.tables:
        cell = grid.cells.get((batch_id, table))
        if cell is None:
            cells.append({"table": table, "worst": None})
            continue
        earlier = [
            (pages.get((batch_id, a, table)), f"attempt {a}: {LABELS.get(w, w)}") for a, w in cell.earlier
        ]  # fmt: skip
        cells.append(
            {
                "table": table,
                "worst": cell.worst,
                "link": pages.get((batch_id, cell.attempt, table)),
                "title": f"{len(cell.checks)} check(s)" + (f", attempt {cell.attempt}" if cell.attempt else ""),
                "failing": _failing(data, cell, pages),
                "earlier": earlier,
            }
        )
    return {
        "batch_id": batch_id,
        "tpcdi": ", ".join(map(str, state.tpcdi_batches)) or "?",
        "state": label,
        "badge": "halted" if label == "halted" else "skipped" if label == "skipped" else "",
        "detail": detail,
        "detail_class": detail_class,
        "cells": cells,
    }


def _latency(data: QualityData) -> dict | None:
    """Seconds from each micro-batch's arrival (its newest file) to staged, committed in Delta (transform done) and
    visible in PostgreSQL (migrate done): p50/p99 over every migrated micro-batch, and the latest ones."""
    rows = [
        (b.batch_id, b.after_arrival("stage"), b.after_arrival("transform"), b.after_arrival("migrate"))
        for b in data.batches
        if b.after_arrival("migrate") is not None
    ]
    if not rows:
        return None
    visible = [r[3] for r in rows]

    def seconds(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    return {
        "batches": len(rows),
        "p50": f"{percentile(visible, 50):.2f}",
        "p99": f"{percentile(visible, 99):.2f}",
        "rows": [(b, *map(seconds, times)) for b, *times in rows[-LATENCY_ROWS:]],
    }


def _quarantine(data: QualityData) -> dict:
    per_table: dict[str, tuple[int, list[int]]] = {}
    for table, b, n in data.quarantined:
        rows, batches = per_table.get(table, (0, []))
        per_table[table] = (rows + n, [*batches, b])
    example = min(per_table, key=table_order) if per_table else "staging.trade"
    path = f"{data.lake_root}/quality/quarantine" if data.lake_root else "<STREAMDI_LAKE>/quality/quarantine"
    ordered = sorted(per_table.items(), key=lambda kv: table_order(kv[0]))
    return {
        "tables": [(t, n, ", ".join(map(str, bs))) for t, (n, bs) in ordered],
        "path": json.dumps(path),
        "example": json.dumps(example),
        "example_sql": "'" + example.replace("'", "''") + "'",
    }


# ------------------------------------------------------------------------------------------------ other pages
def render_batch_log(rows: Iterable[dict], generated_at: dt.datetime) -> str:
    """The batch-log page (`<STREAMDI_HOME>/reports/index.html`): one row per micro-batch (`BatchLog.summary`), one
    column per stage with its state, and its latency: seconds from arrival to staged, to committed in Delta
    (transform done) and to visible in PostgreSQL (migrate done)."""
    rows = list(rows)

    def after(row: dict, stage: str) -> str:
        at = row.get(f"{stage}_at")
        return f"{(at - row['arrived_at']).total_seconds():.2f}" if at is not None else ""

    return render(
        "batch_log.html",
        stages=STAGES,
        batches=len(rows),
        done=sum(1 for r in rows if all(r[s] == "done" for s in STAGES)),
        generated=f"{generated_at:%Y-%m-%d %H:%M:%S %Z}",
        rows=[
            {
                "batch_id": r["batch_id"],
                "files": r["files"],
                "tpcdi": ", ".join(map(str, r["source_batches"])),
                "arrived": r["arrived_at"].strftime("%Y-%m-%d %H:%M:%S"),
                "states": [r[s] for s in STAGES],
                "after": [after(r, s) for s in STAGES],
            }
            for r in rows
        ],
    )


def render_placeholder(title: str) -> str:
    """The page served before the first report is written (`dags/plugins/streamdi_reports.py`)."""
    return render("placeholder.html", title=title)
