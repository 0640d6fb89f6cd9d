"""The data-quality report: one static summary page over every micro-batch, and Great Expectations Data Docs.

Where it sits: validation runs in the batch dataflow and records one row per (micro-batch, attempt, table, check)
in the Delta table `quality.results` (`streamdi.quality`); this module reads those rows afterwards, at report
time, so the hot path pays nothing for pages. It writes under `<STREAMDI_HOME>/reports/quality/`:

- `index.html`: our summary (plain HTML, inline CSS and SVG, no script, nothing fetched from the network):
  micro-batches x validated tables with the worst action per cell, the failing checks, halted and skipped
  batches with the operator commands, a trend of failure rates, and the quarantined rows per table;
- `windows.html`: the live windows plotted, and their late records (`streamdi.windows_report`);
- `data_docs/`: Great Expectations Data Docs built by GX's own site builder from `ExpectationSuiteValidationResult`
  objects reconstructed from the stored rows: one validation page per (micro-batch, attempt, table), a page
  per suite, and GX's index. Every summary cell links to its table's validation page.

Three layers, so each can be tested alone: `gather` reads the lake and the batch log into plain dataclasses
(`QualityData`); `build_grid` / `render_summary` turn those into HTML without I/O; `build_data_docs` drives GX.
`write_report` ties them together and writes atomically (a reader never sees half a page or half a site).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from schemas.platform import BATCH_EVENTS
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi import windows_report
from streamdi.batchlog import operator_commands
from streamdi.lake import Lake
from streamdi.locks import flocked

log = logging.getLogger(__name__)

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
DATA_DOCS = "data_docs"  # folder of the GX site, next to index.html
SITE_NAME = "streamdi"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# ------------------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class CheckResult:
    """One row of `quality.results`, with its `detail` JSON unpacked."""

    batch_id: int
    attempt: int
    table_name: str
    check_id: str
    expectation: str
    column_name: str | None
    policy: str
    action: str
    success: bool
    element_count: int
    unexpected_count: int
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    failing_values: tuple = ()
    error: str | None = None

    @classmethod
    def from_row(cls, row: dict) -> CheckResult:
        detail = json.loads(row.get("detail") or "{}")
        return cls(
            batch_id=int(row["batch_id"]),
            attempt=int(row["attempt"]),
            table_name=row["table_name"],
            check_id=row["check_id"],
            expectation=row["expectation"],
            column_name=row.get("column_name"),
            policy=row["policy"],
            action=row["action"],
            success=bool(row["success"]),
            element_count=int(row["element_count"] or 0),
            unexpected_count=int(row["unexpected_count"] or 0),
            kwargs=dict(detail.get("kwargs") or {}),
            failing_values=tuple(detail.get("failing_values") or ()),
            error=detail.get("error"),
        )

    @property
    def failed(self) -> bool:
        return self.action != "passed"

    @property
    def columns(self) -> str:
        """The column(s) the check is about, for display (`column`, or both columns of a pair expectation)."""
        if self.column_name:
            return self.column_name
        names = [str(self.kwargs[a]) for a in ("column_A", "column_B") if a in self.kwargs]
        names += [str(c) for c in self.kwargs.get("column_list") or ()]
        return ", ".join(names)


@dataclass(frozen=True)
class BatchState:
    """What the batch log knows about one micro-batch."""

    batch_id: int
    tpcdi_batches: tuple[int, ...] = ()
    arrived_at: dt.datetime | None = None
    stages: tuple[tuple[str, str], ...] = ()  # (stage, state) in stage order
    halted_stage: str | None = None
    halt_reason: str = ""
    halted_at: dt.datetime | None = None
    skip_reason: str | None = None
    resumed: bool = False
    done_at: tuple[tuple[str, dt.datetime | None], ...] = ()  # (stage, when it was marked done) in stage order

    def after_arrival(self, stage: str) -> float | None:
        """Seconds from the arrival of the micro-batch's newest file until `stage` was done (None if it is not)."""
        at = dict(self.done_at).get(stage)
        if at is None or self.arrived_at is None:
            return None
        return (at - self.arrived_at).total_seconds()

    @property
    def state(self) -> str:
        """halted, skipped, done, pending, or in progress; a resumed batch that went on says so."""
        if self.halted_stage:
            return "halted"
        states = [s for _, s in self.stages]
        if "skipped" in states:
            return "skipped"
        if states and all(s == "done" for s in states):
            return "resumed, done" if self.resumed else "done"
        if not any(s in ("done", "resumed") for s in states):
            return "pending"
        return "resumed, in progress" if self.resumed else "in progress"

    @property
    def run_time(self) -> dt.datetime:
        """The time GX shows as a validation's Run Time: the micro-batch's arrival (its newest file). The results
        table records no validation time; the arrival is fixed, so page names stay the same from run to run."""
        if self.arrived_at is None:
            return _EPOCH + dt.timedelta(seconds=self.batch_id)
        at = self.arrived_at
        return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)


