"""Job functions for the Airflow DAGs (`dags/`): one function per task, each a thin layer over `streamdi.run.pipeline`.

Where the data flow sits: landing files -> collect -> stage -> validate -> transform -> migrate -> audit/report.
`streamdi.run.pipeline` holds the stage jobs and the one loop that drives them (`drive`, also run by the CLI and the
stream service), and the batch log decides what is left; this module only adds what a scheduled, parameterised run
needs around them:

- delivering a data set's batch folder (or the reference files, or a freshly generated demo data set) into the
  landing zone;
- the loop's scope per task: the pending (batch, stage) steps up to a given batch and stage, oldest first, or one
  transform step, so a DAG can show stage, T0..DM and migrate as separate tasks while the batch order stays the
  batch log's;
- the checks around the stage step's validation: staged counts reconcile, and no batch is halted (a task that
  meets a halted batch fails with the batch, step, reason and the operator's two commands);
- the report pages the quality-report DAG renders: the data-quality report with its Great Expectations Data Docs
  (`<STREAMDI_HOME>/reports/quality/`, `streamdi.report`) and the batch-log page
  (`<STREAMDI_HOME>/reports/index.html`).

Every function takes the settings (default: from the environment, as each Airflow task runs in a fresh process)
and returns a JSON-serialisable dict, so a task's return value shows up as its XCom in the UI. Heavy imports
(Spark, delta-rs, psycopg) happen inside the functions: DAG files import this module when they are parsed.

Long because it is the DAG files' one facade: every task body they call is `orchestration.<name>`, importable when a
DAG file is parsed (no Spark, delta-rs or psycopg at import), and its sections (delivery, the loop's scope per task,
checks and audit, the report pages) share the task conventions (`_settings`, `FailFast`, a JSON-serialisable result).
The loop itself, the stream service and its supervision live in `streamdi.run.pipeline` and `streamdi.run.stream*`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from streamdi.locks import lake_lease
from streamdi.settings import Settings, load_settings

log = logging.getLogger(__name__)

STAGES: tuple[str, ...] = ("stage", "transform", "migrate")  # = streamdi.batchlog.STAGES (checked in tests)
MIGRATION_MODES: tuple[str, ...] = ("push", "none")
HALTED = "halted"  # = streamdi.batchlog.HALTED (batchlog is not imported when DAG files are parsed)

# The transaction steps of a micro-batch's transform and the steps each runs after: `jobs.transform.STEPS` (checked in
# tests; the DAG files build their transform task group from it and may not import the jobs).
TRANSFORM_GRAPH: dict[str, tuple[str, ...]] = {
    "T0": (),
    "T1": ("T0",),
    "T2": ("T0",),
    "T3": ("T1", "T2"),
    "T4": ("T1", "T2"),
    "AG": ("T3", "T4"),
    "DM": ("AG",),
}
TRANSFORM_STEP_DOCS: dict[str, str] = {
    "T0": "reference: DimDate, DimTime, StatusType, TradeType, Industry, TaxRate, DimBroker",
    "T1": "securities: DimCompany, DimSecurity, Financial",
    "T2": "accounts: DimCustomer, DimAccount, Prospect",
    "T3": "trades: DimTrade, FactHoldings, FactCashBalances",
    "T4": "market: FactMarketHistory, FactWatches",
    "AG": "live windows: trade_windows, market_windows",
    "DM": "DImessages: validation rows, phase complete; marks the transform done",
}

# The TPC-DI reference files of Batch1 (and its BatchDate): what `streamdi_setup` loads before any business data.
REFERENCE_FILES: tuple[str, ...] = (
    "BatchDate.txt",
    "Date.txt",
    "Time.txt",
    "Industry.txt",
    "StatusType.txt",
    "TaxRate.txt",
    "TradeType.txt",
)

# Environment variables the DAG files read when they are parsed (not streamdi Settings: they shape the Airflow
# graph, not the data flow). Name -> (default, meaning).
DAG_ENVIRONMENT: dict[str, tuple[str, str]] = {
    "STREAMDI_INCREMENTAL_SCHEDULE": ("* * * * *", "cron schedule of streamdi_incremental"),
    "STREAMDI_MIGRATE_SCHEDULE": ("*/5 * * * *", "cron schedule of streamdi_migrate"),
    "STREAMDI_STREAM_CHECK_SCHEDULE": ("*/5 * * * *", "cron schedule of streamdi_stream (start if down, check)"),
    "STREAMDI_TASK_RETRY_DELAY": ("30", "seconds before a failed task's retry (each task has 2 retries)"),
}

# The data-quality report, served by the plugin in dags/plugins from <STREAMDI_HOME>/reports/ (docs/orchestration.md).
REPORT_URL_PATH = "/streamdi/reports/quality/index.html"
BATCH_LOG_URL_PATH = "/streamdi/reports/index.html"  # the batch-log page (`write_quality_report`)
WINDOWS_URL_PATH = "/streamdi/reports/quality/windows.html"  # the live windows plotted (`streamdi.report.windows`)


class FailFast(RuntimeError):
    """An error that retrying cannot fix (wrong input, a halted batch): the DAG tasks fail at once, without their
    retries, and the message says what to do."""


class BatchHalted(FailFast):
    """A batch is halted (by a data-quality policy): nothing after it may run until an operator acts."""


def dag_setting(name: str) -> str:
    """The value of a DAG_ENVIRONMENT variable, or its default."""
    default, _ = DAG_ENVIRONMENT[name]
    return os.environ.get(name) or default


def _settings(settings: Settings | None) -> Settings:
    """The settings a task runs with: the environment's (or `settings`), Spark on this home's embedded Spark Connect
    server unless STREAMDI_SPARK_REMOTE says otherwise (`streamdi.spark_connect.task_settings`)."""
    from streamdi.settings import SettingsError
    from streamdi.spark_connect import task_settings

    try:
        return task_settings(settings if settings is not None else load_settings())
    except SettingsError as exc:  # a retry reads the same environment
        raise FailFast(str(exc)) from None


def reports_dir(settings: Settings | None = None) -> Path:
    return (_settings(settings).home / "reports").absolute()


# ------------------------------------------------------------------------------------------------ delivery
def _sample_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("streamdi") / "sample"))


def deliver_reference_data(
    data_dir: str | Path | None = None, settings: Settings | None = None, *, scale_factor: float | None = None
) -> dict:
    """Put the reference files of `data_dir/Batch1` into `landing/Batch1/`. Without `data_dir`: those of the demo
    data set of `scale_factor` (generated first if needed, the one `deliver_data_batch` loads without a
    `data_dir`), or, without a scale factor either, of the reference sample bundled with streamdi.

    Files already delivered with the same bytes are left alone, so a later delivery of the whole Batch1 brings
    only the rest and the collector never registers a file twice.
    """
    from streamdi.delivery import place

    settings = _settings(settings)
    if data_dir:
        root = allowed_data_dir(data_dir, settings)
    elif scale_factor is not None:
        root = demo_data_set(scale_factor, 1, settings)
    else:
        root = _sample_dir()
    source = _batch_folder(root, 1)
    delivered = []
    missing = [name for name in REFERENCE_FILES if not (source / name).is_file()]
    if missing:
        raise FailFast(
            f"{source} lacks the reference file(s) {', '.join(missing)}: give a TPC-DI data set directory (folders "
            "Batch1, Batch2, ...), or leave the data directory empty for the demo data set"
        )
    for name in REFERENCE_FILES:
        with _landing_conflicts(root):
            if place(source / name, settings.landing_dir / "Batch1" / name):
                delivered.append(f"Batch1/{name}")
    log.info("reference data: delivered %d new file(s) from %s into %s", len(delivered), source, settings.landing_dir)
    return {"from": str(source), "delivered": delivered}


def allowed_data_dir(data_dir: str | Path, settings: Settings) -> Path:
    """`data_dir` (a DAG parameter: anyone who may trigger the DAG names it) resolved, when it lies inside one of the
    data roots (`STREAMDI_DATA_ROOTS` and `<STREAMDI_HOME>/data`) and holds no symbolic link that leads out of them;
    else FailFast. The path is checked before anything is read, so a refusal tells nothing about what exists."""
    if not isinstance(data_dir, str | Path):
        raise TypeError(f"data_dir must be a path, not {type(data_dir).__name__}")
    roots = settings.data_root_dirs
    folder = Path(data_dir).expanduser()

    def inside(path: Path) -> bool:
        real = path.resolve()
        return any(real == root or root in real.parents for root in roots)

    if not folder.is_absolute() or not inside(folder):
        raise FailFast(
            f"data_dir {data_dir} is outside the data roots ({', '.join(map(str, roots))}): put the data set under "
            "one of them, or add its parent directory to STREAMDI_DATA_ROOTS (':'-separated) in the workers' "
            "environment"
        )
    real = folder.resolve()
    if real.is_dir():
        for path in real.rglob("*"):
            if path.is_symlink() and not inside(path):
                raise FailFast(f"{path} is a symbolic link that leads outside the data roots; it is not read")
    return real


def _batch_folder(data_dir: Path, batch: int) -> Path:
    from streamdi.delivery import batch_dir

    try:
        return batch_dir(data_dir, batch)
    except FileNotFoundError as e:
        raise FailFast(
            f"{e}. Give a TPC-DI data set directory as the Airflow workers see it, or leave it empty "
            "for the demo data set"
        ) from e


@contextlib.contextmanager
def _landing_conflicts(data_dir: Path):
    """A file of `data_dir` whose name is taken in the landing zone by other bytes: a deterministic error."""
    try:
        yield
    except FileExistsError as e:
        raise FailFast(
            f"{e}. The landing zone already holds a file of that name from another data set (each streamdi home "
            f"loads one data set; {data_dir} is not the one loaded so far). Use the data directory (or, when it is "
            "empty, the scale factor) of the earlier runs, or a new STREAMDI_HOME for another data set"
        ) from e


def default_data_dir(scale_factor: float, settings: Settings | None = None) -> Path:
    """Where a demo data set of `scale_factor` lives: `<STREAMDI_HOME>/data/sf<scale_factor>` (as `streamdi demo`)."""
    return _settings(settings).home / "data" / f"sf{scale_factor:g}"


def demo_data_set(scale_factor: float, batch: int, settings: Settings | None = None) -> Path:
    """The demo data set of `scale_factor` (`default_data_dir`), generated first when its `Batch<batch>` is not
    there yet (a demo run from the UI needs nothing prepared)."""
    folder = default_data_dir(scale_factor, settings)
    if not (folder / f"Batch{batch}" / "BatchDate.txt").exists():
        from streamdi.generator import Params, generate

        log.info("generating a TPC-DI data set at scale factor %g into %s", scale_factor, folder)
        generate(Params(scale_factor=scale_factor), folder)
    return folder


def deliver_data_batch(
    data_dir: str | Path | None, batch: int, scale_factor: float, settings: Settings | None = None
) -> dict:
    """Deliver `data_dir/Batch<batch>` whole into the landing zone.

    Without `data_dir`, the data set is `<STREAMDI_HOME>/data/sf<scale_factor>`, generated first when it does not
    exist yet (a demo run from the UI needs nothing prepared). A missing folder or a file that clashes with one
    already landed raises FailFast (retrying cannot help).
    """
    from streamdi.delivery import deliver_batch

    settings = _settings(settings)
    folder = allowed_data_dir(data_dir, settings) if data_dir else demo_data_set(scale_factor, batch, settings)
    _batch_folder(folder, batch)
    with _landing_conflicts(folder):
        delivered = deliver_batch(folder, batch, settings.landing_dir)
    log.info("Batch%d: delivered %d new file(s) from %s into %s", batch, len(delivered), folder, settings.landing_dir)
    return {"data_dir": str(folder), "batch": batch, "delivered": len(delivered)}


# ------------------------------------------------------------------------------------------ batch log steps
def create_objects(settings: Settings | None = None) -> dict:
    """Create the Delta batch log and every PostgreSQL object (schemas, roles, ledger, `dw.*` tables, the
    `streamdi.quality_*` tables).

    The Delta warehouse tables are created by their first commit (T0..T4 of the first batch), which records the
    batch the migrator reads from each commit; an empty commit before it would carry no batch.
    """
    from schemas.warehouse import WAREHOUSE_TABLES
    from streamdi.batchlog import BatchLog
    from streamdi.context import open_context
    from streamdi.warehouse_model import PLATFORM_PG_TABLES, pg_qualified_name

    ctx = open_context(_settings(settings))
    BatchLog(ctx.lake)
    ctx.warehouse.ensure_objects(WAREHOUSE_TABLES)
    tables = [pg_qualified_name(t) for t in (*WAREHOUSE_TABLES, *PLATFORM_PG_TABLES)]
    log.info("batch log ready under %s; PostgreSQL tables ready: %s", ctx.settings.lake_root, ", ".join(tables))
    return {"lake": str(ctx.settings.lake_root), "postgres_tables": tables}


def collect_landed(settings: Settings | None = None) -> dict:
    """Register new landing files as micro-batches; return the new batch ids and the last batch id of the log."""
    from streamdi.batchlog import BatchLog
    from streamdi.context import open_context
    from streamdi.run.pipeline import collect_job

    ctx = open_context(_settings(settings))
    with lake_lease(ctx.lake.root):
        collected = collect_job(ctx)
        for name in collected.changed:
            log.warning("%s changed after it was collected; ignored", name)
        last = BatchLog(ctx.lake).last_batch_id()
        if collected.batch_ids:
            log.info("collected micro-batch(es) %s from %s", list(collected.batch_ids), ctx.settings.landing_dir)
        else:
            log.info("nothing new in %s; last micro-batch is %d", ctx.settings.landing_dir, last)
        return {"batch_ids": list(collected.batch_ids), "last_batch": last}


def halted_steps(batch_log) -> list[tuple[int, str]]:
    """(batch, stage) pairs whose latest state in the batch log is `halted`, oldest first (`BatchLog.halted`;
    the stage step halts a batch when a `halt` check fails)."""
    return [(h.batch_id, h.stage) for h in batch_log.halted()]


def check_not_halted(batch_log, up_to_batch: int | None = None) -> None:
    """Raise BatchHalted when a batch (up to `up_to_batch`) is halted: batches after it must not run. The message
    names the batch, the step and the reason, and the two commands an operator chooses between."""
    _refuse(batch_log.halted(), up_to_batch)


def _refuse(halts, up_to_batch: int | None) -> None:
    """BatchHalted for the first of `halts` (`streamdi.batchlog.Halt`) up to `up_to_batch`, if any."""
    halts = [h for h in halts if up_to_batch is None or h.batch_id <= up_to_batch]
    if halts:
        h = halts[0]
        raise BatchHalted(halted_message(h.batch_id, h.stage, h.reason, [(x.batch_id, x.stage) for x in halts]))


def halted_message(batch_id: int, stage: str, reason: str, halted: list[tuple[int, str]] | None = None) -> str:
    from streamdi.batchlog import operator_commands

    options = " or ".join(f"`{command}` ({what})" for command, what in operator_commands(batch_id, stage))
    return (
        f"micro-batch {batch_id} is HALTED at stage {stage!r} by a data-quality policy: "
        f"{reason or 'no reason recorded'}. "
        f"It and every later batch wait until an operator acts. After checking the data: {options}. "
        f"Failing checks: the quality report ({REPORT_URL_PATH}, `streamdi quality report`)."
        + (f" Halted: {halted}" if halted else "")
    )


def _scope(last_batch: int | None, last_stage: str, migration_mode: str):
    """The loop's scope (`streamdi.run.pipeline.Scope`) of a task: the pending steps up to (`last_batch`,
    `last_stage`); earlier batches run every stage, None means every batch up to `last_stage`. Migrate steps are
    left out in migration mode "none"."""
    from streamdi.run.pipeline import Scope

    if last_stage not in STAGES:
        raise FailFast(f"unknown stage {last_stage!r}; stages are {STAGES}")
    if migration_mode not in MIGRATION_MODES:
        raise FailFast(f"unknown migration mode {migration_mode!r}; modes are {MIGRATION_MODES}")
    return Scope(upto=last_stage, last_batch=last_batch, migrate=migration_mode != "none")


def _log_plan(plan: list[tuple[int, str]]) -> None:
    if plan:
        log.info("%d step(s) to run: %s", len(plan), ", ".join(f"batch {b} {s}" for b, s in plan))


def _log_step(step) -> None:
    name = step.part or step.stage
    detail = json.dumps(step.detail, sort_keys=True)
    log.info("batch %d %s done in %.1fs: %s", step.batch_id, name, round(step.seconds, 3), detail)


def _steps(steps) -> list[dict]:
    """The loop's steps (`streamdi.run.pipeline.StepResult`) as a task returns them (its XCom)."""
    return [
        {"batch_id": s.batch_id, "stage": s.stage, "seconds": round(s.seconds, 3), "detail": s.detail} for s in steps
    ]


