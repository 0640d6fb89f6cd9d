"""The migrator: moves committed warehouse changes from Delta into PostgreSQL `dw.*`, and the data-quality record
(`quality.results`, `quality.quarantine`) into `streamdi.quality_results` / `streamdi.quality_quarantine`, exactly
once and in the same transactions (`MIGRATED_TABLES`).

Two ways in, one migration unit each (one PostgreSQL transaction):
- push: `migrate_batch(lake, warehouse, b)` is the dataflow's "migrate" stage (run right after batch b's
  transform); `streamdi migrate [--every S]` runs `migrate_pending` once or on an interval;
- pull: `streamdi query --fresh` runs `migrate_pending` right before its query.
`migrate_pending` takes every batch whose transform is done (a prefix of the batch log) and that is not yet
visible, and lands them all in one transaction (catch-up). Units always make a prefix of the batches visible,
each with its `streamdi.batch_metrics` row, so a batch already made visible one way is a cheap no-op for the
other: `migrate_batch` returns after one query when the newest visible batch is not older than it.

For each migrated table it reads the Delta change feed from the version after the last one recorded in
`streamdi.migration_ledger` (under the table's `ledger_key`: the bare name for warehouse tables, `quality.results`
for the quality ones), reduces it to the net change per key (last change wins, in commit order), and hands all
tables to `Warehouse.apply_changes`, which applies them and writes the ledger in ONE PostgreSQL transaction: a
batch becomes visible whole -- its quality results and quarantined rows included -- or not at all, and a crash
anywhere leaves PostgreSQL at the previous ledger state, from which a rerun continues. Tables absent from the lake
(a lake whose stage never wrote a quality record) are skipped.

Which Delta versions belong to a batch is read from the commits themselves: every streamdi commit carries
its app transaction version (the micro-batch id), so migrating "up to batch b" takes each table's commits
in order while they belong to batches <= b, whatever else has been committed since. That holds for the quality
tables too: each step commits them with app transaction `<step>/quality/<attempt>` (or `/quarantine/`) and the
micro-batch as version, so a batch's quality rows become visible with its warehouse rows, even when it changed no
warehouse table.

When the commits to migrate only appended rows and hold at least `STREAMED_ROWS` of them (a first load's big
tables), the net change is those rows, and they are read from the commits' data files a piece at a time while
COPY sends them (`streamdi.delta_appends.AppendedRows`) rather than held as one table: a whole-table feed is GiBs at
SF 30. Their keys are still checked to be distinct before any row lands.

`streamdi.batch_metrics.rows` counts the change rows of warehouse tables only: the quality record is about the
data, not data, and leaving it out keeps the figures comparable with those of before it was migrated.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from schemas.quality import QUALITY_TABLES
from schemas.warehouse import WAREHOUSE_TABLES
from streamdi import row_order
from streamdi.batchlog import DONE, SKIPPED, BatchLog
from streamdi.delta_appends import AppendedRows
from streamdi.faults import fault_point
from streamdi.lake import CommitInfo, Lake
from streamdi.pools import kept_pool
from streamdi.warehouse_model import BatchMetric, TableChange, ledger_key

if TYPE_CHECKING:
    from streamdi.warehouse import Warehouse

log = logging.getLogger(__name__)

# What a migration unit lands by default, in this order inside its transaction.
MIGRATED_TABLES: tuple[Table, ...] = WAREHOUSE_TABLES + QUALITY_TABLES
# Appended rows from which a table's change is streamed from its files into COPY instead of held (module docstring).
STREAMED_ROWS = 200_000


def target_version(history: list[CommitInfo], after: int, batch_id: int) -> int:
    """The highest table version v > `after` such that every commit in (after, v] belongs to a batch <= batch_id.

    Commits without an app transaction (table creation, maintenance) belong to no batch and never stop the
    scan. Returns `after` when there is nothing to migrate.
    """
    target = after
    for commit in history:
        if commit.table_version <= after:
            continue
        if commit.txn_version is not None and commit.txn_version > batch_id:
            break
        target = commit.table_version
    return target


def net_changes(changes: pa.Table, table: Table) -> tuple[pa.Table, pa.Table]:
    """Reduce a change feed to `(upserts, deletes)`: per key, the last change in commit order wins.

    Raises ValueError if one commit changed the same key twice (the feed would be ambiguous).
    """
    key = list(table.key)
    effective = _without_preimages(changes)
    if effective.num_rows == 0:
        empty = table.arrow_schema().empty_table()
        return empty, empty.select(key)
    # Sorted by key then commit, a key's changes are adjacent and its last change is the last of its run.
    # Only the key and commit columns are reordered; the kept rows are then selected in feed order with a
    # mask (no copy at all when every row is kept, as in a first load).
    sort_keys = [*key, "_commit_version"]
    order = row_order.sort_indices(effective, sort_keys, nulls_first=False)
    ordered = effective.select(sort_keys).take(order)
    same_key_as_next = _equal_to_next(ordered, key)
    same_commit_as_next = _equal_to_next(ordered, ["_commit_version"])
    if pc.any(pc.and_(same_key_as_next, same_commit_as_next)).as_py():
        raise ValueError(f"{table.qualified_name}: a commit changes the same key more than once")
    is_last = pa.concat_arrays([pc.invert(same_key_as_next), pa.array([True])])
    if pc.all(is_last).as_py():
        last = effective
    else:
        keep = np.zeros(effective.num_rows, dtype=bool)
        keep[order.filter(is_last).to_numpy()] = True
        last = effective.filter(pa.array(keep))
    is_delete = pc.equal(last["_change_type"], "delete")
    if pc.any(is_delete).as_py():
        upserts = last.filter(pc.invert(is_delete)).select(table.column_names)
        deletes = last.filter(is_delete).select(key)
    else:
        upserts = last.select(table.column_names)
        deletes = last.select(key).schema.empty_table()
    return upserts.cast(table.arrow_schema()), deletes


def _without_preimages(changes: pa.Table) -> pa.Table:
    """The feed's rows that say what a key is now (inserts, post-images, deletes); a feed without pre-images (a
    first load's) as it is, not copied."""
    preimage = pc.equal(changes["_change_type"], "update_preimage")
    return changes.filter(pc.invert(preimage)) if pc.any(preimage).as_py() else changes