@dataclass(frozen=True)
class QualityData:
    """Everything the report shows, read once (`gather`); hand-made in tests."""

    results: tuple[CheckResult, ...]
    batches: tuple[BatchState, ...] = ()
    quarantined: tuple[tuple[str, int, int], ...] = ()  # (table, micro-batch, rows in quality.quarantine)
    why: dict[tuple[str, str], str] = field(default_factory=dict)  # (table, check id) -> the suite's `why`
    lake_root: str = ""

    def batch(self, batch_id: int) -> BatchState:
        return next((b for b in self.batches if b.batch_id == batch_id), BatchState(batch_id))


def gather(lake: Lake) -> QualityData:
    """Read `quality.results`, `quality.quarantine` (two columns) and the batch log. No Spark: delta-rs only."""
    from streamdi.batchlog import STAGES, BatchLog

    results: list[CheckResult] = []
    if lake.exists(QUALITY_RESULTS):
        results = [CheckResult.from_row(r) for r in lake.read_arrow(QUALITY_RESULTS).to_pylist()]
    counts: dict[tuple[str, int], int] = {}
    if lake.exists(QUARANTINE):
        for r in lake.read_columns(QUARANTINE, ["table_name", "batch_id"]).to_pylist():
            key = (r["table_name"], int(r["batch_id"]))
            counts[key] = counts.get(key, 0) + 1
    batch_log = BatchLog(lake)
    halts = {h.batch_id: h for h in batch_log.halted()}
    skip_reasons: dict[int, str] = {}
    resumed: set[int] = set()
    for e in lake.read_arrow(BATCH_EVENTS).to_pylist():
        if e["state"] == "skipped":
            skip_reasons.setdefault(e["batch_id"], json.loads(e["detail"] or "{}").get("reason", ""))
        elif e["state"] == "resumed":
            resumed.add(e["batch_id"])
    batches = []
    for s in batch_log.summary():
        b = s["batch_id"]
        halt = halts.get(b)
        batches.append(
            BatchState(
                batch_id=b,
                tpcdi_batches=tuple(s["source_batches"]),
                arrived_at=s["arrived_at"],
                stages=tuple((stage, s[stage]) for stage in STAGES),
                halted_stage=halt.stage if halt else None,
                halt_reason=halt.reason if halt else "",
                halted_at=halt.at if halt else None,
                skip_reason=skip_reasons.get(b),
                resumed=b in resumed,
                done_at=tuple((stage, s[f"{stage}_at"]) for stage in STAGES),
            )
        )
    return QualityData(
        results=tuple(sorted(results, key=lambda r: (r.batch_id, r.attempt, r.table_name, r.check_id))),
        batches=tuple(batches),
        quarantined=tuple((t, b, n) for (t, b), n in sorted(counts.items())),
        why=_suite_reasons(),
        lake_root=str(lake.root),
    )


def _suite_reasons() -> dict[tuple[str, str], str]:
    """The `why` of every check in `expectations/` (results do not store it). A suite that does not load (someone
    is editing it) costs the report its reasons, not the report itself."""
    from streamdi.quality import SuiteError, load_suites

    try:
        suites = load_suites()
    except (SuiteError, OSError) as exc:
        log.warning("quality report without the checks' reasons: %s", exc)
        return {}
    return {(name, c.id): c.why for name, suite in suites.items() for c in suite.checks if c.why}


# ------------------------------------------------------------------------------------------------ grid
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


def _table_order(name: str) -> tuple[int, str]:
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
    tables = tuple(sorted({t for _, t in cells}, key=_table_order))
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


# ------------------------------------------------------------------------------------------------ data docs
def run_name(batch_id: int, attempt: int) -> str:
    """GX run name of a micro-batch's attempt: `batch-7`, and `batch-7-attempt-1` after the first resume."""
    return f"batch-{batch_id}" + (f"-attempt-{attempt}" if attempt else "")