def _raise_if_halted(report, last_batch: int | None) -> None:
    """BatchHalted when the loop's run met a halted batch up to `last_batch` before its first step, or a step halted
    its batch (the task fails there, naming the batch, step, reason and the operator's commands, instead of reporting
    success for a run that stopped)."""
    last = report.steps[-1] if report.steps else None
    if last is None or not last.detail.get("halted"):
        _refuse(report.halted, last_batch)
        return
    reason = str(last.detail["halted"])
    if last.part is not None:
        raise BatchHalted(halted_message(last.batch_id, "transform", reason))
    log.error(
        "batch %d %s HALTED after %.1fs; steps run before it: %s",
        last.batch_id,
        last.stage,
        round(last.seconds, 3),
        _steps(report.steps),
    )
    _refuse(report.halted, last.batch_id)
    raise BatchHalted(halted_message(last.batch_id, last.stage, reason))  # not in the log: say so anyway


def process_batches(
    last_batch: int | None = None,
    last_stage: str = "migrate",
    migration_mode: str = "push",
    settings: Settings | None = None,
    *,
    skip_when_idle: bool = False,
) -> dict:
    """Run the pending (batch, stage) steps of the batch log in its order (oldest batch first, stages in order) up to
    `last_batch`'s `last_stage` (None: every batch up to `last_stage`); `migration_mode="none"` leaves every
    migrate step to the `streamdi_migrate` DAG. This is the loop of `streamdi.run.pipeline.drive`, with its lease
    rules (a run of migrate steps alone takes none) and its maintenance at the end of a run up to the last stage.

    With `skip_when_idle`, a call that finds nothing to do up to any stage (not only `last_stage`) raises Airflow's
    skip exception, so an idle scheduled run is shown as skipped and emits no asset event.

    A halted batch up to `last_batch` raises BatchHalted before any step runs, and so does a step that halts its
    batch, right after it (`_raise_if_halted`). Returns the steps run, in order.
    """
    from streamdi.context import open_context
    from streamdi.run.pipeline import drive

    scope = _scope(last_batch, last_stage, migration_mode)
    ctx = open_context(_settings(settings))
    report = drive(ctx, scope, refuse_when_halted=True, on_plan=_log_plan, on_step=_log_step)
    _raise_if_halted(report, last_batch)
    if not report.plan:
        message = f"nothing pending up to batch {last_batch if last_batch is not None else 'any'}, stage {last_stage}"
        log.info(message)
        if skip_when_idle and not _scope(last_batch, STAGES[-1], migration_mode).plan(report.pending):
            _skip(message)  # nothing for the later tasks either (a later stage left by a failed run is not idle)
        return {"steps": []}
    result = {"steps": _steps(report.steps)}
    if last_stage == STAGES[-1]:
        result["maintained"] = report.maintained
    return result


