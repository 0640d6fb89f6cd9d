"""The batch dataflow: collect -> stage -> transform -> migrate, driven by the batch log.

Each stage is one job function taking the context and a batch id (`collect_job`, `stage_job`, `transform_job` or
its steps one by one with `transform_step_job`, `migrate_job`; `compact_job` and `maintain_job` keep the lake small).
One loop drives them (`drive`, at the end of this module): the CLI's `streamdi load`/`run` and the stream service
through `run_pending`, the Airflow tasks through `streamdi.run.orchestration`. It does what is left, oldest batch
first and in stage order, and every job records its finished stage in the batch log, so after a crash the next call
resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from jobs import stage, transform
from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.batchlog import FINISHED, STAGES, BatchLog, Halt, wall_clock
from streamdi.collector import CollectResult, collect
from streamdi.context import JobContext
from streamdi.faults import fault_point
from streamdi.landing_cleanup import CHECK_EVERY_SECONDS, clean_landing
from streamdi.locks import LakeBusy, lake_lease
from streamdi.migrator import MigrationReport, TransformAbandoned, TransformProgress, migrate_batch
from streamdi.pools import kept_pool
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
    return collect(BatchLog(ctx.lake), ctx.settings.landing_dir, now=wall_clock(), hold=hold, listing=ctx.landing)


@_leased
def stage_job(ctx: JobContext, batch_id: int) -> dict:
    """Parse and validate the batch's files into staging. A failed halt check halts the batch in the batch log
    (the detail then has `halted`, the reason); otherwise the stage is marked done."""
    warm_up()  # Great Expectations imports while Spark parses
    batch_log = BatchLog(ctx.lake)
    report = stage.run(
        ctx,
        batch_id,
        batch_log.files(batch_id),
        attempt=batch_log.resumes(batch_id, "stage"),
        registered=batch_log.before(batch_id),
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
def transform_job(
    ctx: JobContext, batch_id: int, *, progress: TransformProgress | None = None, compact: bool = True
) -> dict:
    """Run the transaction graph, each step followed by its warehouse suites. A failed halt check halts the
    batch's transform in the batch log (its later steps and its migration wait for an operator; the detail then
    has `halted`); otherwise the stage is marked done, and the lake compacted (`compact_job`) unless `compact` is
    False. `progress` hears of each step's finished tables (`jobs.transform.Step.final`) as soon as the step has
    committed them, before its checks, and of a table a step finished before its end (`BatchScope.finished`), for a
    migration running beside (`MigrationBeside`)."""
    warm_up()  # the warehouse suites need Great Expectations after the first step
    batch_log = BatchLog(ctx.lake)
    finals = {step.name: step.final for step in transform.STEPS}
    report = transform.run(
        ctx,
        batch_id,
        attempt=batch_log.resumes(batch_id, "transform"),
        on_committed=None if progress is None else lambda step: progress.finished(finals[step]),
        on_finished=None if progress is None else progress.finished,
    )
    detail = {"rows": report.rows, "seconds": report.seconds, "checks": summarize(report.outcomes())}
    fault_point("pipeline.before_mark_transform")
    if report.halts:
        detail["halted"] = "; ".join(report.halts)
        batch_log.halt(batch_id, "transform", detail["halted"], now=wall_clock())
        log.warning("micro-batch %s halted: %s", batch_id, detail["halted"])
        return detail
    batch_log.mark(batch_id, "transform", "done", now=wall_clock(), detail=detail)
    if compact:
        detail["compacted"] = compact_job(ctx, written_only=True)
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
def compact_job(ctx: JobContext, *, written_only: bool = False) -> dict[str, int]:
    """Compact the lake's tables that have piled up `compact_small_files` small files (`Lake.compact`): after a
    micro-batch's transform, so the next micro-batch reads few files. The micro-batch's data is committed and
    marked done first; compaction changes no rows, and a table it cannot compact is logged and retried after
    the next micro-batch. `written_only` looks only at the tables this process committed to since its last
    compaction: for a process that staged and transformed the micro-batch itself (not an Airflow step task, whose
    steps' commits were made by other processes)."""
    return ctx.lake.compact(ctx.settings.compact_small_files, written_only=written_only)


@_leased
def maintain_job(ctx: JobContext, *, pending: list[tuple[int, str]] | None = None) -> dict[str, int]:
    """Checkpoint, clean up and vacuum the tables that are `checkpoint_every` commits past their last checkpoint
    (`Lake.maintain`), so a long-running lake stays small and quick to open. Only when nothing is pending in the
    batch log (no reader still needs an older file); then deletes the landing files of micro-batches finished
    `landing_retention_hours` ago (`streamdi.landing_cleanup`). Returns the data files deleted per table maintained
    and, as "landing", the landing files deleted.
    `pending`: what a caller that held the lease since it read the batch log knows is left (default: read here)."""
    if BatchLog(ctx.lake).pending() if pending is None else pending:
        return {}
    done = ctx.lake.maintain(ctx.settings.checkpoint_every, ctx.settings.vacuum_retention_hours)
    cleaned = _clean_landing(ctx)
    if cleaned:
        done["landing"] = cleaned
    return done


def _clean_landing(ctx: JobContext) -> int:
    """`landing_cleanup.clean_landing` at a process's first maintenance, then (a stream maintains after every
    micro-batch) at most every tenth of the retention, and every `CHECK_EVERY_SECONDS` at the most; the files it
    deleted."""
    hours, cleanup = ctx.settings.landing_retention_hours, ctx.landing_cleanup
    now = time.monotonic()
    if hours is None:
        return 0
    every = min(CHECK_EVERY_SECONDS, hours * 3600 / 10)
    if cleanup.looked_at is not None and now - cleanup.looked_at < every:
        return 0
    cleanup.looked_at = now
    landing = ctx.settings.landing_dir
    return clean_landing(BatchLog(ctx.lake), landing, hours, now=wall_clock(), cleanup=cleanup).files


def migrate_job(ctx: JobContext, batch_id: int, *, beside: Future[MigrationReport] | None = None) -> dict:
    """Push mode: make the batch visible in PostgreSQL (with any earlier batch not yet visible) in one
    transaction. When a pull or `streamdi migrate` already made it visible this costs one query, and the stage
    is still marked done. `beside`: the migration already running beside the transform (`MigrationBeside`),
    whose end this waits for instead."""
    batch_log = BatchLog(ctx.lake)
    report = _migrate(ctx, batch_id) if beside is None else beside.result()
    detail = {"rows": report.tables, "versions": report.versions, "batches": list(report.batches)}
    fault_point("pipeline.before_mark_migrate")
    batch_log.mark(batch_id, "migrate", "done", now=wall_clock(), detail=detail)
    return detail


def _migrate(ctx: JobContext, batch_id: int, beside: TransformProgress | None = None) -> MigrationReport:
    warehouse = ctx.warehouse
    warehouse.ensure_objects(WAREHOUSE_TABLES)
    return migrate_batch(ctx.lake, warehouse, batch_id, mode="push", beside=beside)


class MigrationBeside:
    """A micro-batch's transform with its migration running beside it, for a run that does both (`drive`): the
    migration's transaction opens when the transform starts, lands each table as soon as the step that writes it is
    done (`jobs.transform.Step.final`), and commits once the transform is marked done -- the batch still becomes
    visible whole or not at all. The transform's Python and Arrow work and PostgreSQL's COPY and index builds then
    share the machine's cores instead of taking turns. A transform that fails or halts rolls the migration back; the
    migrate step then runs again later, as it would have. The lake is compacted after the migration's commit, not
    before it: compaction (0.1-0.6 s of a micro-batch at SF 6) does not delay the batch's visibility. Off with
    `migrate_beside_transform` (settings)."""

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id
        self._progress = TransformProgress()
        self._migration: Future[MigrationReport] | None = None

    def transform_job(self, ctx: JobContext, batch_id: int) -> dict:
        # one thread kept for the process's life: the Delta tables it opens are caught up at the next micro-batch
        self._migration = kept_pool("migrate", 1).submit(_migrate, ctx, batch_id, self._progress)
        try:
            detail = transform_job(ctx, batch_id, progress=self._progress, compact=False)
        except BaseException:
            self._abandon("the transform failed")
            raise
        if detail.get("halted"):
            self._abandon("the transform halted")
        else:
            self._progress.done()
        return detail

    def migrate_job(self, ctx: JobContext, batch_id: int) -> dict:
        assert self._migration is not None, "the transform runs first"
        detail = migrate_job(ctx, batch_id, beside=self._migration)
        detail["compacted"] = compact_job(ctx, written_only=True)  # left for after the batch is visible
        return detail

    def _abandon(self, reason: str) -> None:
        """Roll the migration back and wait for it to end (a failure of its own is logged, not raised: the
        transform's outcome is what the run reports)."""
        self._progress.abandon(reason)
        assert self._migration is not None
        wait([self._migration])
        failure = self._migration.exception()
        if failure is not None and not isinstance(failure, TransformAbandoned):
            log.warning("micro-batch %s: the migration beside the transform failed: %s", self.batch_id, failure)


def _beside(ctx: JobContext, plan: list[tuple[int, str]], i: int) -> bool:
    """Whether `drive` runs the plan's step i (a transform) with its batch's migration beside it: the migrate step
    follows it in the plan."""
    batch_id, stage_name = plan[i]
    return (
        stage_name == "transform"
        and ctx.settings.migrate_beside_transform
        and plan[i + 1 : i + 2] == [(batch_id, "migrate")]
    )


STAGE_JOBS: dict[str, Callable[[JobContext, int], dict]] = {
    "stage": stage_job,
    "transform": transform_job,
    "migrate": migrate_job,
}


# ------------------------------------------------------------------------------------------------ the one loop
@dataclass(frozen=True)
class Scope:
    """Which of the batch log's pending (batch, stage) steps a run takes; it never changes their order."""

    upto: str = "migrate"  # the last stage run for `last_batch` (for every batch when `last_batch` is None)
    last_batch: int | None = None  # later batches are left pending; earlier ones run every stage
    migrate: bool = True  # False: migrate steps are left to another runner (the DAGs' migration mode "none")

    def takes(self, batch_id: int, stage: str) -> bool:
        if stage == "migrate" and not self.migrate:
            return False
        if self.last_batch is None or batch_id == self.last_batch:
            return STAGES.index(stage) <= STAGES.index(self.upto)
        return batch_id < self.last_batch

    def plan(self, pending: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
        return [(b, stage) for b, stage in pending if self.takes(b, stage)]

    def halts(self, halted: Iterable[Halt]) -> list[Halt]:
        """The halts that stop this scope: those of batches up to its last batch."""
        return [h for h in halted if self.last_batch is None or h.batch_id <= self.last_batch]


@dataclass(frozen=True)
class TransformPart:
    """One step of `last_batch`'s transaction graph as a run of its own (the DAGs' transform task group):
    `drive` runs it after the steps its scope takes, with the details of the steps before it (`earlier`)."""

    step: str
    earlier: tuple[dict, ...] = ()


@dataclass
class StepResult:
    batch_id: int
    stage: str
    detail: dict
    seconds: float
    part: str | None = None  # the transform step, for a `TransformPart`


@dataclass
class RunReport:
    collected: CollectResult = field(default_factory=lambda: CollectResult(None))
    pending: list[tuple[int, str]] = field(default_factory=list)  # the batch log's pending steps when the run began
    plan: list[tuple[int, str]] = field(default_factory=list)  # those the run's scope took
    steps: list[StepResult] = field(default_factory=list)
    halted: list[Halt] = field(default_factory=list)  # halted stages that stop the run (nothing after them ran)
    maintained: dict[str, int] = field(default_factory=dict)  # tables maintained at the end (`maintain_job`)

    @property
    def nothing_to_do(self) -> bool:
        return self.collected.batch_id is None and not self.steps


def drive(
    ctx: JobContext,
    scope: Scope = Scope(),
    *,
    collect: bool = False,
    hold: Callable[[list[str], set[str]], set[str]] | None = None,
    part: TransformPart | None = None,
    refuse_when_halted: bool = False,
    on_collect: Callable[[CollectResult], None] | None = None,
    on_plan: Callable[[list[tuple[int, str]]], None] | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    stop_before_batch: Callable[[], bool] | None = None,
) -> RunReport:
    """The one loop that drives micro-batches from the collector to the migration ledger; `streamdi load`/`run`
    (`run_pending`), the stream service (`streamdi.run.stream`, through `run_pending`) and the Airflow tasks
    (`streamdi.run.orchestration`) all run it. Top to bottom:

    1. The lake's runner lease (`streamdi.locks`): taken first when the run collects or runs a transform part, else
       as soon as the plan holds a step other than migrate (migrations serialise in PostgreSQL: see `_leased`).
    2. Collect (`collect`): new landing files become the next micro-batches (`hold`: `streamdi.collector.collect`).
    3. One read of the batch log (`BatchLog.progress`), again only when the lease came after it.
    4. Halts: with `refuse_when_halted` (the Airflow tasks) a halted batch up to the scope's last batch stops the
       run before any step (`RunReport.halted`); otherwise the pending list already ends before a halted stage.
       A halt found or made by the run is in `RunReport.halted` (read again only after a step halted).
    5. The plan: the pending steps the `scope` takes, in the log's order (oldest batch first, stages in order);
       Spark and PostgreSQL start in the background when the plan will need them.
    6. Each step in turn: `stage_job` -> `transform_job` (T0..T4, AG, DM) -> `migrate_job`; each marks itself done
       in the batch log (the migrate step also in the ledger). `stop_before_batch` is asked before each later
       batch; a step that halts its batch ends the loop. A transform followed by its batch's migrate step runs with
       the migration beside it (`MigrationBeside`): the migrate step then waits for that migration's commit. With a
       `part`, the scope's steps are the catch-up (only for the graph's first step) and the part
       (`transform_step_job`) runs last, unless the transform is finished already; it needs its batch staged.
    7. Maintenance (`maintain_job`) at the end of a run up to the last stage that met no halt up to its last batch,
       ran a step or collected, and left nothing pending; skipped while another runner holds the lake.
    """
    if part is not None and scope.last_batch is None:
        raise ValueError(f"the transform step {part.step} needs the scope's last batch")
    with contextlib.ExitStack() as lease:
        leased = collect or part is not None
        if leased:
            lease.enter_context(lake_lease(ctx.lake.root))
        report = RunReport()
        if collect:
            report.collected = collect_job(ctx, hold)
            if on_collect:
                on_collect(report.collected)

        batch_log = BatchLog(ctx.lake)
        progress = batch_log.progress()
        if not leased and any(stage != "migrate" for _, stage in scope.plan(progress.pending)):
            lease.enter_context(lake_lease(ctx.lake.root))
            leased = True
            progress = batch_log.progress()  # the runner that held the lease may have advanced the log meanwhile
        report.pending = progress.pending

        if refuse_when_halted and scope.halts(progress.halted):
            report.halted = scope.halts(progress.halted)
            return report

        report.plan = scope.plan(progress.pending) if part is None or part.step == TRANSFORM_STEPS[0] else []
        if on_plan:
            on_plan(report.plan)
        if any(stage_name == "migrate" for _, stage_name in report.plan):
            ctx.start_warehouse()  # PostgreSQL starts while the earlier stages run

        in_flight = None
        beside: MigrationBeside | None = None
        for i, (batch_id, stage_name) in enumerate(report.plan):
            if batch_id != in_flight and in_flight is not None and stop_before_batch and stop_before_batch():
                break
            in_flight = batch_id
            job = STAGE_JOBS[stage_name]
            if _beside(ctx, report.plan, i):
                beside = MigrationBeside(batch_id)
                job = beside.transform_job
            elif beside is not None and (batch_id, stage_name) == (beside.batch_id, "migrate"):
                job = beside.migrate_job
            step = _run(ctx, batch_id, stage_name, job, on_step)
            report.steps.append(step)
            if step.detail.get("halted"):
                break  # the stage halted its batch: nothing after it may run
            if stage_name == "stage" and all(s != "stage" for _, s in report.plan[i + 1 :]):
                ctx.spark_done()  # the transform and the migration run on Arrow: only a stage uses Spark
        if part is not None and not _halted(report):
            _run_part(ctx, scope.last_batch, part, progress.states, report, on_step)

        report.halted = batch_log.halted() if _halted(report) else progress.halted
        if scope.upto == STAGES[-1] and part is None and not scope.halts(report.halted) and (collect or report.plan):
            left = [s for s in progress.pending if s not in _done(report)] if leased else None
            report.maintained = _maintain(ctx, left)
        return report


def _run_part(ctx: JobContext, batch_id: int, part: TransformPart, states: dict, report: RunReport, on_step) -> None:
    """`drive`'s transform part: `transform_step_job` on `batch_id` (`states`: the batch log's, before the run)."""
    if states.get((batch_id, "transform")) in FINISHED:
        state = states[(batch_id, "transform")]
        log.info("micro-batch %d: transform is %s; step %s has nothing to do", batch_id, state, part.step)
        return
    if states.get((batch_id, "stage")) not in FINISHED and (batch_id, "stage") not in _done(report):
        raise RuntimeError(f"micro-batch {batch_id} is not staged yet: step {part.step} runs after the stage task")
    job = functools.partial(transform_step_job, step=part.step, earlier=[e for e in part.earlier if e])
    report.steps.append(_run(ctx, batch_id, "transform", job, on_step, part=part.step))


def _run(ctx: JobContext, batch_id: int, stage: str, job: Callable, on_step, part: str | None = None) -> StepResult:
    """One step of `drive`: the job, timed, reported to `on_step`."""
    started = time.perf_counter()
    detail = job(ctx, batch_id)
    step = StepResult(batch_id, stage, detail, time.perf_counter() - started, part)
    if on_step:
        on_step(step)
    return step


def _halted(report: RunReport) -> bool:
    """Whether a step of the run halted its batch (it is the last step then)."""
    return bool(report.steps) and bool(report.steps[-1].detail.get("halted"))


def _done(report: RunReport) -> set[tuple[int, str]]:
    """The (batch, stage) steps the run finished (a transform part finishes nothing but the last step)."""
    return {(s.batch_id, s.stage) for s in report.steps if not s.detail.get("halted") and s.part is None}


def _maintain(ctx: JobContext, left: list[tuple[int, str]] | None) -> dict[str, int]:
    """`maintain_job`, told what is `left` pending when the run held the lease throughout (None: it reads the log),
    and skipped while another runner holds the lake (that runner maintains at its own end)."""
    try:
        return maintain_job(ctx, pending=left)
    except LakeBusy as exc:
        log.info("maintenance skipped: %s", exc)
        return {}


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
    """Collect new files, then run every pending (batch, stage) in order until all are done (`drive`).

    `upto` stops each batch after that stage (e.g. "transform": build the Delta warehouse, leave PostgreSQL
    alone); the stages left out stay pending in the batch log. A halted stage stops the run: nothing after it
    runs (`RunReport.halted` says which) until an operator resumes it or skips its batch. `stop_before_batch`
    (the stream service's stop request) is asked before each batch's first pending stage: when it says so, the run
    ends there, with the batch in flight finished and the later ones left pending. `hold` is the collector's
    (`streamdi.collector.collect`). The run holds the lake's runner lease throughout (`streamdi.locks`): another
    runner meanwhile is refused with LakeBusy.
    """
    return drive(
        ctx,
        Scope(upto=upto),
        collect=True,
        hold=hold,
        on_collect=on_collect,
        on_plan=on_plan,
        on_step=on_step,
        stop_before_batch=stop_before_batch,
    )