def data_docs_page(table: str, batch: BatchState, attempt: int) -> str:
    """Where GX's site builder puts the validation page of (table, micro-batch, attempt), relative to the report
    folder: `data_docs/validations/<layer>/<table>/<run name>/<run time>/micro-batch-<id>.html`."""
    run_time = batch.run_time.strftime("%Y%m%dT%H%M%S.%fZ")  # GX's RunIdentifier.to_tuple format
    parts = [DATA_DOCS, "validations", *table.split("."), run_name(batch.batch_id, attempt), run_time]
    return "/".join([*parts, f"micro-batch-{batch.batch_id}.html"])


def build_data_docs(data: QualityData, site_dir: Path) -> dict[tuple[int, int, str], str]:
    """Build GX Data Docs for every (micro-batch, attempt, table) of `data` into `site_dir` (which must not hold an
    older site: pages of results that are gone would stay). Returns the pages written, relative to the parent
    of `site_dir`, by (micro-batch, attempt, table); a page GX failed to render (it logs why) is left out."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no usage statistics sent anywhere
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    # as in streamdi.quality.Validator: this logger is pinned at INFO by GX ("Created temporary directory ...")
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.NOTSET)
    context = gx.get_context(mode="ephemeral")
    context.add_data_docs_site(
        SITE_NAME,
        {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "show_how_to_buttons": False,
            "site_section_builders": {"profiling": "None"},
        },
    )
    groups: dict[tuple[int, int, str], list[CheckResult]] = {}
    for r in data.results:
        groups.setdefault((r.batch_id, r.attempt, r.table_name), []).append(r)
    latest: dict[str, tuple[int, int]] = {}  # table -> its newest (batch, attempt): the checks its suite page shows
    for b, a, table in groups:
        latest[table] = max(latest.get(table, (b, a)), (b, a))
    for table, (b, a) in sorted(latest.items()):
        context.suites.add(_gx_suite(table, groups[(b, a, table)], data.why))
    store = context.validation_results_store
    version = gx.__version__
    for (b, a, table), rows in sorted(groups.items()):
        batch = data.batch(b)
        run_id = RunIdentifier(run_name=run_name(b, a), run_time=batch.run_time)
        key = ValidationResultIdentifier(ExpectationSuiteIdentifier(table), run_id, f"micro-batch-{b}")
        store.set(key, _gx_result(table, batch, a, rows, run_id, version))
    context.build_data_docs(site_names=[SITE_NAME])
    pages = {}
    for b, a, table in groups:
        page = data_docs_page(table, data.batch(b), a)
        if (site_dir.parent / page).is_file():
            pages[(b, a, table)] = page
        else:
            log.warning("GX rendered no Data Docs page for %s, micro-batch %d, attempt %d", table, b, a)
    return pages


def _gx_suite(table: str, rows: list[CheckResult], why: dict[tuple[str, str], str]):
    """The suite as its newest results ran it: its page lists the checks, each with a note naming its id, policy
    and reason. (GX 1.x's extra validation-page columns, `meta_properties_to_render`, fail its own argument
    checks, so the check ids live in these notes and in our summary page.)"""
    import great_expectations as gx
    from great_expectations.expectations.registry import get_expectation_impl

    suite = gx.ExpectationSuite(name=table)
    for r in rows:
        try:
            expectation = get_expectation_impl(r.expectation)(**r.kwargs)
        except Exception as exc:  # an expectation this GX does not know (or new arguments): page without it
            log.warning("suite page of %s without check %s: %s", table, r.check_id, exc)
            continue
        expectation.meta = {"streamdi": _gx_attributes(r)}
        expectation.notes = f"check **{r.check_id}**, policy {r.policy}: {why.get((table, r.check_id), '')}"
        suite.add_expectation(expectation)
    return suite


def _gx_attributes(r: CheckResult) -> dict:
    return {"check_id": r.check_id, "policy": r.policy, "action": LABELS.get(r.action, r.action)}


def _gx_result(table: str, batch: BatchState, attempt: int, rows: list[CheckResult], run_id, version: str):
    """An ExpectationSuiteValidationResult rebuilt from stored rows: what GX's validation page needs to show the
    expectation, its arguments, success, counts, unexpected share and the (partial) failing values."""
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    results = []
    for r in rows:
        result: dict = {"element_count": r.element_count, "unexpected_count": r.unexpected_count}
        if r.element_count:
            share = 100.0 * r.unexpected_count / r.element_count
            result |= {"unexpected_percent": share, "unexpected_percent_nonmissing": share, "missing_count": 0}
        if r.failing_values:
            result["partial_unexpected_list"] = list(r.failing_values)
        results.append(
            ExpectationValidationResult(
                success=r.success,
                expectation_config=ExpectationConfiguration(
                    type=r.expectation, kwargs=dict(r.kwargs), meta={"streamdi": _gx_attributes(r)}
                ),
                result=result,
                exception_info=(
                    {"raised_exception": True, "exception_message": r.error, "exception_traceback": None}
                    if r.error
                    else {"raised_exception": False, "exception_message": None, "exception_traceback": None}
                ),
            )
        )
    passed = sum(1 for r in rows if r.success)
    return ExpectationSuiteValidationResult(
        success=passed == len(rows),
        results=results,
        suite_name=table,
        statistics={
            "evaluated_expectations": len(rows),
            "successful_expectations": passed,
            "unsuccessful_expectations": len(rows) - passed,
            "success_percent": 100.0 * passed / len(rows) if rows else 100.0,
        },
        meta={
            "great_expectations_version": version,
            "run_id": run_id,
            "validation_time": batch.run_time.strftime("%Y%m%dT%H%M%S.%fZ"),
            "active_batch_definition": {
                "datasource_name": "streamdi",
                "data_asset_name": table,
                "batch_definition_name": f"micro-batch {batch.batch_id}",
            },
            "batch_spec": {
                "source": "Delta quality.results (rebuilt at report time)",
                "micro_batch": batch.batch_id,
                "attempt": attempt,
                "tpcdi_batch": ", ".join(map(str, batch.tpcdi_batches)) or "unknown",
            },
        },
    )


# ------------------------------------------------------------------------------------------------ summary page
def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px 32px;color:#1f2328;font-size:14px}
h1{font-size:22px;margin:0 0 6px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
code{background:#f3f4f6;padding:1px 4px;border-radius:3px;font-size:12.5px}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:8px 10px;border-radius:4px;overflow-x:auto;font-size:12.5px}
a{color:#0b62c4} .muted{color:#656d76} .small{font-size:12px}
.halt{border:2px solid #cf222e;background:#ffebe9;border-radius:6px;padding:10px 14px;margin:12px 0}
.halt h2{border:0;margin:0 0 6px;color:#a40e26} .halt pre{background:#fff}
.ok{border:1px solid #1a7f37;background:#dafbe1;border-radius:6px;padding:8px 14px;margin:12px 0}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #d0d7de;border-radius:3px}
.gridwrap{overflow-x:auto;border:1px solid #d0d7de;border-radius:4px}
table{border-collapse:collapse} th,td{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left}
#grid{font-size:12.5px} #grid thead th{background:#f6f8fa;position:sticky;top:0;white-space:nowrap}
#grid th.batch{position:sticky;left:0;background:#f6f8fa;min-width:150px;z-index:1}
#grid td{min-width:92px;max-width:280px;overflow-wrap:anywhere}
#grid tr.halted th.batch{background:#ffebe9;border-left:4px solid #cf222e}
#grid tr.skipped{opacity:.75}
.passed{background:#dafbe1} .warned{background:#fff8c5} .overridden{background:#eadcff}
.quarantined{background:#ffe2c2} .halted{background:#ffcecb} .none{background:#fff;color:#8c959f}
td a.status{font-weight:600;text-decoration:none;color:#1f2328;display:block}
td a.status:hover{text-decoration:underline}
.state{display:inline-block;font-size:11px;padding:0 5px;border-radius:8px;border:1px solid #8c959f}
.state.halted{background:#cf222e;color:#fff;border-color:#cf222e} .state.skipped{background:#eaeef2}
ul.fail{margin:3px 0 0;padding-left:14px} ul.fail li{margin:2px 0}
"""


