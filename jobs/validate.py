"""Warehouse suites: validate what a transform step wrote, right after its commits and before migration.

The suites are `expectations/warehouse/<table>.yml` (see `streamdi.suites`). After step T0..T4 of a
micro-batch commits, each table it builds that has a suite is validated on **the rows this micro-batch wrote
to it**: the inserts and update post-images of the step's commit (app transaction `<step>/<table>`, version =
micro-batch id), read back from the Delta change data feed. Validating the commit, not the step's in-memory
DataFrame, makes a rerun after a crash (when the step skips its committed tables) validate exactly the same
rows, and it checks what reaches PostgreSQL.

For a history-keeping (SCD2) table the rows also include the versions still current of every natural key the
micro-batch touched, so "one current version per key" sees the version a broken step would have forgotten to
close. A large first load written a piece at a time is checked a piece at a time (`validated_in_pieces`), with
the outcomes a whole read-back gives. Table-wide invariants that need the whole table (every surrogate key
resolving to a version valid at the right time, audit counts) belong to `streamdi audit`.

Policies: `warn` records; `halt` stops the micro-batch's transform after the step's wave (the later steps do not
run, the batch is not migrated) until an operator resumes it, after which the check only warns for it
(`overridden`). Warehouse suites never quarantine: a committed row may already be referenced (the suite loader
refuses it). Results go to `quality.results` once per (step, attempt): app transaction
`transform/quality/<step>/<attempt>`, version = micro-batch id.
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from schemas import warehouse as wh
from schemas.model import Table
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi.context import JobContext
from streamdi.delta_appends import AppendedRows, file_batches
from streamdi.lake import CommitInfo, Lake, sorted_rows, within_range
from streamdi.pools import kept_pool
from streamdi.quality import (
    PIECE_ROWS,
    CheckOutcome,
    Validated,
    Validating,
    frame_columns,
    merged_outcome,
    row_wise,
    validator,
)
from streamdi.suites import Suite, key_parameters, suite_path

log = logging.getLogger(__name__)

# The warehouse tables each step commits that may have a suite.
STEP_TABLES: dict[str, tuple[Table, ...]] = {
    "T0": (wh.DIM_BROKER,),
    "T1": (wh.DIM_COMPANY, wh.DIM_SECURITY, wh.FINANCIAL),
    "T2": (wh.DIM_CUSTOMER, wh.DIM_ACCOUNT, wh.PROSPECT),
    "T3": (wh.DIM_TRADE, wh.FACT_CASH_BALANCES, wh.FACT_HOLDINGS),
    "T4": (wh.FACT_MARKET_HISTORY, wh.FACT_WATCHES),
    "AG": (wh.TRADE_WINDOWS, wh.MARKET_WINDOWS),
}
# Natural key of each SCD2 table: its current versions of the keys a micro-batch touched join the validated rows.
NATURAL_KEYS: dict[str, str] = {
    wh.DIM_BROKER.name: "brokerid",
    wh.DIM_COMPANY.name: "companyid",
    wh.DIM_SECURITY.name: "symbol",
    wh.DIM_CUSTOMER.name: "customerid",
    wh.DIM_ACCOUNT.name: "accountid",
}
_WRITTEN = pa.array(["insert", "update_postimage"])
CHECK_THREADS = 3  # a step's tables checked at once: T2 and T3 commit three tables with suites
LARGE_COMMIT_ROWS = 1_000_000  # a commit of at least this many rows is read back only while no other such is held
_ONE_LARGE = threading.Lock()


@dataclass
class StepChecks:
    """What the warehouse suites found after one step: outcomes per table, and the reasons of any halt."""

    step: str
    outcomes: dict[str, list[CheckOutcome]] = field(default_factory=dict)  # qualified table -> outcomes
    rows: dict[str, int] = field(default_factory=dict)  # qualified table -> rows validated
    halts: list[str] = field(default_factory=list)

    def all_outcomes(self) -> list[CheckOutcome]:
        return [o for outcomes in self.outcomes.values() for o in outcomes]


def written_rows(
    lake: Lake, table: Table, app_id: str, batch_id: int, columns: list[str] | None = None
) -> pa.Table | None:
    """The rows micro-batch `batch_id`'s commit `app_id` wrote to `table` (inserts and update post-images, in
    the declared order), or None when that commit does not exist. With `columns` (the declared order), only those
    columns are read; they must hold the table's key, order and natural key (`checked_columns`). A commit written a
    piece at a time keeps its pieces' order (`Lake.written_in_pieces`), as fixed as the declared one, without a
    sorted copy."""
    commit = written_commit(lake, table, app_id, batch_id)
    return None if commit is None else commit_rows(lake, table, commit, columns)


def commit_rows(lake: Lake, table: Table, commit: CommitInfo, columns: list[str] | None = None) -> pa.Table:
    """`written_rows` of a commit found (`written_commit`)."""
    columns = columns or table.column_names
    feed = lake.changes(table, commit.table_version, commit.table_version, columns=columns)
    written = pc.is_in(feed["_change_type"], value_set=_WRITTEN)
    if not pc.all(written).as_py():  # a first load's feed is all inserts: kept as it is, not copied
        feed = feed.filter(written)
    rows = feed.select(columns)
    natural = NATURAL_KEYS.get(table.name)
    if natural and rows.num_rows:
        current = lake.read_where(
            table,
            (pc.field("iscurrent") == True) & pc.field(natural).isin(pc.unique(rows[natural])),  # noqa: E712
            columns,
        )
        written_keys = pc.unique(rows[table.key[0]])
        extra = current.filter(pc.invert(pc.is_in(current[table.key[0]], value_set=written_keys)))
        if extra.num_rows:
            rows = pa.concat_tables([rows, extra.select(columns).cast(rows.schema)])
    if lake.written_in_pieces(table, commit):  # in a fixed order already: no sorted copy of a big first load
        return rows
    return sorted_rows(rows, table.order_by)


def written_commit(lake: Lake, table: Table, app_id: str, batch_id: int) -> CommitInfo | None:
    """Micro-batch `batch_id`'s commit `app_id` to `table`, or None when it does not exist."""
    if not lake.exists(table):
        return None
    commits = lake.recent_history(table, batch_id)
    return next((c for c in reversed(commits) if c.app_id == app_id and c.txn_version == batch_id), None)


