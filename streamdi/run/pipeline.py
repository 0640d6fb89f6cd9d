"""The batch dataflow: collect -> stage -> transform -> migrate, driven by the batch log.

Each stage is one job function taking the context and a batch id; the CLI and the Airflow DAGs call these
same functions. `run_pending` does everything that is left, oldest batch first and in stage order, and
records each finished stage in the batch log, so after a crash the next call resumes where it stopped.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from jobs import stage, transform
from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.batchlog import STAGES, BatchLog, Halt, wall_clock
from streamdi.collector import CollectResult, collect
from streamdi.context import JobContext
from streamdi.faults import fault_point
from streamdi.locks import lake_lease
from streamdi.migrator import migrate_batch
from streamdi.quality import summarize, warm_up

log = logging.getLogger(__name__)


def _leased(job):
    """Run `job` holding the lake's runner lease (`streamdi.locks`): a second runner is refused, not interleaved.

    The migrate stage takes none: it only reads batches whose transform is done, and migrations serialise on
    PostgreSQL's advisory lock and the ledger, so a separate migrator (`streamdi migrate --every`, the
    `streamdi_migrate` DAG) may run beside a loading pipeline."""

    @functools.wraps(job)
    def leased(ctx: JobContext, *args, **kwargs):
        with lake_lease(ctx.lake.root):
            return job(ctx, *args, **kwargs)

    return leased


@_leased
def collect_job(ctx: JobContext, hold: Callable[[list[str], set[str]], set[str]] | None = None) -> CollectResult:
    """Register new landing files as the next micro-batch (`hold`: see `streamdi.collector.collect`)."""
    ctx.settings.landing_dir.mkdir(parents=True, exist_ok=True)
    return collect(BatchLog(ctx.lake), ctx.settings.landing_dir, now=wall_clock(), hold=hold)


@_leased
def stage_job(ctx: JobContext, batch_id: int) -> dict:
    """Parse and validate the batch's files into staging. A failed halt check halts the batch in the batch log
    (the detail then has `halted`, the reason); otherwise the stage is marked done."""
    warm_up()  # Great Expectations imports while Spark parses
    batch_log = BatchLog(ctx.lake)
    every = list(batch_log.registered_files().values())  # one read of the batch log's files serves both below
    registered = sorted(every, key=lambda f: (f.batch_id, f.file_seq))
    earlier = {}
    for f in registered:
        if f.batch_id < batch_id:
            earlier.setdefault((f.source_batch, f.sha256), f.file)
    report = stage.run(
        ctx,
        batch_id,
        [f for f in every if f.batch_id == batch_id],  # as `BatchLog.files` gives them
        attempt=batch_log.resumes(batch_id, "stage"),
        earlier=earlier,
        registered_before=[f.file for f in registered if f.batch_id < batch_id],
    )
    detail = {
        "read": report.read,
        "staged": report.staged,
        "rejected": report.rejected,
        "quarantined": report.quarantined,
        "held": report.held,
        "checks": summarize(report.checks),
        "audit_files": len(report.audit_files),
        "unknown_files": report.unknown_files,
        "duplicates": report.duplicates,
    }
    fault_point("pipeline.before_mark_stage")
    if report.halts:
        detail["halted"] = "; ".join(report.halts)
        batch_log.halt(batch_id, "stage", detail["halted"], now=wall_clock())
        log.warning("micro-batch %s halted: %s", batch_id, detail["halted"])
        return detail
    batch_log.mark(batch_id, "stage", "done", now=wall_clock(), detail=detail)
    return detail


@_leased
def transform_job(ctx: JobContext, batch_id: int) -> dict:
    """Run the transaction graph, each step followed by its warehouse suites. A failed halt check halts the
    batch's transform in the batch log (its later steps and its migration wait for an operator; the detail then
    has `halted`); otherwise the stage is marked done."""
    warm_up()  # the warehouse suites need Great Expectations after the first step
    ctx.start_spark()  # the JVM starts while the step reads its scope and the reference data
    batch_log = BatchLog(ctx.lake)
    report = transform.run(ctx, batch_id, attempt=batch_log.resumes(batch_id, "transform"))
    detail = {"rows": report.rows, "seconds": report.seconds, "checks": summarize(report.outcomes())}
    fault_point("pipeline.before_mark_transform")
    if report.halts:
        detail["halted"] = "; ".join(report.halts)
        batch_log.halt(batch_id, "transform", detail["halted"], now=wall_clock())
        log.warning("micro-batch %s halted: %s", batch_id, detail["halted"])
        return detail
    batch_log.mark(batch_id, "transform", "done", now=wall_clock(), detail=detail)
    detail["compacted"] = compact_job(ctx)
    return detail


TRANSFORM_STEPS: tuple[str, ...] = tuple(step.name for step in transform.STEPS)  # in dependency order


@_leased
def transform_step_job(ctx: JobContext, batch_id: int, step: str, *, earlier: Iterable[dict] = ()) -> dict:
    """One step of the transaction graph (`jobs.transform.STEPS`) as a job of its own: the Airflow DAGs run each
    step as a task, in the graph's order. Like `transform_job`, a failed halt check halts the batch's transform in
    the batch log (the detail then has `halted`). The last step (DM) marks the transform done, with the rows,
    seconds and checks of the steps' `earlier` details merged into its own, and compacts the lake. A step whose
    commits for the micro-batch are recorded (a retry, a rerun) redoes none of them."""
    declared = next((s for s in transform.STEPS if s.name == step), None)
    if declared is not None and declared.spark:
        ctx.start_spark()  # the JVM (or the Spark Connect session) starts while the step reads its scope
    if declared is not None and declared.checked:
        warm_up()  # its warehouse suites need Great Expectations: imported meanwhile
    batch_log = BatchLog(ctx.lake)
    attempt = batch_log.resumes(batch_id, "transform")
    report = transform.run_step(ctx, batch_id, step, attempt=attempt)
    detail = {"rows": report.rows, "seconds": report.seconds, "checks": summarize(report.outcomes())}
    if report.halts:
        detail["halted"] = "; ".join(report.halts)
        batch_log.halt(batch_id, "transform", detail["halted"], now=wall_clock())
        log.warning("micro-batch %s halted after step %s: %s", batch_id, step, detail["halted"])
        return detail
    if step != TRANSFORM_STEPS[-1]:
        return detail
    whole: dict[str, dict] = {"rows": {}, "seconds": {}, "checks": {}}
    for part in (*earlier, detail):
        whole["rows"].update(part.get("rows") or {})
        whole["seconds"].update(part.get("seconds") or {})
        for action, n in (part.get("checks") or {}).items():
            whole["checks"][action] = whole["checks"].get(action, 0) + n
    fault_point("pipeline.before_mark_transform")
    batch_log.mark(batch_id, "transform", "done", now=wall_clock(), detail=whole)
    detail["compacted"] = compact_job(ctx)
    return detail


@_leased
def compact_job(ctx: JobContext) -> dict[str, int]:
    """Compact the lake's tables that have piled up `compact_small_files` small files (`Lake.compact`): after a
    micro-batch's transform, so the next micro-batch reads few files. The micro-batch's data is committed and
    marked done first; compaction changes no rows, and a table it cannot compact is logged and retried after
    the next micro-batch."""
    return ctx.lake.compact(ctx.settings.compact_small_files)


@_leased
def maintain_job(ctx: JobContext) -> dict[str, int]:
    """Checkpoint, clean up and vacuum the tables that are `checkpoint_every` commits past their last checkpoint
    (`Lake.maintain`), so a long-running lake stays small and quick to open. Only when nothing is pending in the
    batch log (no reader still needs an older file); returns the data files deleted per table maintained."""
    if BatchLog(ctx.lake).pending():
        return {}
    return ctx.lake.maintain(ctx.settings.checkpoint_every, ctx.settings.vacuum_retention_hours)


def migrate_job(ctx: JobContext, batch_id: int) -> dict:
    """Push mode: make the batch visible in PostgreSQL (with any earlier batch not yet visible) in one
    transaction. When a pull or `streamdi migrate` already made it visible this costs one query, and the stage
    is still marked done."""
    batch_log = BatchLog(ctx.lake)
    warehouse = ctx.warehouse
    warehouse.ensure_objects(WAREHOUSE_TABLES)
    report = migrate_batch(ctx.lake, warehouse, batch_id, mode="push")
    detail = {"rows": report.tables, "versions": report.versions, "batches": list(report.batches)}
    fault_point("pipeline.before_mark_migrate")
    batch_log.mark(batch_id, "migrate", "done", now=wall_clock(), detail=detail)
    return detail


STAGE_JOBS: dict[str, Callable[[JobContext, int], dict]] = {
    "stage": stage_job,
    "transform": transform_job,
    "migrate": migrate_job,
}


@dataclass
class StepResult:
    batch_id: int
    stage: str
    detail: dict
    seconds: float


@dataclass
class RunReport:
    collected: CollectResult
    steps: list[StepResult] = field(default_factory=list)
    halted: list[Halt] = field(default_factory=list)  # halted stages that stop the run (nothing after them ran)
    maintained: dict[str, int] = field(default_factory=dict)  # tables maintained at the end (`maintain_job`)

    @property
    def nothing_to_do(self) -> bool:
        return self.collected.batch_id is None and not self.steps


def run_pending(
    ctx: JobContext,
    *,
    on_collect: Callable[[CollectResult], None] | None = None,
    on_plan: Callable[[list[tuple[int, str]]], None] | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    upto: str = "migrate",
    stop_before_batch: Callable[[], bool] | None = None,
    hold: Callable[[list[str], set[str]], set[str]] | None = None,
) -> RunReport:
    """Collect new files, then run every pending (batch, stage) in order until all are done.

    `upto` stops each batch after that stage (e.g. "transform": build the Delta warehouse, leave PostgreSQL
    alone); the stages left out stay pending in the batch log. A halted stage stops the run: nothing after it
    runs (`RunReport.halted` says which) until an operator resumes it or skips its batch. `stop_before_batch`
    (the stream service's stop request) is asked before each batch's first pending stage: when it says so, the run
    ends there, with the batch in flight finished and the later ones left pending. `hold` is the collector's
    (`streamdi.collector.collect`). The run holds the lake's runner lease throughout (`streamdi.locks`): another
    runner meanwhile is refused with LakeBusy.
    """
    with lake_lease(ctx.lake.root):
        return _run_pending(ctx, on_collect, on_plan, on_step, upto, stop_before_batch, hold)


def _run_pending(ctx, on_collect, on_plan, on_step, upto, stop_before_batch, hold) -> RunReport:
    last = STAGES.index(upto)
    collected = collect_job(ctx, hold)
    if on_collect:
        on_collect(collected)
    batch_log = BatchLog(ctx.lake)
    plan = [(b, stage) for b, stage in batch_log.pending() if STAGES.index(stage) <= last]
    if on_plan:
        on_plan(plan)
    if any(stage_name == "transform" for _, stage_name in plan):
        ctx.start_spark()  # the JVM starts on the idle core while staging parses and imports
    if any(stage_name == "migrate" for _, stage_name in plan):
        ctx.start_warehouse()  # PostgreSQL starts while the earlier stages run
    report = RunReport(collected=collected)
    in_flight = None
    for batch_id, stage_name in plan:
        if batch_id != in_flight and stop_before_batch is not None and in_flight is not None and stop_before_batch():
            break
        in_flight = batch_id
        started = time.perf_counter()
        detail = STAGE_JOBS[stage_name](ctx, batch_id)
        step = StepResult(batch_id, stage_name, detail, time.perf_counter() - started)
        report.steps.append(step)
        if on_step:
            on_step(step)
        if detail.get("halted"):
            break  # the stage halted its batch: nothing after it may run
    report.halted = batch_log.halted()
    if last == len(STAGES) - 1 and not report.halted:
        report.maintained = maintain_job(ctx)
    return report