def render_summary(
    data: QualityData,
    pages: dict[tuple[int, int, str], str],
    generated_at: dt.datetime,
    late_records: int | None = None,
) -> str:
    """The summary page (`index.html`). `pages` are the Data Docs pages by (micro-batch, attempt, table), relative
    to the page; a cell without one is not linked. `late_records`: the live windows' late records, with a link to
    their page (`streamdi.windows_report`), when it was written. Deterministic for the same data except the
    generation time."""
    grid = build_grid(data)
    summary = summarize(data, grid)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>streamdi data-quality report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>streamdi data-quality report</h1>",
        f'<p id="summary">{_e(summary.line())}.<br><span class="muted small">Generated '
        f"{_e(generated_at.astimezone(dt.UTC).strftime('%Y-%m-%d %H:%M:%S UTC'))} from Delta "
        f"<code>quality.results</code> and the batch log"
        + (f" in <code>{_e(data.lake_root)}</code>" if data.lake_root else "")
        + "; each cell links to its Great Expectations Data Docs page "
        + (f'(<a href="{DATA_DOCS}/index.html">Data Docs index</a>)' if pages else "(none built)")
        + '; every micro-batch\'s stages: <a id="batch-log" href="../index.html">batch log</a>.</span></p>',
        _render_halts(data, grid, pages),
        _render_grid(data, grid, pages),
        _render_trend(trend(grid)),
        _render_latency(data),
        _render_windows(late_records),
        _render_quarantine(data),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _render_halts(data: QualityData, grid: Grid, pages: dict) -> str:
    halted = [b for b in data.batches if b.halted_stage]
    if not halted:
        return '<div class="ok" id="halts">No micro-batch is halted.</div>'
    out = []
    for b in halted:
        checks = [(cell, c) for (cb, _), cell in sorted(grid.cells.items()) if cb == b.batch_id for c in cell.checks]
        halting = [(cell, c) for cell, c in checks if c.action == "halted"]
        items = "".join(
            f"<li>{_cell_link(pages, cell, f'{c.table_name} · {c.check_id}')}: {_e(c.expectation)}"
            f"({_e(c.columns)}) failed on {c.unexpected_count:,} of {c.element_count:,} rows"
            + (
                f" — <i>{_e(data.why.get((c.table_name, c.check_id)))}</i>"
                if data.why.get((c.table_name, c.check_id))
                else ""
            )
            + "</li>"
            for cell, c in halting
        )
        at = f" at {b.halted_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" if b.halted_at else ""
        options = operator_commands(b.batch_id, b.halted_stage or "")
        out.append(
            f'<div class="halt" id="halted-{b.batch_id}"><h2>Micro-batch {b.batch_id} is HALTED '
            f"(its {_e(b.halted_stage)} step{at})</h2>"
            f"<p><b>Reason:</b> {_e(b.halt_reason) or 'not recorded'}</p>"
            + (f"<ul>{items}</ul>" if items else "")
            + "<p>It and every later micro-batch wait until an operator acts. After checking the data:</p><ul>"
            + "".join(f"<li><code>{_e(command)}</code>: {_e(what)}</li>" for command, what in options)
            + "</ul></div>"
        )
    return "\n".join(out)