def transform_step(
    last_batch: int,
    step: str,
    migration_mode: str = "push",
    settings: Settings | None = None,
    *,
    earlier: Iterable[dict | None] = (),
) -> dict:
    """One transaction step (T0 reference, T1 securities, T2 accounts, T3 trades, T4 market and watches, DM
    messages) of micro-batch `last_batch`: the DAGs' transform task group runs one task per step, in the graph's
    order (`streamdi.run.pipeline.transform_step_job`, run by the loop as a `TransformPart`).

    The first step (T0) first runs every step the batch log still has pending before it (earlier batches whole,
    `last_batch`'s stage), so the steps always work on the oldest transform left. A transform already done (a
    rerun of a finished run) runs nothing. The last step (DM) marks the transform done, with the `earlier` steps'
    results (their XComs) in its batch-log detail. A step that halts its batch raises BatchHalted.
    """
    from streamdi.context import open_context
    from streamdi.run.pipeline import TRANSFORM_STEPS, TransformPart, drive

    if step not in TRANSFORM_STEPS:
        raise FailFast(f"unknown transform step {step!r}; steps are {TRANSFORM_STEPS}")
    scope = _scope(last_batch, "stage", migration_mode)
    ctx = open_context(_settings(settings))
    part = TransformPart(step, tuple(earlier))
    report = drive(ctx, scope, part=part, refuse_when_halted=True, on_plan=_log_plan, on_step=_log_step)
    _raise_if_halted(report, last_batch)
    caught_up = _steps(s for s in report.steps if s.part is None)
    ran = [s for s in report.steps if s.part is not None]
    if not ran:
        return {"batch_id": last_batch, "step": step, "ran": False, "caught_up": caught_up}
    return {"batch_id": last_batch, "step": step, "ran": True, "caught_up": caught_up, **ran[0].detail}