def _equal_to_next(data: pa.Table, columns: list[str]) -> pa.Array:
    """Row i: whether row i equals row i+1 in every one of `columns` (length num_rows - 1; NULL is unequal)."""
    n = data.num_rows
    equal = pa.array([True] * (n - 1), pa.bool_())
    for name in columns:
        column = data[name].combine_chunks() if data[name].num_chunks != 1 else data[name].chunk(0)
        same = pc.fill_null(pc.equal(column.slice(0, n - 1), column.slice(1)), False)
        equal = pc.and_(equal, same)
    return equal


def _first_kept(history: list[CommitInfo], after: int) -> int:
    """The version to read a table's change feed after: `after` (the last version migrated), or the version before
    the oldest commit the log still has (`history`: the commits after `after` it holds) when log cleanup
    (`Lake.maintain`) removed the commits in between. Cleanup runs only once every batch is migrated, so those were
    commits without data (a compaction, a vacuum): nothing of them is left to migrate."""
    if history and history[0].table_version > after + 1:
        log.info(
            "versions %s-%s were cleaned from the log (no data in them); reading from %s on",
            after + 1,
            history[0].table_version - 1,
            history[0].table_version,
        )
        return history[0].table_version - 1
    return after


def rows_per_batch(changes: pa.Table, history: list[CommitInfo]) -> dict[int, int]:
    """Change rows (inserts, update post-images, deletes) of a change feed per batch of the commit that made them.
    Rows of commits that carry no app transaction belong to no batch and are not counted."""
    effective = _without_preimages(changes)
    per_version = {e["values"]: e["counts"] for e in effective["_commit_version"].value_counts().to_pylist()}
    return _per_batch(per_version, history)