def is_large(lake: Lake, table: Table, commit: CommitInfo) -> bool:
    """Whether `commit` only appended, and at least `LARGE_COMMIT_ROWS` rows (a first load: its log says so
    without reading a row)."""
    appended = AppendedRows.of(lake.path(table), commit.table_version, commit.table_version, table.arrow_schema())
    return appended is not None and appended.num_rows >= LARGE_COMMIT_ROWS


def in_pieces(lake: Lake, table: Table, commit: CommitInfo) -> AppendedRows | None:
    """The rows of `commit`, to be read back a piece at a time, when it is a large first load's commit written a
    piece at a time (`Lake.written_in_pieces`: only appended, in a fixed order file after file, which is the order
    `commit_rows` gives) of at least `LARGE_COMMIT_ROWS` rows, to a table without a natural key; else None (read it
    whole with `commit_rows`). SF 100's FactMarketHistory is 42 M rows: ~4 GiB of checked columns read whole."""
    if table.name in NATURAL_KEYS or not lake.written_in_pieces(table, commit):
        return None
    appended = AppendedRows.of(lake.path(table), commit.table_version, commit.table_version, table.arrow_schema())
    return appended if appended is not None and appended.num_rows >= LARGE_COMMIT_ROWS else None


def validated_in_pieces(
    lake: Lake,
    quality: Validating,
    suite: Suite,
    appended: AppendedRows,
    columns: list[str],
    batch_id: int,
    *,
    resumed: bool,
) -> Validated:
    """`Validating.validate` of the rows of `appended` (their `columns`, `checked_columns`) without holding them
    all: the checks that judge each row alone (`row_wise`) see consecutive pieces of at most `PIECE_ROWS` rows,
    each with the key parameters of its own values (`key_values`: a value resolves against them as against the
    whole set), and their outcomes are merged as `validate` merges its own pieces' (`merged_outcome`); the others
    see every row of only the columns they need. The same outcomes as `validate` on the whole; the rows are not
    kept (warehouse suites never quarantine)."""
    by_row = replace(suite, checks=tuple(c for c in suite.checks if row_wise(c)))
    at_once = replace(suite, checks=tuple(c for c in suite.checks if not row_wise(c)))
    found: dict[str, CheckOutcome] = {}
    if at_once.checks:
        rows = appended.select([c for c in columns if c in frame_columns(at_once, appended.schema.empty_table())])
        done = quality.validate(at_once, rows, batch_id, resumed=resumed, parameters=key_values(lake, at_once, rows))
        found.update((o.check.id, o) for o in done.outcomes)
    if by_row.checks:
        parts: dict[str, list[CheckOutcome]] = {c.id: [] for c in by_row.checks}
        wanted = pa.schema([appended.schema.field(c) for c in columns])
        for batch in file_batches(appended.files, wanted, PIECE_ROWS):
            piece = pa.Table.from_batches([batch])
            parameters = key_values(lake, by_row, piece)
            for o in quality.validate(by_row, piece, batch_id, resumed=resumed, parameters=parameters).outcomes:
                parts[o.check.id].append(o)
        found.update((c.id, merged_outcome(c, parts[c.id], resumed=resumed)) for c in by_row.checks)
    kept = appended.schema.empty_table().select(columns)
    return Validated(suite, kept, QUARANTINE.arrow_schema().empty_table(), [found[c.id] for c in suite.checks])


