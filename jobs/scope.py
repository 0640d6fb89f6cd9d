"""What one micro-batch's transform steps see: its id, its files, and the TPC-DI batches and dates in play.

Two notions of batch (docs/architecture.md, "Two notions of batch"):
- the **micro-batch** (`batch_id`): the batch log's sequence number; it orders and deduplicates work, is the
  version of every app transaction, and selects "this micro-batch's rows" in staging (`staging.*.batch_id`);
  it never reaches a warehouse row;
- the **TPC-DI batch** (`source_batch` in staging, `batchid` in the warehouse): 1 historical, 2.. incremental,
  each with its BatchDate (from its `BatchDate.txt`), which dates the changes of incremental files.

A micro-batch may carry files of several TPC-DI batches, and a dripped TPC-DI batch spreads over many
micro-batches; BatchDate.txt may arrive in any of them. `batch_dates` holds every BatchDate staged up to and
including this micro-batch. Change records of a TPC-DI batch whose date is still unknown wait in staging;
`newly_dated` lists the TPC-DI batches whose date arrived in this micro-batch, so the steps pick their
waiting records up then.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from schemas import sources as src
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.delta_appends import appended_files
from streamdi.lake import CHANGE_COLUMNS


@dataclass(frozen=True)
class BatchScope:
    batch_id: int
    source_batches: tuple[int, ...]  # TPC-DI batches of this micro-batch's files
    batch_dates: dict[int, dt.date] = field(default_factory=dict)  # TPC-DI batch -> BatchDate, known so far
    newly_dated: tuple[int, ...] = ()  # TPC-DI batches whose BatchDate was staged by this micro-batch
    file_seq: dict[str, int] = field(default_factory=dict)  # landing file -> position in the micro-batch
    sources: frozenset[str] = frozenset()  # declared sources of its files (`Trade_CDC`, `FINWIRE`, ...)
    skipped: frozenset[int] = frozenset()  # earlier micro-batches an operator skipped: their staged rows never count
    # Hears of migrated tables a step has finished before the step ends (`finished`); set by `jobs.transform.run`.
    on_finished: Callable[[tuple[Table, ...]], None] | None = field(default=None, compare=False, repr=False)

    def finished(self, *tables: Table) -> None:
        """A step made every commit of this micro-batch to `tables` (no later part of it or later step writes them):
        a migration running beside the transform may land them now rather than when the step ends."""
        if self.on_finished is not None:
            self.on_finished(tables)

    def carries(self, *names: str) -> bool:
        """True when the micro-batch has a file of one of these sources (a step with nothing new can skip)."""
        return any(n in self.sources for n in names)

    def app_id(self, step: str, table: Table, part: str | None = None) -> str:
        """The app transaction id of `step`'s commit to `table`: `step/table` (docs/architecture.md, "Exactly-once
        commits"); `part` names one of several commits of a step to the same table (`T3/dimessages/factholdings`:
        the alerts of FactHoldings)."""
        return f"{step}/{table.name}" if part is None else f"{step}/{table.name}/{part}"

    def committed(self, ctx: JobContext, step: str, table: Table, part: str | None = None) -> bool:
        """True when `step` already committed `table` (`part`) for this micro-batch (a rerun skips the work)."""
        if not ctx.lake.exists(table):
            return False
        done = ctx.lake.committed_version(table, self.app_id(step, table, part))
        return done is not None and done >= self.batch_id

    def changed(self, ctx: JobContext, table: Table, columns: list[str]) -> pa.Table | None:
        """`columns` of every row this micro-batch's commits inserted, updated (before and after images) or deleted
        in `table`, read from its change data feed; None when none of its commits is this micro-batch's."""
        if not ctx.lake.exists(table):
            return None
        versions = sorted(c.table_version for c in self.recent_history(ctx, table) if c.txn_version == self.batch_id)
        if not versions:
            return None
        wanted = [c for c in columns if c not in CHANGE_COLUMNS]  # the feed has those anyway
        feed = ctx.lake.changes(table, versions[0], versions[-1], columns=wanted)
        if versions[-1] - versions[0] + 1 == len(versions):  # no other commit in between: the whole feed is ours
            return feed.select(columns)  # (no filtered copy: a first load's feed is the size of the table)
        mine = feed.filter(pc.is_in(feed["_commit_version"], value_set=pa.array(versions, pa.int64())))
        return mine.select(columns)

    def inserted_only(self, ctx: JobContext, table: Table) -> bool:
        """True when every commit of this micro-batch to `table` only added rows (a first load; an append): its
        change feed holds inserts alone, so a reader that nets updates needs no columns for them."""
        versions = [c.table_version for c in self.recent_history(ctx, table) if c.txn_version == self.batch_id]
        return all(appended_files(ctx.lake.path(table), v, v) is not None for v in versions)

    def touched(
        self, ctx: JobContext, records: tuple[Table, ...], record_key: str, dimension: Table, dimension_key: str
    ) -> pa.Array:
        """The distinct int64 keys (`record_key`) of the records this micro-batch staged in `records`, and the keys
        (`dimension_key`) of `dimension` rows its commits changed: what a fact recomputes (accounts, trades)."""
        parts = []
        for table in records:
            if ctx.lake.exists(table):
                new = self.staged_where(ctx, table, pc.field("batch_id") == self.batch_id, [record_key])
                parts.append(new[record_key].combine_chunks().cast(pa.int64()))
        changed = self.changed(ctx, dimension, [dimension_key])
        if changed is not None:
            parts.append(changed[dimension_key].combine_chunks().cast(pa.int64()))
        if not parts:
            return pa.array([], pa.int64())
        return pc.unique(pa.concat_arrays(parts))

    def staged_where(
        self, ctx: JobContext, table: Table, condition: pc.Expression, columns: list[str] | None = None
    ) -> pa.Table:
        """The rows of a staging table that every micro-batch up to this one staged (except the skipped ones) where
        `condition` holds, read with delta-rs; `columns` only when given. Empty when the table does not exist yet."""
        if not ctx.lake.exists(table):
            schema = table.arrow_schema()
            return (schema if columns is None else pa.schema([schema.field(c) for c in columns])).empty_table()
        return ctx.lake.read_where(table, condition & self._upto(), columns)

    def _upto(self) -> pc.Expression:
        """The staged rows of every micro-batch up to this one, except the skipped ones."""
        upto = pc.field("batch_id") <= self.batch_id
        if self.skipped:
            upto = upto & ~pc.field("batch_id").isin(pa.array(sorted(self.skipped), pa.int64()))
        return upto

    def staged_pieces(self, ctx: JobContext, table: Table, columns: list[str], rows: int) -> Iterator[pa.Table]:
        """`staged_where(ctx, table, True, columns)` read as consecutive pieces of at least `rows` rows
        (`Lake.read_in_pieces`), in the same order; nothing when the table does not exist yet."""
        yield from ctx.lake.read_in_pieces(table, columns, self._upto(), rows)

    def recent_history(self, ctx: JobContext, table: Table) -> list:
        """`Lake.recent_history` of `table` for this micro-batch (its commits are among them); [] if no table."""
        return ctx.lake.recent_history(table, self.batch_id) if ctx.lake.exists(table) else []

    def staged_before(self, ctx: JobContext, tables: tuple[Table, ...]) -> bool:
        """Whether a micro-batch before this one committed rows to any of the staging `tables` (commit log only)."""
        return any(
            c.txn_version is not None and c.txn_version < self.batch_id and c.operation != "CREATE TABLE"
            for t in tables
            for c in self.recent_history(ctx, t)
        )