def _cell_link(pages: dict, cell: Cell, text: str, css: str = "") -> str:
    page = pages.get((cell.batch_id, cell.attempt, cell.table_name))
    cls = f' class="{css}"' if css else ""
    return f'<a{cls} href="{_e(page)}">{_e(text)}</a>' if page else f"<span{cls}>{_e(text)}</span>"


def _render_grid(data: QualityData, grid: Grid, pages: dict) -> str:
    legend = (
        "".join(f'<span class="{a}">{LABELS[a]}</span>' for a in SEVERITY) + '<span class="none">– not validated</span>'
    )
    if not grid.batch_ids:
        return '<h2>Micro-batches × tables</h2><p id="grid">No micro-batch yet.</p>'
    head = "".join(f'<th title="{_e(t)}">{_e(t)}</th>' for t in grid.tables)
    rows = []
    for b in grid.batch_ids:
        state = data.batch(b)
        label = state.state
        badge_cls = "halted" if label == "halted" else "skipped" if label == "skipped" else ""
        detail = ""
        if state.halted_stage:
            detail = f'<div class="small">at its {_e(state.halted_stage)} step</div>'
        elif state.skip_reason is not None:
            detail = f'<div class="small">reason: {_e(state.skip_reason)}</div>'
        elif "in progress" in label:
            detail = '<div class="small muted">' + _e(", ".join(f"{s} {st}" for s, st in state.stages)) + "</div>"
        tpcdi = ", ".join(map(str, state.tpcdi_batches)) or "?"
        header = (
            f'<th class="batch" id="batch-{b}">micro-batch {b}<div class="small muted">TPC-DI batch {_e(tpcdi)}</div>'
            f'<span class="state {badge_cls}">{_e(label)}</span>{detail}</th>'
        )
        cells = "".join(_render_cell(data, grid.cells.get((b, t)), b, t, pages) for t in grid.tables)
        rows.append(f'<tr class="{badge_cls}" data-batch="{b}">{header}{cells}</tr>')
    return (
        '<h2>Micro-batches × tables</h2><p class="legend small">Worst check of the latest attempt: '
        f"{legend}</p>"
        '<div class="gridwrap"><table id="grid"><thead><tr><th class="batch">micro-batch</th>'
        f"{head}</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table></div>"
    )