def _skip(message: str) -> None:
    """Tell Airflow this task had nothing to do (shown as skipped, no asset event)."""
    from airflow.sdk.exceptions import AirflowSkipException

    raise AirflowSkipException(message)


def migrate_batches(last_batch: int | None, migration_mode: str, settings: Settings | None = None) -> dict:
    """Migration step of a load DAG: push mode migrates every pending batch up to `last_batch` (each batch in one
    PostgreSQL transaction, in order); mode "none" skips the task, leaving it to the `streamdi_migrate` DAG."""
    if migration_mode == "none":
        _skip("migration_mode=none: PostgreSQL is left to the streamdi_migrate DAG")
    return process_batches(last_batch, "migrate", migration_mode, settings)


def migrate_transformed(settings: Settings | None = None, *, skip_when_idle: bool = False) -> dict:
    """Push migration on its own schedule: make every batch whose transform is done visible in PostgreSQL, in batch
    order, stopping at the first batch not transformed yet (a later batch never becomes visible before it)."""
    from streamdi.batchlog import DONE, BatchLog
    from streamdi.context import open_context

    ctx = open_context(_settings(settings))
    progress = BatchLog(ctx.lake).progress()
    ready = None
    for b, stage in progress.pending:
        if stage != "migrate" or progress.states.get((b, "transform")) != DONE:
            break
        ready = b
    if ready is None:
        message = "nothing to migrate: no transformed batch is waiting for PostgreSQL"
        log.info(message)
        if skip_when_idle:
            _skip(message)
        return {"steps": []}
    return process_batches(ready, "migrate", "push", ctx.settings)


