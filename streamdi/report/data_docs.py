"""Great Expectations Data Docs of the quality report, built by GX's own site builder.

Where it sits in `streamdi.report`: from the gathered rows (`QualityData`) it rebuilds an
`ExpectationSuiteValidationResult` per (micro-batch, attempt, table) in an ephemeral GX context, puts each in the
context's validation-results store and lets GX write the site (a validation page per result, a suite page per table,
GX's index); `localize` points the pages at local copies of their CDN files (`streamdi.web_assets`). The summary page
(`streamdi.report.render`) links every cell to the page `data_docs_page` names. GX is imported only here, and only
when a site is built.
"""

from __future__ import annotations

import logging
from pathlib import Path

from streamdi.gx_import import import_great_expectations
from streamdi.report.figures import LABELS
from streamdi.report.gather import BatchState, CheckResult, QualityData

log = logging.getLogger(__name__)

DATA_DOCS = "data_docs"  # folder of the GX site, next to index.html
SITE_NAME = "streamdi"


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
    gx = import_great_expectations()
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


def localize(site: Path) -> None:
    """Point the site's pages at local copies of the CDN files GX's templates load (`streamdi.web_assets`); without
    them (not fetched and no network) the pages keep their CDN links, and the log says why."""
    from streamdi import web_assets

    try:
        web_assets.localize(site)
    except web_assets.AssetsMissing as e:
        log.warning("Data Docs keep their CDN links (offline they lose styles, icons and the index list): %s", e)