def checked_columns(suite: Suite, table: Table) -> list[str]:
    """The columns of `table` its warehouse suite needs read back, in declared order: those the checks see
    (`streamdi.quality.frame_columns`: every column when one check looks at the whole table), and the key, order
    and natural key `written_rows` uses. A first load's read-back then holds a few columns of a big table (SF 30's
    FactMarketHistory: 8 of 15), not all of them."""
    needed = {*frame_columns(suite, table.arrow_schema().empty_table()), *table.key, *table.order_by}
    if natural := NATURAL_KEYS.get(table.name):
        needed.update((natural, "iscurrent"))
    return [c for c in table.column_names if c in needed]


def key_values(lake: Lake, suite: Suite, rows: pa.Table) -> dict[str, list]:
    """The run-time parameters of a warehouse suite, from another warehouse table as it stands now (after this
    step's commits): for "every account key of DimTrade resolves", the `sk_accountid` values of the checked rows
    that DimAccount lacks (`missing_from__dimaccount__sk_accountid`, usually none), or those it has
    (`dimaccount__sk_accountid`). See `streamdi.suites.KeyParameter`.

    Only values that occur in the checked column of `rows` are ever passed: a value resolves against them exactly as
    against the whole key set, and Great Expectations copies a value set many times per check (with all 100,000
    DimAccount keys of SF 3 that is seconds per check). Likewise only those values are looked up in the other table.
    """
    wanted: dict[str, pa.Array] = {}
    for check in suite.checks:
        for name in check.parameters:
            present = pc.unique(pc.drop_null(rows[check.column])) if check.column in rows.column_names else pa.array([])
            wanted[name] = pc.unique(pa.concat_arrays([wanted[name], present])) if name in wanted else present
    values = {}
    for parameter in key_parameters(suite):
        candidates = wanted.get(parameter.name, pa.array([]))
        if len(candidates) == 0:
            values[parameter.name] = []
            continue
        if lake.exists(parameter.table):
            # only the candidates are looked up, within their range: the files and row groups of other keys are
            # skipped, and no hash of the whole key column is built (FactHoldings' trade keys in DimTrade at SF 6:
            # ~90-160 ms as a whole-column read, per micro-batch)
            column = parameter.table.arrow_schema().field(parameter.column).type
            looked = candidates.cast(column)
            bounded = pc.field(parameter.column).isin(looked) & within_range(parameter.column, looked)
            keys = lake.read_where(parameter.table, bounded, [parameter.column])[parameter.column]
            known = pc.is_in(candidates, value_set=keys.cast(candidates.type))
        else:
            known = pa.array([False] * len(candidates))
        values[parameter.name] = candidates.filter(pc.invert(known) if parameter.missing else known).to_pylist()
    return values