STREAM_ACTIONS = ("ensure", "check", "stop")


def supervise_stream(action: str = "ensure", settings: Settings | None = None) -> dict:
    """The stream service under Airflow (`streamdi_stream`): `ensure` starts it when it does not run (a process of
    its own session, which outlives the task) and waits until it serves; `check` only looks; `stop` asks it to finish
    its micro-batch in flight and stop. Returns its state, lag, last micro-batch, latency and rows/s (the task's
    XCom). A halted batch, or a service that `ensure` or `check` finds not running, fails the task at once: the
    message says what to do."""
    from streamdi.run.stream_status import supervise

    if action not in STREAM_ACTIONS:
        raise FailFast(f"unknown action {action!r}: one of {', '.join(STREAM_ACTIONS)}")
    settings = settings if settings is not None else load_settings()
    state = supervise(settings, action)
    log.info("stream service: %s", state)
    if state.get("halt"):
        raise BatchHalted(
            f"the stream is halted: {state['halt']}. It waits for an operator: check the data (`streamdi quality "
            "report`), then `streamdi batch resume K` (or `streamdi batch skip K --reason TEXT` for a batch halted in "
            "staging); the service goes on by itself."
        )
    if action in ("ensure", "check") and not state["running"]:
        raise FailFast(
            f"the stream service does not run ({state['state']}): trigger streamdi_stream with action=ensure, or run "
            "`streamdi stream`; its log is <STREAMDI_HOME>/stream/service.log"
        )
    return state