def _per_batch(rows_per_version: Mapping[int, int], history: list[CommitInfo]) -> dict[int, int]:
    batch_of = {c.table_version: c.txn_version for c in history if c.txn_version is not None}
    counts: dict[int, int] = {}
    for version, n in rows_per_version.items():
        batch = batch_of.get(version)
        if batch is not None:
            counts[batch] = counts.get(batch, 0) + n
    return counts


@dataclass(frozen=True)
class MigrationReport:
    """What one migration unit did. `batches` are the micro-batches it made visible (empty: nothing to do, or
    already visible); `tables` the rows applied per table; `versions` the Delta version each table is migrated
    up to afterwards (tables absent from the lake are left out). Both are keyed by the ledger key (`dimtrade`,
    `quality.results`); `rows` sums every table, the quality tables included."""

    batches: tuple[int, ...] = ()
    tables: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(self.tables.values())


def migrate_batch(
    lake: Lake,
    warehouse: Warehouse,
    batch_id: int,
    tables: tuple[Table, ...] = MIGRATED_TABLES,
    *,
    mode: str = "push",
    beside: TransformProgress | None = None,
) -> MigrationReport:
    """Make batch `batch_id` visible in PostgreSQL: every table's committed changes up to it, plus every earlier
    batch not yet visible, in ONE transaction. A no-op (one query) when the batch is already visible.

    The caller guarantees that the batch's transform is done (the dataflow runs this stage after it), or passes
    `beside`, the progress of the batch's transform running meanwhile: each table is then read and landed once the
    transform has finished it, and the transaction commits only after the whole transform is done (a table it
    committed to after all is read again then); an abandoned transform rolls the transaction back
    (`TransformAbandoned`)."""
    visible, versions = warehouse.migration_state()
    if visible is not None and visible >= batch_id:
        # batches become visible in order (every unit is a prefix), so this one is there whole
        log.info("batch %s is already visible in PostgreSQL (up to %s); nothing to migrate", batch_id, visible)
        return MigrationReport()
    visible = visible or 0
    view = _read_batch_log(lake, visible)
    return _migrate_upto(lake, warehouse, batch_id, tables, mode, visible, versions, view, beside=beside)


class TransformAbandoned(RuntimeError):
    """The transform a migration ran beside did not finish (it failed or halted): the migration is rolled back."""