def _render_cell(data: QualityData, cell: Cell | None, batch_id: int, table: str, pages: dict) -> str:
    if cell is None:
        return f'<td class="none" data-table="{_e(table)}">–</td>'
    worst = cell.worst
    title = f"{len(cell.checks)} check(s)" + (f", attempt {cell.attempt}" if cell.attempt else "")
    inner = _cell_link(pages, cell, LABELS.get(worst, worst), "status")
    inner += f'<div class="small muted">{_e(title)}</div>'
    if cell.failing:
        items = []
        for c in cell.failing:
            why = data.why.get((c.table_name, c.check_id))
            what = f"error: {c.error}" if c.error else f"{c.unexpected_count:,} of {c.element_count:,} rows"
            expectation = c.expectation + (f"({c.columns})" if c.columns else "")
            items.append(
                f'<li data-check="{_e(c.check_id)}"><b>{_e(c.check_id)}</b> {_e(LABELS.get(c.action, c.action))}: '
                f'{_e(what)}<br><span class="muted">{_e(expectation)}</span><br>'
                f'<i class="muted">{_e(c.policy)}' + (f": {_e(why)}" if why else "") + "</i></li>"
            )
        inner += '<ul class="fail">' + "".join(items) + "</ul>"
    if cell.earlier:
        links = []
        for a, w in cell.earlier:
            page = pages.get((batch_id, a, table))
            text = f"attempt {a}: {LABELS.get(w, w)}"
            links.append(f'<a href="{_e(page)}">{_e(text)}</a>' if page else _e(text))
        inner += '<div class="small muted">earlier: ' + ", ".join(links) + "</div>"
    return f'<td class="{_e(worst)}" data-table="{_e(table)}">{inner}</td>'


_CHART_W, _PANEL_H, _LEFT, _BOTTOM = 960, 130, 56, 22
_BAR_COLOURS = {
    "passed": "#2da44e",
    "warned": "#d4a72c",
    "overridden": "#8250df",
    "quarantined": "#e16f24",
    "halted": "#cf222e",
}


def _render_trend(points: list[BatchTrend]) -> str:
    if not points:
        return ""
    panels = [
        ("failed checks / checks", lambda p: p.check_rate, lambda p: f"{p.failed_checks} of {p.checks} checks"),
        (
            "unexpected values / values checked",
            lambda p: p.value_rate,
            lambda p: f"{p.unexpected:,} of {p.values_checked:,} row-checks",
        ),
    ]
    svgs = [_bar_panel(title, points, rate, text) for title, rate, text in panels]
    return (
        '<h2>Failure rates per micro-batch</h2><p class="small muted">Latest attempt of each micro-batch; bar colour = '
        "worst action of the batch. Hover a bar for the counts. Unexpected values sum each check's failing rows "
        "(a row failing two checks counts twice) over the rows each check saw.</p>"
        '<div id="trend">' + "".join(svgs) + "</div>"
    )