# ----------------------------------------------------------------------------------------- checks and audit
def validate_staged(last_batch: int | None = None, settings: Settings | None = None) -> dict:
    """The checks that run before the transform (the suites themselves run inside the stage step): every staged
    batch up to `last_batch` is not halted, and its counts reconcile (lines read = staged + rejected +
    quarantined).

    Raises FailFast naming the batch when counts do not reconcile; files that match no declared source are
    logged as warnings.
    """
    from streamdi.batchlog import BatchLog
    from streamdi.lake import Lake

    settings = _settings(settings)
    lake = Lake(settings.lake_root)
    batch_log = BatchLog(lake)
    check_not_halted(batch_log, last_batch)
    checked = []
    for b, detail in batch_log.done_details("stage").items():
        if last_batch is not None and b > last_batch:
            continue
        accounted = sum(detail.get(k, 0) for k in ("staged", "rejected", "quarantined", "held"))
        if detail.get("read") != accounted:
            raise FailFast(
                f"micro-batch {b}: lines read do not reconcile with staged + rejected + quarantined: {detail}"
            )
        for name in detail.get("unknown_files", []):
            log.warning("micro-batch %d: %s matches no declared source and was not staged", b, name)
        log.info(
            "micro-batch %d: read %s = staged %s + rejected %s + quarantined %s",
            b,
            detail["read"],
            detail["staged"],
            detail["rejected"],
            detail.get("quarantined", 0),
        )
        checked.append({"batch_id": b, **{k: detail.get(k, 0) for k in ("read", "staged", "rejected", "quarantined")}})
    return {"batches": checked}