def validate_step(ctx: JobContext, batch_id: int, step: str, *, attempt: int = 0) -> StepChecks:
    """Run the suite of every table `step` committed in micro-batch `batch_id`, record the results once per
    (step, attempt), and return what they found. From attempt 1 on (after a resume) halt checks only warn."""
    checks = StepChecks(step)
    # The tables are checked at once, each read back, its keys looked up and its suite run in one task (a
    # validation on the warm server leaves this process idle; one in this process holds the GIL, and the lookups
    # run in its gaps), and its rows let go when its suite has run. A large commit (a first load's FactMarketHistory
    # at SF 30 is 12.6 M rows, ~1.2 GiB of checked columns) is read back only while no other large one is held, so
    # a big step's read-backs never sit in memory together. The outcomes are taken in the step's table order.
    pool = kept_pool("step-checks", CHECK_THREADS)
    tables = [table for table in STEP_TABLES.get(step, ()) if suite_path(table).is_file()]
    if not tables:
        return checks
    # the suites say which columns to read back (the warm server's validator has them without Great Expectations;
    # one in this process was started importing it when the stage or transform began: `quality.warm_up`)
    quality = validator()
    suites = {table: suite for table in tables if (suite := quality.suite_for(table)) is not None}

    def checked(table: Table) -> tuple[Validated, int, pa.Table] | None:
        suite = suites[table]
        app_id = f"{step}/{table.name}"
        commit = written_commit(ctx.lake, table, app_id, batch_id)
        if commit is None:
            return None
        columns = checked_columns(suite, table)
        appended = in_pieces(ctx.lake, table, commit)
        if appended is not None:
            done = validated_in_pieces(ctx.lake, quality, suite, appended, columns, batch_id, resumed=attempt > 0)
            return done, appended.num_rows, done.result_rows(batch_id, attempt)
        with _ONE_LARGE if is_large(ctx.lake, table, commit) else nullcontext():
            rows = commit_rows(ctx.lake, table, commit, columns)
            if not rows.num_rows:
                return None
            parameters = key_values(ctx.lake, suite, rows)
            done = quality.validate(suite, rows, batch_id, resumed=attempt > 0, parameters=parameters)
            # the outcomes and their rows in `quality.results`, not the checked rows
            return replace(done, kept=rows.schema.empty_table()), rows.num_rows, done.result_rows(batch_id, attempt)

    results = []
    for found in pool.map(checked, list(suites)):
        if found is None:
            continue
        done, validated_rows, result_rows = found
        name = done.suite.name
        checks.outcomes[name] = done.outcomes
        checks.rows[name] = validated_rows
        checks.halts.extend(o.describe(name) for o in done.halts)
        results.append(result_rows)
        for o in done.outcomes:
            if not o.success:
                log.warning("micro-batch %s after %s: %s (%s)", batch_id, step, o.describe(name), o.action)
    if results:
        ctx.lake.append(
            QUALITY_RESULTS,
            pa.concat_tables(results),
            app_id=f"transform/quality/{step}/{attempt}",
            version=batch_id,
        )
    return checks