class TransformProgress:
    """What a migration running beside its micro-batch's transform (`migrate_batch(beside=...)`) learns from it:
    which migrated tables the transform has finished (no later step of the micro-batch commits to them), that the
    whole transform is done (marked in the batch log), or that it was abandoned. Thread-safe; every wait ends once
    the transform is done or abandoned, so whoever runs the transform must say one of the two."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._finished: set[str] = set()
        self._done = False
        self._abandoned: str | None = None

    def finished(self, tables: Iterable[Table]) -> None:
        with self._changed:
            self._finished.update(t.qualified_name for t in tables)
            self._changed.notify_all()

    def done(self) -> None:
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def abandon(self, reason: str) -> None:
        with self._changed:
            self._abandoned = reason
            self._changed.notify_all()

    def next_finished(self, tables: list[Table]) -> tuple[Table, bool]:
        """The first of `tables` (in their order) that is finished, waiting until one is, or the first of them once
        the whole transform is done; and whether the whole transform is done. Raises `TransformAbandoned` once the
        transform is abandoned."""
        with self._changed:
            while True:
                if self._abandoned is not None:
                    raise TransformAbandoned(self._abandoned)
                if self._done:
                    return tables[0], True
                for table in tables:
                    if table.qualified_name in self._finished:
                        return table, False
                self._changed.wait()

    def wait_for(self, table: Table | None) -> bool:
        """Wait until `table` is finished (None: until the whole transform is done); return whether the whole
        transform is done. Raises `TransformAbandoned` once the transform is abandoned."""
        with self._changed:
            while True:
                if self._abandoned is not None:
                    raise TransformAbandoned(self._abandoned)
                if self._done or (table is not None and table.qualified_name in self._finished):
                    return self._done
                self._changed.wait()


def pending_batches(lake: Lake, warehouse: Warehouse) -> list[int]:
    """Batches committed in Delta (transform done, with every earlier batch) and not yet visible, oldest first."""
    visible, _ = warehouse.migration_state()
    return _pending(_read_batch_log(lake, visible or 0), visible or 0)


def migrate_pending(
    lake: Lake, warehouse: Warehouse, tables: tuple[Table, ...] = MIGRATED_TABLES, *, mode: str = "pull"
) -> MigrationReport:
    """Make every committed-but-not-visible batch visible, all in ONE transaction (one migration unit)."""
    visible, versions = warehouse.migration_state()
    batch_log = _read_batch_log(lake, visible or 0)
    batches = _pending(batch_log, visible or 0)
    if not batches:
        return MigrationReport()
    return _migrate_upto(lake, warehouse, batches[-1], tables, mode, visible or 0, versions, batch_log)


@dataclass(frozen=True)
class _BatchLogView:
    """What the migrator needs from the batch log: each batch's arrival (its last file) and, for batches whose
    transform is done, when it was marked done (all of the batch's Delta commits are in by then)."""

    arrived: dict[int, dt.datetime]
    transformed: dict[int, dt.datetime]
    skipped: frozenset[int] = frozenset()  # dropped by an operator before their transform: nothing to land
    staged: dict[int, dt.datetime] = field(default_factory=dict)  # when each batch's stage was marked done


def _read_batch_log(lake: Lake, visible: int = 0) -> _BatchLogView:
    """The batch log as the migrator needs it, through `BatchLog`'s readers (no log yet: nothing to migrate): the
    batches after `visible` (0: all). Those visible in PostgreSQL already were transformed or skipped, and nothing
    reads them again; the log grows with every micro-batch (at 10,000 of them: ~0.3 s a read of every batch)."""
    batch_log = BatchLog.if_exists(lake)
    if batch_log is None:
        return _BatchLogView({}, {})
    progress = batch_log.stage_progress(("stage", "transform"), after=visible)
    transformed = {b: at for (b, stage), (state, at) in progress.items() if stage == "transform" and state == DONE}
    skipped = frozenset(b for (b, stage), (state, _) in progress.items() if stage == "transform" and state == SKIPPED)
    staged = {b: at for (b, stage), (state, at) in progress.items() if stage == "stage" and state == DONE}
    return _BatchLogView(batch_log.arrivals(after=visible), transformed, skipped, staged)


def _pending(batch_log: _BatchLogView, visible: int) -> list[int]:
    ready = []
    for batch_id in sorted(batch_log.arrived):
        if batch_id not in batch_log.transformed and batch_id not in batch_log.skipped:
            break  # batches commit in order; a later batch cannot be complete before this one
        if batch_id > visible:
            ready.append(batch_id)
    return ready


def _migrate_upto(
    lake: Lake,
    warehouse: Warehouse,
    upto: int,
    tables: tuple[Table, ...],
    mode: str,
    visible: int,
    done_versions: dict[str, int],
    batch_log: _BatchLogView,
    *,
    beside: TransformProgress | None = None,
) -> MigrationReport:
    started = time.perf_counter()
    versions: dict[str, int] = {}
    rows: dict[int, int] = {}
    # The unit makes visible every batch of the log in (visible, upto], and `upto` itself.
    unit = tuple(sorted({b for b in batch_log.arrived if visible < b <= upto} | {upto}))

    def change(table: Table) -> TableChange | None:
        """The table's net change from the last version migrated (in the ledger, or earlier in this unit) to its
        newest version of a batch <= upto; None when there is nothing to migrate."""
        if not lake.exists(table):
            return None
        key = ledger_key(table)
        after = versions.get(key, done_versions.get(key, 0))
        history = lake.history(table, after=after)  # only the commits not migrated yet
        target = target_version(history, after, upto)
        versions[key] = target
        if target <= after:
            return None
        after = _first_kept(history, after)
        appended = AppendedRows.of(lake.path(table), after + 1, target, table.arrow_schema())
        if appended is not None and appended.num_rows >= STREAMED_ROWS:
            per_batch = _per_batch(appended.rows_per_version, history)
            upserts, deletes = appended, table.arrow_schema().empty_table().select(list(table.key))
        else:
            feed = lake.changes(table, after + 1, target)
            per_batch = rows_per_batch(feed, history)
            upserts, deletes = net_changes(feed, table)
        if table.layer == "warehouse":  # batch_metrics.rows counts warehouse data only (see the module docstring)
            for batch_id, n in per_batch.items():
                rows[batch_id] = rows.get(batch_id, 0) + n
        return TableChange(table=table, delta_version=target, batch_id=upto, upserts=upserts, deletes=deletes)

    def changes() -> Iterator[TableChange]:
        """Each table's net change, read from Delta while PostgreSQL lands the one before (`read_ahead`); beside a
        transform, each once the transform finished it (in that order), and again at the end if it moved since."""
        nonlocal batch_log
        early: list[Table] = []
        pending = list(tables)
        while pending:
            table = pending[0]
            if beside is not None:  # the tables in the order the transform finishes them
                table, done = beside.next_finished(pending)
                if not done:
                    early.append(table)
            pending.remove(table)
            if (found := change(table)) is not None:
                yield found
        if beside is not None:
            beside.wait_for(None)
            batch_log = _read_batch_log(lake, visible)  # now with the transform's end, for the batch_metrics rows
            for table in early:
                key = ledger_key(table)
                taken = versions.get(key)
                if not lake.exists(table) or lake.version(table) == taken:
                    continue
                found = change(table)
                if found is None or not (found.upserts.num_rows or found.deletes.num_rows):
                    # nothing but commits without data (the transform's compaction): the next unit takes them
                    if taken is not None:
                        versions[key] = taken
                    continue
                log.info("%s changed after its step had finished; migrating the rest", table.qualified_name)
                yield found

    def metrics() -> list[BatchMetric]:
        """The unit's batch_metrics rows (called once every change has been read: `rows` is complete then)."""
        return [
            BatchMetric(
                b, batch_log.arrived.get(b), batch_log.transformed.get(b), rows.get(b, 0), batch_log.staged.get(b)
            )
            for b in unit
        ]

    fault_point("migrate.before_apply")
    applied = warehouse.apply_changes(read_ahead(changes()), batches=metrics, mode=mode)
    report = MigrationReport(batches=unit, tables=applied, versions=versions, seconds=time.perf_counter() - started)
    log.info("migrated batches %s (%s) in %.3fs: %s", report.batches, mode, report.seconds, applied)
    return report


T = TypeVar("T")


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """`items` in order, each next one produced in a worker thread while the caller works on the current one
    (reading a Delta change feed and landing the previous table in PostgreSQL overlap; both mostly run outside
    the GIL). At most one item is read ahead. The worker is kept for the process's life (`streamdi.pools`): the
    Delta tables it opened (`Lake` keeps them per thread) are caught up at the next migration instead of opened
    again, about 27 of them a migration."""
    done = object()
    pool = kept_pool("read-ahead", 1)
    upcoming = pool.submit(next, items, done)
    try:
        while (item := upcoming.result()) is not done:
            upcoming = pool.submit(next, items, done)
            yield item
    finally:
        wait([upcoming])  # `items` never runs on in the worker once its reader is gone


def mark_migrated(lake: Lake, report: MigrationReport, *, now: dt.datetime) -> None:
    """Record in the batch log that the batches a push or pull made visible are migrated, so the dataflow's
    migrate stage for them is done (it would be a no-op anyway). Marks are idempotent; a crash before this
    leaves the stage pending, and the dataflow's no-op run marks it."""
    if not report.batches:
        return
    batch_log = BatchLog(lake)
    for batch_id in report.batches:
        batch_log.mark(batch_id, "migrate", DONE, now=now, detail={"by": "migrate_pending"})