def _bar_panel(title: str, points: list[BatchTrend], rate, text) -> str:
    top = max((rate(p) for p in points), default=0.0)
    scale = _nice_ceiling(top)
    plot_w = _CHART_W - _LEFT - 10
    step = plot_w / len(points)
    bar_w = max(2.0, min(28.0, step * 0.7))
    h = _PANEL_H
    y0 = 18 + h  # baseline
    label_every = max(1, round(len(points) / 30))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_CHART_W}" height="{h + 18 + _BOTTOM + 6}" '
        f'role="img" aria-label="{_e(title)}" style="display:block;margin-bottom:8px">',
        f'<text x="{_LEFT}" y="12" font-size="12" font-weight="600">{_e(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = y0 - frac * h
        out.append(f'<line x1="{_LEFT}" x2="{_CHART_W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d7de"/>')
        out.append(
            f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_percent(frac * scale)}</text>'
        )
    for i, p in enumerate(points):
        value = rate(p)
        bar_h = (value / scale) * h if scale else 0.0
        x = _LEFT + i * step + (step - bar_w) / 2
        colour = _BAR_COLOURS.get(p.worst, "#57606a")
        tip = f"micro-batch {p.batch_id}: {_percent(value)} ({text(p)}); worst: {LABELS.get(p.worst, p.worst)}"
        out.append(
            f'<rect x="{x:.1f}" y="{y0 - max(bar_h, 1):.1f}" width="{bar_w:.1f}" height="{max(bar_h, 1):.1f}" '
            f'fill="{colour}"><title>{_e(tip)}</title></rect>'
        )
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{y0 + 14}" font-size="10" text-anchor="middle">{p.batch_id}</text>'
            )
    out.append("</svg>")
    return "".join(out)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k (as a fraction, at most 1) that is >= value, so the axis reads well."""
    if value <= 0:
        return 0.01
    for ceiling in (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
        if value <= ceiling:
            return ceiling
    return 1.0


def _percent(fraction: float) -> str:
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 10 or pct == 0 else f"{pct:.2g}%"


LATENCY_ROWS = 20  # the latest micro-batches listed in the latency section


def _render_latency(data: QualityData) -> str:
    """Seconds from each micro-batch's arrival (its newest file) to staged, committed in Delta (transform done) and
    visible in PostgreSQL (migrate done): p50/p99 over every migrated micro-batch, and the latest ones."""
    from streamdi.batchlog import percentile

    rows = [
        (b.batch_id, b.after_arrival("stage"), b.after_arrival("transform"), b.after_arrival("migrate"))
        for b in data.batches
        if b.after_arrival("migrate") is not None
    ]
    head = "<h2>Latency per micro-batch</h2>"
    if not rows:
        return head + '<p id="latency">No micro-batch migrated yet.</p>'
    visible = [r[3] for r in rows]

    def cell(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    body = "".join(
        f"<tr><th>{b}</th><td>{cell(staged)}</td><td>{cell(committed)}</td><td>{cell(seen)}</td></tr>"
        for b, staged, committed, seen in rows[-LATENCY_ROWS:]
    )
    return (
        head + f'<p id="latency">Arrival -> visible in PostgreSQL over {len(rows)} migrated micro-batch(es): p50 '
        f"{percentile(visible, 50):.2f} s, p99 {percentile(visible, 99):.2f} s.<br>"
        '<span class="muted small">Seconds after the arrival of each micro-batch\'s newest file (its modification '
        "time: files copied from a data set by <code>streamdi load --data</code> keep the data set's); "
        "<code>streamdi stream status</code> and <code>streamdi.batch_metrics</code> in PostgreSQL give the same "
        "for the stream service.</span></p>"
        f'<table id="latency-table"><thead><tr><th>micro-batch</th><th>staged (s)</th><th>committed in Delta (s)'
        f"</th><th>visible (s)</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _render_windows(late_records: int | None) -> str:
    if late_records is None:
        return ""
    late = (
        "no late record"
        if not late_records
        else f"{late_records:,} late record(s) past their grace, counted in no window (DImessages Alerts)"
    )
    return (
        '<h2>Live windows</h2><p id="windows">Trade and market aggregates per window and hierarchy level, plotted: '
        f'<a id="windows-page" href="windows.html">live windows</a>; {late}.</p>'
    )


def _render_quarantine(data: QualityData) -> str:
    per_table: dict[str, tuple[int, list[int]]] = {}
    for table, b, n in data.quarantined:
        rows, batches = per_table.get(table, (0, []))
        per_table[table] = (rows + n, [*batches, b])
    if not per_table:
        body = '<p id="quarantine">No row is in quarantine.</p>'
    else:
        lines = "".join(
            f'<tr data-table="{_e(t)}"><td>{_e(t)}</td><td style="text-align:right">{n:,}</td>'
            f"<td>{_e(', '.join(map(str, bs)))}</td></tr>"
            for t, (n, bs) in sorted(per_table.items(), key=lambda kv: _table_order(kv[0]))
        )
        body = (
            '<table id="quarantine"><thead><tr><th>table</th><th>rows in quarantine</th><th>micro-batches</th>'
            f"</tr></thead><tbody>{lines}</tbody></table>"
        )
    example = min(per_table, key=_table_order) if per_table else "staging.trade"
    path = f"{data.lake_root}/quality/quarantine" if data.lake_root else "<STREAMDI_LAKE>/quality/quarantine"
    return (
        "<h2>Quarantined rows</h2>"
        + body
        + '<p class="small">Each quarantined row is kept whole, as JSON (<code>row</code>), with its key '
        "(<code>row_key</code>: source file and line in staging) and the quarantine checks it failed "
        "(<code>check_ids</code>). Retrieve them from the Delta table <code>quality.quarantine</code>:</p>"
        f"<pre>from deltalake import DeltaTable\n"
        f'DeltaTable({_e(json.dumps(path))}).to_pandas(filters=[("table_name", "=", {_e(json.dumps(example))})])</pre>'
        '<p class="small">or, once migrated, from PostgreSQL <code>streamdi.quality_quarantine</code> (as the '
        "read-only role, e.g. with <code>streamdi query</code>):</p>"
        f"<pre>SELECT batch_id, row_key, check_ids, row FROM streamdi.quality_quarantine\n"
        f" WHERE table_name = {_e(_sql_literal(example))} ORDER BY batch_id, row_key;</pre>"
    )


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# ------------------------------------------------------------------------------------------------ writing
@dataclass(frozen=True)
class ReportOutcome:
    """What `write_report` wrote: the summary page, the Data Docs pages, the headline figures and the timings."""

    index: Path
    data_docs_index: Path | None
    pages: int
    summary: Summary
    seconds: dict[str, float]


def report_dir(home: Path) -> Path:
    """`<STREAMDI_HOME>/reports/quality`."""
    return (Path(home) / "reports" / "quality").absolute()


def write_report(lake: Lake, out_dir: Path, *, now: dt.datetime, data_docs: bool = True) -> ReportOutcome:
    """Gather the results, rebuild the Data Docs site and write the summary page into `out_dir`.

    The site is built in a fresh folder next to the old one and swapped in, then `index.html` is replaced
    through a temporary file, so a browser never sees a half-written page or a link to a page not written yet.
    Two reports at once (the CLI and an Airflow task) take turns on a lock file in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    data = gather(lake)
    seconds["gather"] = time.perf_counter() - started
    with flocked(out_dir / ".report.lock"):
        pages: dict[tuple[int, int, str], str] = {}
        site = out_dir / DATA_DOCS
        if data_docs and data.results:
            started = time.perf_counter()
            building = Path(tempfile.mkdtemp(prefix=f".{DATA_DOCS}-", dir=out_dir))
            try:
                built = build_data_docs(data, building / DATA_DOCS)
                _localize(building / DATA_DOCS)
                _swap_in(building / DATA_DOCS, site)
            finally:
                shutil.rmtree(building, ignore_errors=True)
            pages = {k: v for k, v in built.items() if (out_dir / v).is_file()}
            seconds["data_docs"] = time.perf_counter() - started
        elif not data.results and site.exists():
            shutil.rmtree(site)  # no results any more (a new lake): no stale pages
        started = time.perf_counter()
        windows = windows_report.gather(lake)
        _write_atomically(out_dir / "windows.html", windows_report.render(windows, now))
        seconds["windows"] = time.perf_counter() - started
        started = time.perf_counter()
        page = out_dir / "index.html"
        _write_atomically(page, render_summary(data, pages, now, windows_report.late_total(windows)))
        seconds["summary"] = time.perf_counter() - started
    return ReportOutcome(
        index=page,
        data_docs_index=site / "index.html" if pages else None,
        pages=len(pages),
        summary=summarize(data),
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )


def _localize(site: Path) -> None:
    """Point the site's pages at local copies of the CDN files GX's templates load (`streamdi.web_assets`); without
    them (not fetched and no network) the pages keep their CDN links, and the log says why."""
    from streamdi import web_assets

    try:
        web_assets.localize(site)
    except web_assets.AssetsMissing as e:
        log.warning("Data Docs keep their CDN links (offline they lose styles, icons and the index list): %s", e)


def _swap_in(new: Path, target: Path) -> None:
    """Replace the folder `target` by `new` (two renames; the old folder is removed afterwards)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    new.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def describe(outcome: ReportOutcome) -> Iterable[str]:
    """Lines for logs and the CLI: where the page is, and its headline."""
    yield f"quality report: {outcome.index}"
    yield outcome.summary.line()
    if outcome.data_docs_index is not None:
        yield f"Great Expectations Data Docs: {outcome.pages} validation page(s), index {outcome.data_docs_index}"
