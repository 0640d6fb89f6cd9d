"""The data-quality report: a static summary page over every micro-batch, the live windows plotted, and Great
Expectations Data Docs, written at report time (validation in the batch dataflow writes no HTML).

Where it sits: platform layer, read-only on the lake. It reads `quality.results`, `quality.quarantine`, the batch log
and the window tables, and writes under `<STREAMDI_HOME>/reports/quality/` (docs/reports.md). In data-flow order:

- `gather`: the lake and the batch log into plain dataclasses (`QualityData`, `CheckResult`, `BatchState`);
- `figures`: the grid of micro-batches x tables, the failure-rate trend and the headline `Summary` (no I/O);
- `charts`: matplotlib SVG for the pages (trend bars, window panels);
- `render`: HTML from the Jinja2 templates in `templates/` (summary, batch log, placeholder);
- `windows`: the live-windows page (its own reads of the window tables, rendered like the summary);
- `data_docs`: Great Expectations' own site, rebuilt from the stored rows;
- `write`: `write_report` ties them together and swaps the files in atomically; `describe` for the CLI and logs.

This module re-exports what the CLI, `streamdi.run.orchestration` and the tests use.
"""

from __future__ import annotations

from streamdi.report.data_docs import DATA_DOCS, build_data_docs, data_docs_page, run_name
from streamdi.report.figures import LABELS, SEVERITY, BatchTrend, Cell, Grid, Summary, build_grid, summarize, trend
from streamdi.report.gather import BatchState, CheckResult, QualityData, gather
from streamdi.report.render import render_batch_log, render_placeholder, render_summary
from streamdi.report.write import ReportOutcome, describe, report_dir, write_report

__all__ = [
    "DATA_DOCS",
    "LABELS",
    "SEVERITY",
    "BatchState",
    "BatchTrend",
    "Cell",
    "CheckResult",
    "Grid",
    "QualityData",
    "ReportOutcome",
    "Summary",
    "build_data_docs",
    "build_grid",
    "data_docs_page",
    "describe",
    "gather",
    "render_batch_log",
    "render_placeholder",
    "render_summary",
    "report_dir",
    "run_name",
    "summarize",
    "trend",
    "write_report",
]