def audit_warehouse(settings: Settings | None = None) -> dict:
    """Run the TPC-DI audit on the PostgreSQL warehouse against the staged audit figures and write it to
    `<STREAMDI_HOME>/reports/audit.txt`. It reports and does not fail the run: failed checks are logged as
    warnings and counted in the result (a partial data set fails checks of the tables it lacks); policies that
    stop batches belong to the data-quality suites."""
    from jobs.audit import run_audit
    from streamdi.context import open_context

    ctx = open_context(_settings(settings))
    report = run_audit(ctx)
    text = report.render(width=160)
    out = reports_dir(ctx.settings)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.txt").write_text(text)
    log.info("TPC-DI audit (also in %s):\n%s", out / "audit.txt", text)
    for c in report.failed:
        log.warning("audit check failed: %s%s: %s", c.name, f" (batch {c.batch})" if c.batch else "", c.detail)
    return {
        "ok": sum(1 for c in report.checks if c.ok),
        "failed": [c.name + (f" (batch {c.batch})" if c.batch else "") for c in report.failed],
        "skipped": len(report.skipped),
    }


# ------------------------------------------------------------------------------------------------- report
def write_report_pages(settings: Settings | None = None, now: dt.datetime | None = None):
    """Write the data-quality report (`<STREAMDI_HOME>/reports/quality/index.html`, the page `REPORT_URL_PATH` serves,
    with Great Expectations Data Docs under `quality/data_docs/`) and the batch-log page
    (`<STREAMDI_HOME>/reports/index.html`, `BATCH_LOG_URL_PATH`: batches x stages with their states), each
    atomically. Returns the report's outcome (`streamdi.report.ReportOutcome`), the batch-log page and its
    number of micro-batches."""
    from streamdi.batchlog import BatchLog
    from streamdi.lake import Lake
    from streamdi.report import render_batch_log, report_dir, write_report

    settings = _settings(settings)
    lake = Lake(settings.lake_root)
    now = now or dt.datetime.now(dt.UTC)
    outcome = write_report(lake, report_dir(settings.home), now=now)
    rows = BatchLog(lake).summary()
    out = reports_dir(settings)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(render_batch_log(rows, now))
    tmp.replace(page)
    return outcome, page, len(rows)


def write_quality_report(settings: Settings | None = None) -> dict:
    """The quality-report DAG's task: `write_report_pages`, logged; returns what the pages hold."""
    from streamdi.report import describe

    outcome, page, batches = write_report_pages(settings)
    for line in describe(outcome):
        log.info("%s", line)
    for b in outcome.summary.halted:
        log.warning("micro-batch %d is halted: see %s", b, REPORT_URL_PATH)
    log.info("batch-log page with %d micro-batch(es) written to %s; UI: %s", batches, page, BATCH_LOG_URL_PATH)
    return {
        "path": str(outcome.index),
        "url": REPORT_URL_PATH,
        "summary": outcome.summary.line(),
        "data_docs_pages": outcome.pages,
        "halted": list(outcome.summary.halted),
        "batch_log_page": str(page),
        "batches": batches,
        "seconds": outcome.seconds,
    }
