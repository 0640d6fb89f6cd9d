"""`streamdi audit` and `streamdi quality report`: what the loads produced, checked. The TPC-DI audit on the
PostgreSQL warehouse, and the data-quality report (with Great Expectations' Data Docs) from the Delta results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamdi.run.cli.output import console
from streamdi.settings import load_settings

quality_app = typer.Typer(help="Data-quality results of the validation suites.", no_args_is_help=True)


def audit(
    data: Annotated[
        Path | None,
        typer.Option(
            help="Read the expected figures from this data set's *_audit.csv files (default: the staged ones)."
        ),
    ] = None,
) -> None:
    """Run every check of the official TPC-DI audit script on the PostgreSQL warehouse (dw.*, read-only) and
    print each with OK or what was found and expected; exit 1 when a check failed or was skipped."""
    from jobs.audit import run_audit
    from streamdi.context import open_context

    report = run_audit(open_context(load_settings()), data)
    report.render(console)
    if not report.ok:
        raise typer.Exit(1)


@quality_app.command("report")
def quality_report() -> None:
    """Write the data-quality report and its Great Expectations Data Docs; print the path and a one-line summary.

    Reads Delta quality.results, quality.quarantine and the batch log (no Spark) and writes
    <STREAMDI_HOME>/reports/quality/index.html: micro-batches x validated tables with the worst check of each,
    the failing checks, halted and skipped batches, failure rates per batch and the quarantined rows per table.
    Each cell links to its validation page in reports/quality/data_docs/ (rebuilt on every run). Also writes the
    batch-log page, <STREAMDI_HOME>/reports/index.html: every micro-batch with the state of each stage."""
    from streamdi.batchlog import wall_clock
    from streamdi.report import describe
    from streamdi.run.orchestration import write_report_pages

    outcome, page, batches = write_report_pages(load_settings(), wall_clock())
    for line in describe(outcome):
        console.print(line, markup=False, highlight=False)
    console.print(f"batch log: {page} ({batches} micro-batch(es))", markup=False, highlight=False)


@quality_app.command("stop")
def quality_stop() -> None:
    """Stop the warm Great Expectations server(s) of this user (STREAMDI_GX_SERVER: the first process that validates
    starts one, later processes reuse it, and it stops itself after STREAMDI_GX_SERVER_IDLE_TIMEOUT idle seconds)."""
    from streamdi.gx_remote import stop_all

    stopped = stop_all()
    console.print(
        f"stopped {len(stopped)} Great Expectations server(s)." if stopped else "no Great Expectations server running.",
        markup=False,
    )