def record_columns(table: Table, columns: tuple[str, ...]) -> list[str]:
    """Those of `columns` a staging table has (a CDC source's have `cdc_dsn`, its Batch1 file's not): what a step
    reads of the staged records, not their lineage (source file, line number), which a first load holds for
    millions of rows."""
    return [c for c in columns if c in table.column_names]


def load_scope(ctx: JobContext, batch_id: int) -> BatchScope:
    """The scope of micro-batch `batch_id`, from the batch log and the staged BatchDate rows."""
    from streamdi.batchlog import BatchLog

    batch_log = BatchLog(ctx.lake)
    files = batch_log.files(batch_id)
    skipped = frozenset(b for b in batch_log.skipped_batches() if b < batch_id)
    dates: dict[int, dt.date] = {}
    newly: set[int] = set()
    table = src.BATCH_DATE.staging
    if ctx.lake.exists(table):
        rows = ctx.lake.read_arrow(table).to_pylist()
        known_before: set[int] = set()
        for r in sorted(rows, key=lambda r: (r["batch_id"], r["source_file"], r["line_no"])):
            if r["batch_id"] > batch_id or r["batch_id"] in skipped:
                continue
            dates[r["source_batch"]] = r["batchdate"]  # a redelivered BatchDate.txt: the latest one wins
            if r["batch_id"] < batch_id:
                known_before.add(r["source_batch"])
            elif r["source_batch"] not in known_before:
                newly.add(r["source_batch"])
    from jobs.landing import nondelimited_source_for_file, source_for_file

    sources = set()
    for f in files:
        kind = nondelimited_source_for_file(f.file, f.source_batch)
        declared = None if kind else source_for_file(f.file, f.source_batch)
        if kind or declared:
            sources.add(kind or declared.name)
    return BatchScope(
        batch_id=batch_id,
        sources=frozenset(sources),
        source_batches=tuple(sorted({f.source_batch for f in files})),
        batch_dates=dates,
        newly_dated=tuple(sorted(newly)),
        file_seq={f.file: f.file_seq for f in files},
        skipped=skipped,
    )
