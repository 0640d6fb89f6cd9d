"""The transaction graph of one micro-batch: T0 -> T1, T2 -> T3, T4 -> DM, each step one commit per target table.

| step | tables | module |
|------|--------|--------|
| T0   | DimDate, DimTime, StatusType, TradeType, Industry, TaxRate, DimBroker | `jobs.reference` |
| T1   | DimCompany, DimSecurity, Financial (CreateSecurities) | `jobs.create_securities` |
| T2   | DimCustomer, then DimAccount beside Prospect (CreateAccounts) | `jobs.create_accounts`, `jobs.prospect` |
| T3   | DimTrade, FactHoldings; FactCashBalances beside | `jobs.create_trades`, `jobs.holdings`, `jobs.cash_balances` |
| T4   | FactMarketHistory beside FactWatches | `jobs.market_history`, `jobs.watches` |
| AG   | live windows: trade_windows, market_windows (late records in DImessages) | `jobs.windows` |
| DM   | DImessages: validation counts, phase complete | `jobs.messages` |

The `create_*` modules are the steps (what a micro-batch touches, reads, commits); the rules of their tables are
pure transforms beside them: `jobs.companies`, `jobs.securities`, `jobs.financials` (T1), `jobs.customers`,
`jobs.accounts` (T2), `jobs.trades` (T3, whose reads are `jobs.trade_candidates`).

T3 and T4 both need only T1 and T2 (T4 reads no table of T3), so they run at the same time too; AG aggregates the
trades of T3 and the market rows of T4 into the live windows (`schemas.windows`); alerts go to
DImessages from every step that raises them (under its own app transaction, `T3/dimessages/factholdings`).

Every commit carries the app transaction (`<step>/<table>`, micro-batch id), and a step skips a table whose
commit for this micro-batch is already recorded, so rerunning a micro-batch after a crash redoes exactly the
commits that are missing. A step reads the tables of earlier steps as they stand after this micro-batch's
commits to them (batch order guarantees nothing later has been committed), so a rerun computes what the
interrupted run would have computed. T1 and T2 depend only on T0: they run at the same time, in two threads
(their Arrow work and delta-rs commits release the GIL; their commits go to different tables, except DImessages,
where each upserts only the alerts of its own tables under the table's commit lock); so do T3 and T4 after them.
Every step runs in the driver on Arrow tables read and committed with delta-rs: a transform starts no JVM.

Each step declares the steps it runs after (`Step.after`); the order is not written out anywhere else: `waves`
sorts the graph (`graphlib.TopologicalSorter`) into waves of steps that can run together.

After a step commits, the warehouse suites of its tables run on what it wrote (`jobs.validate`). A failed
`halt` check ends the run after that wave: `TransformReport.halts` says why, and the later steps (DM included)
run only when an operator resumes the micro-batch (`attempt` then counts the resumes, and the halt checks of
this micro-batch only warn).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from graphlib import CycleError, TopologicalSorter

from jobs import (
    cash_balances,
    create_accounts,
    create_securities,
    create_trades,
    holdings,
    market_history,
    messages,
    reference,
    validate,
    watches,
    windows,
)
from jobs.beside import run_beside
from jobs.scope import BatchScope, load_scope
from schemas import warehouse as wh
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.pools import kept_pool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[JobContext, BatchScope], dict[str, int]]
    after: tuple[str, ...] = ()
    checked: bool = False  # its tables' warehouse suites run after it (`jobs.validate.STEP_TABLES`)
    # The migrated tables whose every commit of a micro-batch this step makes: a migration running beside the
    # transform (`streamdi.migrator.TransformProgress`) lands them once the step is done. DImessages and the quality
    # tables are written by several steps, so they wait for the whole transform.
    final: tuple[Table, ...] = ()
    reads_checks: bool = False  # it reads the checks' results of the steps before it: starts once they are done


def trades_and_holdings(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Step T3: DimTrade, then FactHoldings (keyed through DimTrade); beside them FactCashBalances (`jobs.beside`).
    A migration beside lands each table as soon as its part is done (`_finishing`)."""

    def trades() -> dict[str, int]:
        rows = _finishing(scope, wh.DIM_TRADE, create_trades.run(ctx, scope))
        return _added(rows, _finishing(scope, wh.FACT_HOLDINGS, holdings.run(ctx, scope)))

    def cash() -> dict[str, int]:
        return _finishing(scope, wh.FACT_CASH_BALANCES, cash_balances.run(ctx, scope))

    return _added(*run_beside(scope, [trades, cash], beside=ctx.settings.steps_beside))


