"""Writing the quality report: gather, render, build the Data Docs, and put the files in place atomically.

Where it sits: the top of `streamdi.report`, called by `streamdi.run.orchestration.write_report_pages` (the CLI's
`streamdi quality report` and the quality-report DAG). It writes under `<STREAMDI_HOME>/reports/quality/`:
`index.html` (the summary, `streamdi.report.render`), `windows.html` (`streamdi.report.windows`) and `data_docs/`
(`streamdi.report.data_docs`), and `describe` gives the lines the CLI and the logs print.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streamdi.lake import Lake
from streamdi.locks import flocked
from streamdi.report.data_docs import DATA_DOCS, build_data_docs, localize
from streamdi.report.figures import Summary, summarize
from streamdi.report.gather import gather
from streamdi.report.render import render_summary
from streamdi.report.windows import gather as gather_windows
from streamdi.report.windows import late_total
from streamdi.report.windows import render as render_windows


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
                localize(building / DATA_DOCS)
                _swap_in(building / DATA_DOCS, site)
            finally:
                shutil.rmtree(building, ignore_errors=True)
            pages = {k: v for k, v in built.items() if (out_dir / v).is_file()}
            seconds["data_docs"] = time.perf_counter() - started
        elif not data.results and site.exists():
            shutil.rmtree(site)  # no results any more (a new lake): no stale pages
        started = time.perf_counter()
        windows = gather_windows(lake)
        _write_atomically(out_dir / "windows.html", render_windows(windows, now))
        seconds["windows"] = time.perf_counter() - started
        started = time.perf_counter()
        page = out_dir / "index.html"
        _write_atomically(page, render_summary(data, pages, now, late_total(windows)))
        seconds["summary"] = time.perf_counter() - started
    return ReportOutcome(
        index=page,
        data_docs_index=site / "index.html" if pages else None,
        pages=len(pages),
        summary=summarize(data),
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )


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