def market_and_watches(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Step T4: FactMarketHistory beside FactWatches (`jobs.beside`); a migration beside lands each as soon as it
    is done (`_finishing`)."""

    def market() -> dict[str, int]:
        return _finishing(scope, wh.FACT_MARKET_HISTORY, market_history.run(ctx, scope))

    def watched() -> dict[str, int]:
        return _finishing(scope, wh.FACT_WATCHES, watches.run(ctx, scope))

    return _added(*run_beside(scope, [market, watched], beside=ctx.settings.steps_beside))


def _finishing(scope: BatchScope, table: Table, rows: dict[str, int]) -> dict[str, int]:
    """`rows` (a part's result), once the step is told the part made the last commit of `table` in the micro-batch
    (`BatchScope.finished`): a migration beside lands it while the step's other parts still compute, instead of
    idling until the step returns (SF 10 Batch1: FactMarketHistory waited ~5 s for FactWatches)."""
    scope.finished(table)
    return rows


def _added(*parts: dict[str, int]) -> dict[str, int]:
    """Rows per table of several parts of a step (DImessages, written by each, summed)."""
    rows: dict[str, int] = {}
    for part in parts:
        for table, n in part.items():
            rows[table] = rows.get(table, 0) + n
    return rows


STEPS: tuple[Step, ...] = (
    Step(
        "T0",
        lambda ctx, scope: reference.run(ctx, scope).rows,
        checked=True,
        final=(*wh.REFERENCE_TABLES, wh.DIM_BROKER),
    ),
    Step("T1", create_securities.run, after=("T0",), checked=True, final=wh.SECURITY_TABLES),
    Step("T2", create_accounts.run, after=("T0",), checked=True, final=wh.ACCOUNT_TABLES),
    Step("T3", trades_and_holdings, after=("T1", "T2"), checked=True, final=wh.TRADE_TABLES),
    Step("T4", market_and_watches, after=("T1", "T2"), checked=True, final=wh.MARKET_TABLES),
    Step("AG", windows.run, after=("T3", "T4"), checked=True, final=wh.WINDOW_TABLES),
    Step("DM", messages.run, after=("AG",), reads_checks=True),
)


@dataclass
class TransformReport:
    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)  # rows written per table
    seconds: dict[str, float] = field(default_factory=dict)  # per step (its warehouse suites included)
    checks: dict[str, validate.StepChecks] = field(default_factory=dict)  # per step with warehouse suites
    halts: list[str] = field(default_factory=list)  # failed halt checks: the run stopped after their wave

    def outcomes(self) -> list:
        return [o for c in self.checks.values() for o in c.all_outcomes()]


def _step_pool() -> ThreadPoolExecutor:
    """The threads that run the steps of a wave side by side: kept for the process's life (`streamdi.pools`), so
    that a long-lived process (the stream service) runs each micro-batch on the same threads."""
    return kept_pool("step", max(len(wave) for wave in waves(STEPS)))


class CheckHalted(Exception):
    """A step's commit refused: a halt check of an earlier step failed (`Checks.gate`)."""


class Checks:
    """The warehouse suites of a micro-batch's steps, run one step after the other on a kept thread while the later
    steps already read and compute; `gate` holds a later step's commits until every suite of an earlier wave has
    passed. So a step commits nothing after a failed halt check, as when each step waited for the checks before
    it, and the checks of one step overlap the reads and transforms of the next (T2's ~0.35 s of Great
    Expectations at SF 6 beside T3 and T4). A step's suites start as soon as it returns (`begin`), while the rest of
    its wave still runs (T3's beside T4's FactMarketHistory), and join the gate when the wave ends (`gating`): a
    step of the same wave is never held by them, as before."""

    def __init__(self, ctx: JobContext, batch_id: int, attempt: int) -> None:
        self._ctx, self._batch_id, self._attempt = ctx, batch_id, attempt
        self._started: list[Future] = []

    def begin(self, step: Step) -> Future:
        """Start `step`'s suites now; they hold no commit until `gating` is given them."""
        return kept_pool("checks", 1).submit(self._check, step.name)

    def gating(self, future: Future) -> Future:
        """Make suites started by `begin` hold every later commit (`gate`) until they have passed."""
        self._started.append(future)
        return future

    def _check(self, step: str) -> validate.StepChecks:
        with self._ctx.lake.ungated():  # the suites record their results
            return validate.validate_step(self._ctx, self._batch_id, step, attempt=self._attempt)

    def gate(self) -> None:
        """Wait for every suite started so far; raise CheckHalted if one failed a halt check (a failure to run
        one is raised as it is)."""
        for future in list(self._started):
            if future.result().halts:
                raise CheckHalted()

    def wait(self) -> None:
        """Wait for every suite started so far, whatever its outcome."""
        wait(self._started)


def run(
    ctx: JobContext,
    batch_id: int,
    *,
    attempt: int = 0,
    on_committed: Callable[[str], None] | None = None,
    on_finished: Callable[[tuple[Table, ...]], None] | None = None,
) -> TransformReport:
    """Run every step of micro-batch `batch_id` in dependency order: in waves of the steps whose dependencies are done,
    the steps of a wave at the same time (one step at a time, each after the suites of the one before, with
    `steps_beside` off in the settings: a first load under a memory cap). The warehouse suites of a wave's steps run
    beside the next wave (`Checks`), whose commits wait until they have passed; a step that reads the checks'
    results (`Step.reads_checks`: DM) starts after them. A failing step fails the run once its wave and the checks
    started have ended; a failed halt check stops it before any later commit (`report.halts`). `attempt` is the
    number of times an operator resumed the micro-batch's transform. `on_committed` hears of each step as soon as it
    has returned, its commits made, before its checks: a migration beside the transform lands its tables in the open
    transaction while the suites run, and commits only after the whole transform (a halt rolls it back).
    `on_finished` hears of tables a step finished before it returns (`BatchScope.finished`)."""
    scope = load_scope(ctx, batch_id)
    if on_finished is not None:
        scope = replace(scope, on_finished=on_finished)
    report = TransformReport(batch_id)
    checks = Checks(ctx, batch_id, attempt)
    checking: list[tuple[Step, dict[str, int], float, Future | None]] = []  # steps done, their checks in flight
    with ctx.lake.gated(checks.gate):
        beside = ctx.settings.steps_beside
        for wave in waves(STEPS) if beside else [(step,) for together in waves(STEPS) for step in together]:
            if not beside or any(step.reads_checks for step in wave):
                checks.wait()
            begun = _EarlyChecks(checks)  # a step's suites begin as it returns, beside the rest of its wave
            futures = [_step_pool().submit(_ran, ctx, scope, step, begun) for step in wave]
            if on_committed:  # each step as soon as it returns, while the rest of its wave runs
                for step, future in zip(wave, futures, strict=True):
                    future.add_done_callback(lambda f, name=step.name: f.exception() or on_committed(name))
            try:
                if checking:  # the checks of the wave before, while this wave runs
                    _record_checked(report, checking)
                    checking = []
            finally:
                wait(futures)  # the whole wave ends before a failure is raised
            if report.halts:
                break
            try:
                done = [f.result() for f in futures]  # in declared order; raises the first failure
            except Exception:
                checks.wait()  # nothing runs on once the run has failed
                begun.wait()
                raise
            checking = [
                (s, rows, secs, begun.gating(s) if s.checked else None)
                for s, (rows, secs) in zip(wave, done, strict=True)
            ]
        if checking and not report.halts:
            _record_checked(report, checking)
    if report.halts:
        log.warning("micro-batch %s halted: %s", batch_id, report.halts)
    return report


class _EarlyChecks:
    """The suites of a wave's steps, each begun by its step's own thread as the step returns (`Checks.begin`: before
    its future is done, so the wave's end finds every one begun), given to the gate when the wave ends."""

    def __init__(self, checks: Checks) -> None:
        self._checks = checks
        self._begun: dict[str, Future] = {}
        self._lock = threading.Lock()

    def begin(self, step: Step) -> None:
        if step.checked:
            with self._lock:
                self._begun[step.name] = self._checks.begin(step)

    def gating(self, step: Step) -> Future:
        """`step`'s suites (a checked step that returned), now holding every later commit (`Checks.gating`)."""
        with self._lock:
            return self._checks.gating(self._begun[step.name])

    def wait(self) -> None:
        with self._lock:
            begun = list(self._begun.values())
        wait(begun)


def _ran(ctx: JobContext, scope: BatchScope, step: Step, begun: _EarlyChecks) -> tuple[dict[str, int], float]:
    started = time.perf_counter()
    rows = step.run(ctx, scope)
    seconds = time.perf_counter() - started
    begun.begin(step)
    return rows, seconds


def _record_checked(report: TransformReport, checking: list[tuple[Step, dict[str, int], float, Future | None]]) -> None:
    """Record the steps of a wave once their checks are done (a step's seconds include its checks')."""
    for step, rows, seconds, future in checking:
        started = time.perf_counter()
        step_checks = future.result() if future is not None else None
        _record(report, step, (rows, step_checks, seconds + (time.perf_counter() - started)))


def run_step(ctx: JobContext, batch_id: int, name: str, *, attempt: int = 0) -> TransformReport:
    """Run the one step `name` of micro-batch `batch_id`, followed by its warehouse suites (the Airflow DAGs run
    each step as its own task). The caller runs the steps in dependency order, and every step of earlier
    micro-batches before; a step whose commits for this micro-batch are recorded redoes none of them."""
    steps = {s.name: s for s in STEPS}
    if name not in steps:
        raise ValueError(f"unknown transform step {name!r}; steps are {list(steps)}")
    report = TransformReport(batch_id)
    _record(report, steps[name], _timed(ctx, load_scope(ctx, batch_id), steps[name], attempt))
    return report


def _record(
    report: TransformReport, step: Step, outcome: tuple[dict[str, int], validate.StepChecks | None, float]
) -> None:
    rows, checks, elapsed = outcome
    report.rows.update(rows)
    report.seconds[step.name] = round(elapsed, 3)
    if checks is not None:
        report.checks[step.name] = checks
        report.halts.extend(checks.halts)
    log.info("batch %s step %s: %s in %.2fs", report.batch_id, step.name, rows, elapsed)


def waves(steps: tuple[Step, ...]) -> list[tuple[Step, ...]]:
    """`steps` in waves, sorted from their declared dependencies (`Step.after`) with `graphlib.TopologicalSorter`:
    each wave holds the steps (in declared order) whose dependencies are all in earlier waves. Raises on a
    dependency that no step satisfies (a cycle or an unknown name)."""
    known = {s.name for s in steps}
    unknown = [(s.name, s.after) for s in steps if not set(s.after) <= known]
    if unknown:
        raise ValueError(f"unsatisfiable step dependencies: {unknown}")
    graph = TopologicalSorter({s.name: s.after for s in steps})
    try:
        graph.prepare()
    except CycleError as cycle:
        raise ValueError(f"unsatisfiable step dependencies: a cycle {cycle.args[1]}") from cycle
    position = {s.name: i for i, s in enumerate(steps)}
    by_name = {s.name: s for s in steps}
    out = []
    while graph.is_active():
        ready = sorted(graph.get_ready(), key=position.__getitem__)
        out.append(tuple(by_name[name] for name in ready))
        graph.done(*ready)
    return out


def _timed(
    ctx: JobContext, scope: BatchScope, step: Step, attempt: int
) -> tuple[dict[str, int], validate.StepChecks | None, float]:
    started = time.perf_counter()
    rows = step.run(ctx, scope)
    checks = validate.validate_step(ctx, scope.batch_id, step.name, attempt=attempt) if step.checked else None
    return rows, checks, time.perf_counter() - started
