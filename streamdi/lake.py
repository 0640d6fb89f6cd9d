"""The Delta Lake: the only module that touches Delta tables (through delta-rs, the `deltalake` package).

Spark does the compute; this module moves DataFrames in and out of Delta tables:

- `read` gives a table snapshot as a Spark DataFrame (the snapshot's Parquet files, read by Spark);
- `append`, `overwrite` and `upsert` commit a Spark DataFrame **with an app transaction** `(app_id, version)`:
  the table's last recorded version for `app_id` is checked first (under a per-table lock) and a commit
  whose version is not newer is skipped, so a retried or replayed commit is a no-op. delta-rs records app
  transactions but does not enforce them, hence the check here. A Spark DataFrame appended (or upserted into an
  empty table) is written as Parquet by Spark's executors, and the driver only commits the files (`_commit_files`);
- `changes` reads the change data feed between two versions;
- `compact` bin-packs the small files that micro-batches leave behind (a commit that changes no rows);
- every table is created from its declared schema with the change data feed on, and without deletion
  vectors or column mapping, so any Delta engine can read it.

Rows are sorted by the table's declared `order_by` before each write, so the same input always gives the
same files (determinism does not depend on Spark partitioning). delta-rs must not be used in a process that
forks afterwards: start helper processes with `spawn` or `subprocess`.

Long because it is the one module that imports `deltalake`: every use of delta-rs (opening and caching table
handles, the checked app-transaction commit, MERGE with deletes, the change feed, history, compaction, checkpoints
and vacuum) stays behind `Lake`, so the rest of streamdi sees Delta tables only through it. The parts that need no
delta-rs live elsewhere: the snapshot DataFrame cache in `streamdi.frames`, the cross-process locks in
`streamdi.locks`, Arrow-to-Spark conversion in `streamdi.spark`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import operator
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.transaction import AddAction

from schemas.model import Table
from streamdi import row_order
from streamdi.delta_appends import appended_files, changed_files, file_batches
from streamdi.delta_log import (
    FIRST_COMMIT,
    LAST_CHECKPOINT,
    AppTransactions,
    commit_infos,
    last_checkpoint,
    log_version,
    remove_before,
    remove_change_files,
    table_id,
)
from streamdi.delta_merge import merge_in_order, rows_per_file
from streamdi.errors import LakeDiskFull, causes
from streamdi.faults import fault_point
from streamdi.frames import FRAMES_KEPT, FrameCache, Kept
from streamdi.lending import Lender
from streamdi.locks import LOCK_DIR, flocked
from streamdi.memory import MIB
from streamdi.merge_bounds import key_bounds, target_bounds
from streamdi.parquet_stats import ROW_GROUP_ROWS, delta_stats, write_parquet
from streamdi.pools import kept_pool

if TYPE_CHECKING:  # pyspark is imported where a session is made (`streamdi.spark`): ~0.1 s a load without Spark saves
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

TABLE_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    # Keep the log readable by every Delta engine: no deletion vectors, no column mapping.
    "delta.enableDeletionVectors": "false",
}
TARGET_FILE_SIZE = "delta.targetFileSize"  # honoured by delta-rs when it writes, merges and compacts
# Row groups of at most `ROW_GROUP_ROWS` rows, as streamdi's own files (`streamdi.parquet_stats.write_parquet`).
# Compression must be named: delta-rs writes uncompressed files when given writer properties without it.
WRITER = WriterProperties(max_row_group_size=ROW_GROUP_ROWS, compression="SNAPPY")
METADATA_APP_ID = "streamdi.app_id"
METADATA_VERSION = "streamdi.txn_version"
COMPACT_TARGET_BYTES = 32 * 1024 * 1024  # `compact` merges files below this size into files of about this size
# Where Spark's executors write a commit's files before the driver moves them into the table and commits them
# (`Lake._commit_files`); Delta readers and vacuum leave directories whose name starts with "_" alone.
SCRATCH_DIR = "_streamdi_executor_writes"
PIECE = "piece"  # in the names of the files `Lake.write_piece` writes
# what a change feed row has besides the table's columns
CHANGE_FIELDS = (pa.field("_change_type", pa.string()), pa.field("_commit_version", pa.int64()))
CHANGE_COLUMNS = tuple(f.name for f in CHANGE_FIELDS)


DATASETS_KEPT = 64  # pyarrow datasets of table versions a Lake keeps for reuse (`Lake._dataset`)
COMPACT_THREADS = 4  # tables `compact` looks at (and compacts) at once
FOLDS_KEPT = 20_000  # per-file values of `Lake.fold_files` kept (a few per data file of the tables folded)
RESIDENT_FILES_KEPT = 100_000  # data files of resident tables held in memory (bounded by their bytes in practice)
RESIDENT_BYTES = 1024 * MIB  # default memory for the whole snapshots of resident tables (`Lake._whole`)
ARROW_PER_PARQUET = 5  # a snapshot in Arrow takes up to about this many times its Parquet files (staged trades: 4.2)
# A whole snapshot reads at 50-360 MiB of Parquet a second (SF 3's staged tables; the trades, with their strings,
# the slowest): the slowest rate prices a whole read of a resident table before it is held (`Lake._whole`).
WHOLE_READ_BYTES_PER_SECOND = 50 * MIB
V = TypeVar("V")


@dataclass(frozen=True)
class CommitResult:
    """What a write did: `committed` is False when the app transaction had already been recorded."""

    table: str
    app_id: str
    txn_version: int
    committed: bool
    table_version: int
    rows: int


@dataclass(frozen=True)
class CommitInfo:
    """One entry of a table's history, with the app transaction streamdi attached to it (if any)."""

    table_version: int
    operation: str
    app_id: str | None
    txn_version: int | None


class Lake:
    """Delta tables under one root directory: `<root>/<layer>/<table>`."""

    def __init__(
        self,
        root: Path,
        spark: SparkSession | None = None,
        spark_factory: Callable[[], SparkSession] | None = None,
        resident_bytes: int = RESIDENT_BYTES,
        whole_read_rate: float = WHOLE_READ_BYTES_PER_SECOND,
    ) -> None:
        """`spark` (or `spark_factory`, called on first need) is only required to read DataFrames;
        `resident_bytes` bounds the memory of resident tables' snapshots, `whole_read_rate` (Parquet bytes a
        second) prices a whole read of one (`_whole`)."""
        self.root = Path(root).absolute()
        self.spark = spark
        self._spark_factory = spark_factory
        # open Delta tables, lent to one thread at a time and caught up when lent again (see `_delta_at`)
        self._handles: Lender[DeltaTable] = Lender(lambda path: DeltaTable(str(path)), _catch_up)
        self._apps = AppTransactions()  # the tables' app transaction versions, remembered (`_app_version`)
        self._frames = FrameCache(FRAMES_KEPT)  # (path, files) -> snapshot DataFrame (`read`)
        self._datasets: Kept[ds.Dataset] = Kept(DATASETS_KEPT)  # (path, table id, version) -> dataset
        # Resident tables (`_whole`): the rows of each data file held, (path, table id, file) -> rows, within
        # `resident_bytes`; the snapshot last put together from them, (path, table id, version) -> rows; and the
        # seconds reads from a table's files have taken since (path, table id) -> seconds
        self._file_rows: Kept[pa.Table] = Kept(RESIDENT_FILES_KEPT, budget=resident_bytes, weigh=lambda t: t.nbytes)
        self._wholes: Kept[pa.Table] = Kept(DATASETS_KEPT)
        self._disk_seconds: Kept[float] = Kept(DATASETS_KEPT)
        self._written: set[Path] = set()  # tables this Lake committed to since its last `compact(written_only=True)`
        # Change feeds someone still holds, or that one thread is reading: (path, table id, start, end, columns or
        # None for all) -> a weak reference to the feed, or the Future of its read (`changes`)
        self._feeds: dict[tuple, weakref.ref | Future] = {}
        self._feeds_lock = threading.Lock()
        self._written_lock = threading.Lock()
        self._folds: Kept[object] = Kept(FOLDS_KEPT)  # (path, table id, file, fold name) -> value (`fold_files`)
        self._whole_read_rate = whole_read_rate
        # Called before every commit while set (`gated`): a transform holds the commits of a step until the quality
        # checks of the steps before it have passed; the thread that runs those checks commits freely (`ungated`).
        self._gate: Callable[[], None] | None = None
        self._ungated = threading.local()

    @property
    def held_bytes(self) -> int:
        """Bytes of the resident tables' rows this lake holds in memory (within its `resident_bytes`)."""
        return self._file_rows.weight

    # ----------------------------------------------------------------------------------------- layout
    def path(self, table: Table) -> Path:
        return self.root / table.layer / table.name

    def exists(self, table: Table) -> bool:
        """Whether the table has a Delta log. Its first commit file answers (a commit file is written whole, at
        once), or its last checkpoint when `maintain` cleaned the first commit up; delta-rs is asked only without
        either. `DeltaTable.is_deltatable` lists the log holding the GIL: ~0.5 s of GIL per micro-batch at SF 6
        after 80 micro-batches (py-spy), though no change in the micro-batch's wall time was measurable on this
        2-core machine."""
        log_dir = self.path(table) / "_delta_log"
        if (log_dir / FIRST_COMMIT).is_file() or (log_dir / LAST_CHECKPOINT).is_file():
            return True
        return log_dir.is_dir() and DeltaTable.is_deltatable(str(self.path(table)))

    @contextmanager
    def gated(self, gate: Callable[[], None]) -> Iterator[None]:
        """Within: every commit (a table's creation included), from any thread but an `ungated` one, first calls
        `gate`, which waits for what must come first and raises to refuse the commit."""
        self._gate = gate
        try:
            yield
        finally:
            self._gate = None

    @contextmanager
    def ungated(self) -> Iterator[None]:
        """Within, in this thread: commits do not wait for the `gated` gate."""
        self._ungated.on = True
        try:
            yield
        finally:
            self._ungated.on = False

    def _pass_gate(self) -> None:
        gate = self._gate
        if gate is not None and not getattr(self._ungated, "on", False):
            gate()

    def ensure_table(self, table: Table) -> None:
        """Create `table` (empty, declared schema, change feed on) unless it exists; check the schema if it does."""
        if self.exists(table):
            with self._delta(table) as delta:
                self._check_schema(table, delta)
            return
        self._pass_gate()  # a creation is a commit; a look at an existing table is not
        path = self.path(table)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock(table.qualified_name):
            DeltaTable.create(
                str(path),
                schema=table.arrow_schema(),
                mode="ignore",
                name=table.name,
                description=table.doc or None,
                configuration=table_properties(table),
            )
        log.info("created Delta table %s at %s", table.qualified_name, path)

    def _check_schema(self, table: Table, delta: DeltaTable) -> None:
        actual = [f.name for f in delta.schema().fields]
        if actual != table.column_names:
            raise RuntimeError(
                f"Delta table {table.qualified_name} at {self.path(table)} has columns {actual}, "
                f"but the declaration in schemas/ says {table.column_names}. Migrate or remove the table."
            )

    @contextmanager
    def _delta(self, table: Table, version: int | None = None) -> Iterator[DeltaTable]:
        """The table at `version`, or its latest snapshot, for the block (see `_delta_at`)."""
        if not self.exists(table):
            raise FileNotFoundError(f"Delta table {table.qualified_name} does not exist at {self.path(table)}")
        with self._delta_at(self.path(table), version) as delta:
            yield delta

    @contextmanager
    def _delta_at(self, path: Path, version: int | None = None) -> Iterator[DeltaTable]:
        """The Delta table at `path`, at `version` or its latest snapshot, for the block. Opening a table replays
        its log (6-17 ms); a latest snapshot is lent instead (`streamdi.lending`): a handle kept from an earlier
        block, of any thread, is brought up to date (`_catch_up`: a `stat` when no commit came since, else the commits
        made since, by any process) and is this block's alone until it ends. A table removed and created again under
        the same path (another Delta table id, `streamdi.delta_log.table_id`) is opened afresh."""
        if version is not None:
            yield DeltaTable(str(path), version=version)
            return
        with self._handles.lend(path, table_id(path)) as delta:
            yield delta

    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock across processes on this machine (check-then-commit must not interleave).

        Not re-entrant: never take the same name twice in one process.
        """
        with flocked(self.root / LOCK_DIR / f"{name}.lock"):
            yield

    # ----------------------------------------------------------------------------------------- reads
    def version(self, table: Table) -> int:
        with self._delta(table) as delta:
            return delta.version()

    def row_count(self, table: Table) -> int:
        """Rows of the latest snapshot, from the files' statistics (delta-rs, no Spark; scans if a file has none)."""
        with self._delta(table) as delta:
            actions = delta.get_add_actions(flatten=True)
            counts = actions.column("num_records").to_pylist() if actions.num_rows else []
            if None not in counts:
                return int(sum(counts))
            return delta.to_pyarrow_table(columns=[table.column_names[0]]).num_rows

    def read_columns(self, table: Table, columns: list[str]) -> pa.Table:
        """Only `columns` of the latest snapshot, read with delta-rs (no Spark), in no particular order."""
        with self._delta(table) as delta:
            whole = self._whole(table, delta)
            if whole is not None:
                return whole.select(columns)
            return self._from_files(table, delta, lambda: self._dataset(table, delta).to_table(columns=columns))

    def read_where(self, table: Table, condition: pc.Expression, columns: list[str] | None = None) -> pa.Table:
        """The latest snapshot's rows where `condition` (a pyarrow compute expression) holds, with delta-rs (no
        Spark), in the declared column types and no particular order; only `columns` when given."""
        names = list(columns) if columns is not None else table.column_names
        with self._delta(table) as delta:
            return self._where(delta, table, condition, names)

    def _where(self, delta: DeltaTable, table: Table, condition: pc.Expression, names: list[str]) -> pa.Table:
        """`read_where` on a handle the caller holds: a held snapshot (`_whole`) filtered in memory, else a scan of
        the version's kept dataset, whose time counts towards holding the table."""
        whole = self._whole(table, delta)
        if whole is not None:
            return whole.filter(condition).select(names)
        return self._from_files(
            table, delta, lambda: self._scan(delta, table, names, condition, self._dataset(table, delta))
        )

    def _whole(self, table: Table, delta: DeltaTable) -> pa.Table | None:
        """The whole snapshot of a `Table.resident` table in memory (declared types), or None: a table not
        resident, a snapshot larger than the memory left for them, or a table none of whose files is held yet and
        whose reads from its files have not yet cost what reading it whole would (its Parquet bytes at
        `whole_read_rate`). That rule holds a table once holding it has paid for itself, and never costs more than
        twice the better choice: a warm process that looks the staged history up by scattered keys in every
        micro-batch (85-250 ms a read for the staged trades at SF 6) holds it after a few reads and then filters it
        in ~10 ms, while a one-shot `streamdi load` of an incremental batch, whose few reads skip most row groups
        (~6 ms each at SF 3), never pays the whole read (~0.8 s for the staged tables at SF 3).

        A Delta data file never changes, so its rows are held per file: a new version of a held table (an append,
        a MERGE) is put together from the files held and reads only the files its commits added, and the files its
        commits removed are let go. A table that changes in every micro-batch (a change feed's staged rows, the live
        windows) is then read whole once, not at each version."""
        key = self._resident_key(table, delta)
        if key is None:
            return None
        whole = self._wholes.get(key)
        if whole is not None:
            return whole
        path, stamp, _ = key
        sizes = _data_files(delta)
        files = list(sizes)
        held = {f: self._file_rows.get((path, stamp, f)) for f in files}
        missing = sum(sizes[f] for f, rows in held.items() if rows is None)
        paid = self._disk_seconds.get((path, stamp)) or 0.0
        if missing and all(rows is None for rows in held.values()) and paid < missing / self._whole_read_rate:
            return None  # nothing held yet: only once reads from its files have cost what the whole read will
        # held only where it fits beside the other tables held (its own files that a commit removed make way):
        # tables that do not fit are read from their files, rather than pushing each other out at every micro-batch
        others = self._file_rows.weight_where(lambda kept: kept[:2] != (path, stamp))
        if sum(sizes.values()) * ARROW_PER_PARQUET > (self._file_rows.budget or 0) - others:
            return None
        schema = table.arrow_schema()
        parts = [
            rows if rows is not None else self._file_rows.put((path, stamp, f), self._file_whole(path / f, schema))
            for f, rows in held.items()
        ]
        current = set(files)
        self._file_rows.drop_where(lambda kept: kept[0] == path and (kept[1] != stamp or kept[2] not in current))
        self._wholes.drop_where(lambda kept: kept[0] == path)  # an older version is rarely read again
        self._disk_seconds.drop_where(lambda kept: kept == (path, stamp))
        return self._wholes.put(key, pa.concat_tables(parts) if parts else schema.empty_table())

    def fold_files(
        self,
        table: Table,
        columns: list[str],
        name: str,
        fold: Callable[[pa.Table], V],
        known: Callable[[], Mapping[str, V]] | None = None,
    ) -> dict[str, V]:
        """`fold` of the rows (`columns`, declared types) of each data file of the table's latest snapshot, by file
        (relative path), in the snapshot's order of files. A Delta data file never changes, so each file's value is
        computed once and kept under `name` while the file is in the snapshot: a table that grows by a few files a
        micro-batch costs the new files only. `known()` gives values an earlier process computed (under the same
        `name`), called once, on the first file this process has not folded, and taken for such files. `fold` must not
        return None; give a new `name` when what it computes changes."""
        with self._delta(table) as delta:
            files = list(_data_files(delta))
        path = self.path(table)
        stamp = table_id(path)
        schema = pa.schema([table.arrow_schema().field(c) for c in columns])
        values = {}
        loaded: Mapping[str, V] | None = None
        for f in files:
            value = self._folds.get((path, stamp, f, name))
            if value is None and known is not None:
                loaded = known() if loaded is None else loaded  # once, on the first miss
                value = loaded.get(f)
            if value is None:
                held = self._file_rows.get((path, stamp, f))  # a resident table's file already in memory
                value = fold(held.select(columns) if held is not None else self._file_whole(path / f, schema))
            values[f] = self._folds.put((path, stamp, f, name), value)
        current = set(files)
        self._folds.drop_where(lambda k: k[0] == path and k[3] == name and (k[1] != stamp or k[2] not in current))
        return values

    @staticmethod
    def _file_whole(file: Path, schema: pa.Schema) -> pa.Table:
        """Every row of one data file in `schema` (delta-rs's MERGE writes strings as `string_view`)."""
        return pq.read_table(file, columns=schema.names).select(schema.names).cast(schema).combine_chunks()

    def _from_files(self, table: Table, delta: DeltaTable, read: Callable[[], pa.Table]) -> pa.Table:
        """`read()` of `delta`'s files; for a resident table its time counts towards holding it (`_whole`)."""
        started = time.perf_counter()
        rows = read()
        self._paid(self._resident_key(table, delta), time.perf_counter() - started)
        return rows

    def _paid(self, key: tuple[Path, str, int] | None, seconds: float) -> None:
        """Count `seconds` of reading a resident table's files (`_resident_key`; None: not resident) towards
        holding it (`_whole`)."""
        if key is not None:
            self._disk_seconds.put(key[:2], (self._disk_seconds.get(key[:2]) or 0.0) + seconds)

    def _resident_key(self, table: Table, delta: DeltaTable) -> tuple[Path, str, int] | None:
        """(path, table id, version) of a resident table while resident tables may be held, else None: one
        table version, also across a table removed and created again."""
        if not table.resident or self._file_rows.budget == 0:
            return None
        path = self.path(table)
        stamp = table_id(path)
        return None if stamp is None else (path, stamp, delta.version())

    def _dataset(self, table: Table, delta: DeltaTable) -> ds.Dataset:
        """The pyarrow dataset of `delta`'s snapshot, built once per table version: a dataset keeps its files'
        Parquet footers once read, so later scans of the same version skip files and row groups by statistics
        without opening them again (a filtered DimTrade read at SF 6: ~25 ms built afresh, ~10 ms on a kept
        dataset; the steps of a micro-batch read the same dimension versions many times)."""
        path = self.path(table)
        stamp = table_id(path)
        if stamp is None:
            return delta.to_pyarrow_dataset()
        return self._datasets.get_or_build((path, stamp, delta.version()), delta.to_pyarrow_dataset)

    def read_if_exists(
        self, table: Table, columns: list[str] | None = None, condition: pc.Expression | None = None
    ) -> pa.Table:
        """`read_where` (`read_columns` without a condition), or no rows in the declared types of `columns` when the
        table does not exist yet (the Arrow steps read tables that an earlier micro-batch may not have made)."""
        names = list(columns) if columns is not None else table.column_names
        if not self.exists(table):
            return table.arrow_schema().empty_table().select(names)
        return self.read_columns(table, names) if condition is None else self.read_where(table, condition, names)

    def read_in_pieces(
        self, table: Table, columns: list[str], condition: pc.Expression, rows: int
    ) -> Iterator[pa.Table]:
        """`read_if_exists(table, columns, condition)` as consecutive pieces of at least `rows` rows (the last one
        smaller), read as the scan goes: a caller that reduces each piece before it takes the next never holds the
        whole read (a first load's live windows: SF 100's 42 M market rows). A held snapshot is cut into pieces;
        files whose string columns a scan cannot compare (`_scan`) are read whole a batch at a time and filtered."""
        if not self.exists(table):
            return
        schema = table.arrow_schema()
        wanted = pa.schema([schema.field(n) for n in columns])
        with self._delta(table) as delta:
            whole = self._whole(table, delta)
            dataset = self._dataset(table, delta) if whole is None else None
            key = self._resident_key(table, delta)
        if dataset is None:
            found = whole.filter(condition).select(columns)
            for start in range(0, found.num_rows, rows):
                yield found.slice(start, rows)
            return
        started, spent = time.perf_counter(), 0.0
        try:
            batches = dataset.scanner(columns=columns, filter=condition).to_batches()
            first = next(batches, None)
        except pa.ArrowNotImplementedError:  # filtered after the read, a batch at a time
            batches = (
                pa.Table.from_batches([b]).cast(schema).filter(condition).select(columns).to_batches()
                for b in dataset.scanner(columns=table.column_names).to_batches()
            )
            batches, first = itertools.chain.from_iterable(batches), None
        pending, count = ([first] if first is not None else []), (first.num_rows if first is not None else 0)
        for batch in batches:
            if count >= rows:
                spent += time.perf_counter() - started
                yield pa.Table.from_batches(pending).select(columns).cast(wanted)
                pending, count, started = [], 0, time.perf_counter()
            pending.append(batch)
            count += batch.num_rows
        self._paid(key, spent + time.perf_counter() - started)  # the scan's time, as `_from_files` counts it
        if count:
            yield pa.Table.from_batches(pending).select(columns).cast(wanted)

    @staticmethod
    def _scan(
        delta: DeltaTable,
        table: Table,
        columns: list[str],
        condition: pc.Expression,
        dataset: ds.Dataset | None = None,
    ) -> pa.Table:
        """`columns` (in the declared types) of the rows of `delta` (or of its `dataset`) where `condition` holds.
        The condition goes into the scan, which skips files and row groups by their statistics. delta-rs's MERGE
        writes string columns as `string_view`, which a pyarrow scan cannot compare with a string: in a table with
        such files, the rows are read whole and filtered after the read."""
        schema = table.arrow_schema()
        wanted = pa.schema([schema.field(n) for n in columns])
        dataset = dataset if dataset is not None else delta.to_pyarrow_dataset()
        try:
            return dataset.to_table(columns=columns, filter=condition).select(columns).cast(wanted)
        except pa.ArrowNotImplementedError:
            rows = dataset.to_table(columns=table.column_names).cast(schema)  # the condition may name any column
            return rows.filter(condition).select(columns)

    def committed_version(self, table: Table, app_id: str) -> int | None:
        """Last transaction version recorded for `app_id` on `table` (None if never)."""
        with self._delta(table) as delta:
            return self._app_version(table, delta, app_id)

    def _app_version(self, table: Table, delta: DeltaTable, app_id: str) -> int | None:
        """`delta.transaction_version(app_id)`, from what `AppTransactions` remembers where it can."""
        return self._apps.version(self.path(table), delta.version(), app_id, delta.transaction_version)

    def read(self, table: Table, version: int | None = None) -> DataFrame:
        """The table's snapshot (latest, or at `version`) as a Spark DataFrame with the declared schema.

        The DataFrame of a set of data files is kept (the last `FRAMES_KEPT`, in a `streamdi.frames.FrameCache`)
        and returned again while the snapshot has the same files (a Delta data file never changes)."""
        spark = self._spark()
        with self._delta(table, version) as delta:
            files = delta.file_uris()
        if not files:
            return self.empty(table)
        return self._frames.frame(
            (str(self.path(table)), tuple(files)),
            spark,
            lambda: (
                spark.read.schema(table.spark_schema())
                .option("basePath", str(self.path(table)))
                .parquet(*files)
                .select(*table.column_names)
            ),
        )

    def empty(self, table: Table) -> DataFrame:
        """An empty DataFrame with the table's columns (`literal_frame`: no Python workers)."""
        from streamdi.spark import literal_frame

        return literal_frame(self._spark(), [], table.spark_schema())

    def to_frame(self, table: Table, data: pa.Table) -> DataFrame:
        """Arrow rows of `table` as a Spark DataFrame (`streamdi.spark.arrow_frame`), or `empty` when there are none."""
        from streamdi.spark import arrow_frame

        return arrow_frame(self._spark(), data) if data.num_rows else self.empty(table)

    def read_arrow(self, table: Table, version: int | None = None) -> pa.Table:
        """The snapshot as an Arrow table, sorted by the declared order (for small tables and tests)."""
        with self._delta(table, version) as delta:
            data = delta.to_pyarrow_table()
        return _sorted(data.select(table.column_names), table)

    def changes(
        self, table: Table, start_version: int, end_version: int | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        """Change data feed rows with `start_version <= _commit_version <= end_version`.

        Columns: the table's columns (`columns` of them only, when given) plus `_change_type` (insert,
        update_preimage, update_postimage, delete) and `_commit_version`.

        A feed still held by someone (or being read by another thread) is returned again, not read again: a step's
        checks read back what it wrote while the migration beside the transform reads the same commit, and a first
        load's feed is the size of the table (SF 30's FactMarketHistory: 2.3 GiB). A reader of a few `columns` takes
        them from a whole feed someone holds, else reads only them (the windows read 6 of FactMarketHistory's 15).
        """
        last = self.version(table) if end_version is None else end_version
        stamp = table_id(self.path(table))
        if stamp is None:
            return self._changes(table, start_version, last, columns)
        whole_key = (self.path(table), stamp, start_version, last, None)
        key = whole_key if columns is None else (*whole_key[:-1], tuple(columns))
        with self._feeds_lock:
            whole = self._held_feed(whole_key)
            if whole is not None:
                return whole if columns is None else whole.select([*columns, *CHANGE_COLUMNS])
            held = self._held_feed(key)
            if held is not None:
                return held
            entry = self._feeds.get(key)
            reading = entry if isinstance(entry, Future) else None
            if reading is None:
                self._feeds[key] = mine = Future()
        if reading is not None:
            return reading.result()
        try:
            feed = self._changes(table, start_version, last, columns)
        except BaseException as exc:
            with self._feeds_lock:
                del self._feeds[key]
            mine.set_exception(exc)
            raise
        with self._feeds_lock:
            self._feeds = {k: v for k, v in self._feeds.items() if isinstance(v, Future) or v() is not None}
            self._feeds[key] = weakref.ref(feed)
        mine.set_result(feed)
        return feed

    def _held_feed(self, key: tuple) -> pa.Table | None:
        """The feed kept under `key` while someone still holds it (call with `_feeds_lock` held)."""
        entry = self._feeds.get(key)
        return entry() if isinstance(entry, weakref.ref) else None

    def _changes(self, table: Table, start_version: int, last: int, columns: list[str] | None = None) -> pa.Table:
        declared = table.arrow_schema()
        fields = list(declared) if columns is None else [declared.field(c) for c in columns]
        schema = pa.schema([*fields, *CHANGE_FIELDS])
        appended = appended_files(self.path(table), start_version, last)
        if appended is not None:  # only rows added: the feed is their files' rows (`streamdi.delta_appends`)
            return pa.Table.from_batches(_inserts(appended, schema), schema)
        changed = changed_files(self.path(table), start_version, last)
        if changed is not None:  # the change data files and the files added and removed, read here
            return pa.Table.from_batches(_changed_rows(changed, schema), schema)
        with self._delta(table) as delta:
            reader = delta.load_cdf(starting_version=start_version, ending_version=last, columns=schema.names)
            # delta-rs returns string views and its own integer widths; give callers the declared types. Each batch
            # is cast as it arrives and delta-rs's copy let go, so a feed is held once, not twice.
            batches = pa.RecordBatchReader.from_stream(reader)
            return pa.Table.from_batches([batch.select(schema.names).cast(schema) for batch in batches], schema)

    def history(self, table: Table, *, after: int | None = None) -> list[CommitInfo]:
        """Commits of the table, oldest first, with the app transaction each one carried; with `after`, only
        those with a table version above it. Delta keeps one log file per commit and the history reads them
        newest first, so with `after` the cost is the commits returned, not the table's age."""
        with self._delta(table) as delta:
            limit = None
            entries = None
            if after is not None:
                latest = delta.version()
                limit = latest - after
                if limit <= 0:
                    return []
                entries = commit_infos(self.path(table) / "_delta_log", after + 1, latest)
            if entries is None:
                entries = delta.history(limit)
        infos = []
        for entry in entries:
            app_id = entry.get(METADATA_APP_ID)
            txn = entry.get(METADATA_VERSION)
            infos.append(
                CommitInfo(
                    table_version=int(entry["version"]),
                    operation=str(entry.get("operation", "")),
                    app_id=app_id,
                    txn_version=int(txn) if txn is not None else None,
                )
            )
        return sorted(infos, key=lambda c: c.table_version)

    def recent_history(self, table: Table, txn_version: int) -> list[CommitInfo]:
        """The newest commits of a table committed in micro-batch order (a staging table by the stage step, a
        warehouse table by its transform step), oldest first: back to and including the newest commit of an
        earlier micro-batch (app transaction version below `txn_version`), or the whole history when there is
        none. So the commits of micro-batch `txn_version` are among them, at a cost that does not grow with
        the table's age (whole-history reads cost about 0.2 ms per commit: 0.1 s at 600 commits)."""
        latest = self.version(table)
        window = 8
        while True:
            commits = self.history(table, after=max(latest - window, -1))
            if window > latest or any(c.txn_version is not None and c.txn_version < txn_version for c in commits):
                return commits
            window *= 4

    # ----------------------------------------------------------------------------------------- writes
    def append(self, table: Table, df: DataFrame | pa.Table, *, app_id: str, version: int) -> CommitResult:
        """Append the rows once: a repeated `(app_id, version)` (or an older version) is skipped. A Spark DataFrame
        is written by Spark's executors and only committed by the driver (`_commit_files`)."""
        return self._commit(table, df, app_id, version, mode="append")

    def overwrite(self, table: Table, df: DataFrame | pa.Table, *, app_id: str, version: int) -> CommitResult:
        """Replace the table's content once per `(app_id, version)`."""
        return self._commit(table, df, app_id, version, mode="overwrite")

    def upsert(
        self,
        table: Table,
        df: DataFrame | pa.Table,
        *,
        app_id: str,
        version: int,
        deletes: DataFrame | pa.Table | None = None,
    ) -> CommitResult:
        """MERGE the rows on the table's key: insert new keys, update changed rows, leave equal rows alone,
        and delete the rows whose key is listed in `deletes` (key columns only) -- all in one commit.

        Skipped when `(app_id, version)` is already recorded. The source must hold at most one row per key,
        and no key may be both upserted and deleted. A Spark DataFrame upserted into an empty table without
        deletes (the first load of a table: Batch1) is appended by Spark's executors (`_commit_files`); other
        upserts are MERGEs in the driver.
        """
        if not table.key:
            raise ValueError(f"{table.qualified_name} declares no key; upsert needs one")
        return self._commit(table, df, app_id, version, mode="merge", deletes=deletes)

    def _commit(
        self,
        table: Table,
        df: DataFrame | pa.Table,
        app_id: str,
        version: int,
        mode: str,
        deletes: DataFrame | pa.Table | None = None,
    ) -> CommitResult:
        if not self.exists(table):
            self.ensure_table(table)
        if _spark_frame(df) and self._executors_append(table, mode, deletes):
            return self._commit_files(table, df, app_id, version)
        data = _one_chunk(self.to_arrow(table, df))
        doomed = self._delete_keys(table, deletes)
        return self._checked_commit(
            table,
            app_id,
            version,
            mode,
            place=lambda delta: data.num_rows,
            write=lambda delta, props, _: self._write(delta, table, data, props, mode, doomed),
        )

    def _checked_commit(
        self,
        table: Table,
        app_id: str,
        version: int,
        mode: str,
        place: Callable[[DeltaTable], int],
        write: Callable[[DeltaTable, CommitProperties, int], None],
    ) -> CommitResult:
        """The exactly-once commit both write paths share: under the table's lock, skip a recorded `(app_id,
        version)`; otherwise `place` whatever must exist before the commit (the executors' files; returns the rows),
        then `write` the commit with the app transaction, with the fault points around it and a full disk reported
        as `LakeDiskFull`. A `gated` commit first passes the gate."""
        self._pass_gate()
        # one handle for the whole check-then-commit (caught up with every commit made before the lock was taken),
        # brought up to date after each write with the commits it made
        with self.lock(table.qualified_name), self._delta(table) as delta:
            self._check_schema(table, delta)
            done = self._app_version(table, delta, app_id)
            if done is not None and done >= version:
                log.info("skip %s %s: app transaction %s already at %s", mode, table.qualified_name, app_id, done)
                return CommitResult(table.qualified_name, app_id, version, False, delta.version(), 0)
            props = CommitProperties(
                app_transactions=[Transaction(app_id=app_id, version=version)],
                custom_metadata={METADATA_APP_ID: app_id, METADATA_VERSION: str(version)},
            )
            with _disk_full_is_clear(self.root, table):
                rows = place(delta)
                fault_point("lake.before_commit")
                fault_point(f"lake.before_commit:{app_id}")  # a fault right before one named commit
                write(delta, props, rows)
            with self._written_lock:
                self._written.add(self.path(table))
            fault_point("lake.after_commit")
            fault_point(f"lake.after_commit:{app_id}")  # a crash right after one named commit
            _catch_up(self.path(table), delta)  # delta-rs's writes and MERGE move the handle along already
            new_version = delta.version()
        log.info("%s %s rows into %s as %s@%s -> v%s", mode, rows, table.qualified_name, app_id, version, new_version)
        return CommitResult(table.qualified_name, app_id, version, True, new_version, rows)

    def is_empty(self, table: Table) -> bool:
        """Whether the table's latest snapshot has no data file (so no rows)."""
        if not self.exists(table):
            return True
        with self._delta(table) as delta:
            return not delta.file_uris()

    def _executors_append(self, table: Table, mode: str, deletes: DataFrame | pa.Table | None) -> bool:
        """Whether a Spark DataFrame's commit is an append that Spark's executors write: an append, or an upsert
        into an empty table without deletes (it inserts every row). A caller that wants the driver to write a small
        DataFrame passes it as Arrow (`to_arrow`)."""
        return mode == "append" or (mode == "merge" and deletes is None and self.is_empty(table))

    def _commit_files(self, table: Table, df: DataFrame, app_id: str, version: int) -> CommitResult:
        """Append `df` once per `(app_id, version)`: Spark's executors write its rows as Parquet (hash-partitioned
        on the table's key, each file in the declared order), and the driver moves the files into the table and
        commits them as add actions with their statistics (`streamdi.parquet_stats`) and the app transaction.
        Nothing of the rows passes through the driver: only the files' footers are read.

        Exactly once: under the table's commit lock, a recorded `(app_id, version)` is skipped; otherwise the files
        of an earlier attempt that crashed before its commit (in the scratch directory, or moved into the table but
        never committed, so no snapshot refers to them) are replaced, under the same names: they are named after
        the app transaction and their position in the declared order."""
        frame = _declared_frame(table, df)
        order = list(table.order_by or table.key)
        if order:
            # hashed on the key into the session's shuffle partitions, each sorted: the files' contents do not depend
            # on how the DataFrame was partitioned, and no pass computes it twice (a global sort samples it first)
            by = list(table.key or order)
            partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
            frame = frame.repartition(partitions, *by).sortWithinPartitions(*order)
        scratch = self.scratch_dir(table, app_id, version)
        actions: list[AddAction] = []

        def place(delta: DeltaTable) -> int:
            """The executors write into the scratch directory; the files move into the table, named in order."""
            shutil.rmtree(scratch, ignore_errors=True)
            frame.write.mode("overwrite").option("compression", "snappy").parquet(scratch.as_uri())
            fault_point("lake.after_executor_write")
            return self._move_written(table, app_id, version, actions)

        return self._checked_commit(table, app_id, version, "append", place, self._adder(table.arrow_schema(), actions))

    def scratch_dir(self, table: Table, app_id: str, version: int) -> Path:
        """Where Parquet files written outside the driver wait for commit `(app_id, version)` of `table`
        (`append_written`)."""
        return self.path(table) / SCRATCH_DIR / _file_stem(app_id, version)

    def append_written(self, table: Table, *, app_id: str, version: int) -> CommitResult:
        """Commit, once per `(app_id, version)`, the Parquet files that workers outside the driver wrote into
        `scratch_dir(table, app_id, version)` (`part-*.parquet`, in name order, each in the table's schema): they move
        into the table like `_commit_files`' and are added with their statistics and the app transaction. A recorded
        `(app_id, version)` is skipped; the scratch directory is removed either way."""
        if not self.exists(table):
            self.ensure_table(table)
        scratch = self.scratch_dir(table, app_id, version)
        actions: list[AddAction] = []
        try:
            return self._checked_commit(
                table,
                app_id,
                version,
                "append",
                lambda delta: self._move_written(table, app_id, version, actions),
                self._adder(table.arrow_schema(), actions),
            )
        finally:
            _remove_scratch(scratch)

    def write_piece(self, table: Table, rows: pa.Table, *, app_id: str, version: int, position: int) -> int:
        """Write `rows`, one piece of an append too big to hold whole (a first load computed a piece at a time), as
        file `position` of commit `(app_id, version)`'s scratch directory, in the table's schema and sorted by its
        declared order; `append_written` commits the pieces at once, so the table is never whole in memory. Each
        file is in order within itself, as the executors' files are. Piece 0 first clears what an earlier attempt
        left. A table with its own file size (`Table.file_bytes`) gets the piece in consecutive files of about that
        size, as delta-rs writes it: a later MERGE then rewrites only the files that hold its keys (DimTrade's first
        load at SF 6 in pieces of 12 MB: delta-rs's MERGE, which does not keep its output in order, rewrote one into
        overlapping 4 MB files, and every later micro-batch rewrote all three, 181,000 rows for 606 trades).
        Returns the rows written."""
        scratch = self.scratch_dir(table, app_id, version)
        if position == 0:
            shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True, exist_ok=True)
        schema = table.arrow_schema()
        data = _sorted(rows.select(schema.names).cast(schema), table)
        step = rows_per_file(data, table.file_bytes)
        for part, start in enumerate(range(0, data.num_rows, step)):
            written = scratch / f"part-{position:05d}-{part:05d}.{PIECE}.parquet"
            write_parquet(data.slice(start, step), written)
        return data.num_rows

    def pieces(self, table: Table, *, app_id: str, version: int) -> PieceFiles:
        """A first load's commit `(app_id, version)` of `table` written a piece at a time (`PieceFiles`)."""
        return PieceFiles(self, table, app_id, version)

    def written_in_pieces(self, table: Table, commit: CommitInfo) -> bool:
        """Whether `commit` added only files written a piece at a time (`write_piece`): read file after file, its
        rows come in one fixed order that depends only on the rows (each piece in the declared order, the pieces in
        their order), though not in the declared order across the pieces."""
        if commit.app_id is None or commit.txn_version is None:
            return False
        added = appended_files(self.path(table), commit.table_version, commit.table_version)
        stem = f"{_file_stem(commit.app_id, commit.txn_version)}-{PIECE}-"
        return bool(added) and all(f.name.startswith(stem) for _, files in added for f in files)

    def discard_written(self, table: Table, *, app_id: str, version: int) -> None:
        """Remove the files written for commit `(app_id, version)` that will not be committed (a halted stage)."""
        _remove_scratch(self.scratch_dir(table, app_id, version))

    def _move_written(self, table: Table, app_id: str, version: int, actions: list[AddAction]) -> int:
        """Move the Parquet files of the commit's scratch directory into the table, named after the commit
        (`_file_stem`) and their position in name order, and list their add actions (statistics from their footers)
        in `actions`; returns their rows."""
        scratch = self.scratch_dir(table, app_id, version)
        name = _file_stem(app_id, version)
        path = self.path(table)
        schema = table.arrow_schema()
        rows = 0
        for position, written in enumerate(sorted(scratch.glob("part-*.parquet"))):
            file_rows, stats = delta_stats(written, schema)
            if file_rows == 0:  # Spark writes a file of no rows for an empty DataFrame
                continue
            kind = f"{PIECE}-" if written.name.endswith(f".{PIECE}.parquet") else ""
            target = f"{name}-{kind}{position:05d}.snappy.parquet"
            os.replace(written, path / target)
            info = (path / target).stat()
            actions.append(AddAction(target, info.st_size, {}, info.st_mtime_ns // 1_000_000, True, stats))
            rows += file_rows
        _remove_scratch(scratch)
        log.info("%s: %d files written by executors for %s@%s", table.qualified_name, len(actions), app_id, version)
        return rows

    @staticmethod
    def _adder(schema: pa.Schema, actions: list[AddAction]) -> Callable[[DeltaTable, CommitProperties, int], None]:
        """The commit of files placed by `_move_written`: their add actions, or the app transaction alone."""

        def write(delta: DeltaTable, props: CommitProperties, rows: int) -> None:
            if actions:
                delta.create_write_transaction(actions, mode="append", schema=schema, commit_properties=props)
            else:  # no rows: the app transaction alone, so a replay is skipped
                write_deltalake(
                    delta, schema.empty_table(), mode="append", commit_properties=props, writer_properties=WRITER
                )

        return write

    def _write(
        self,
        delta: DeltaTable,
        table: Table,
        data: pa.Table,
        props: CommitProperties,
        mode: str,
        doomed: pa.Table | None,
    ) -> None:
        """The write of `_commit` (data files, then one log entry with the app transaction)."""
        others_present = True
        if mode == "merge" and table.skip_equal_rows and data.num_rows and delta.get_add_actions().num_rows:
            data, others_present = self._without_equal_rows(delta, table, data)
        if mode == "merge" and data.num_rows == 0 and (doomed is None or doomed.num_rows == 0):
            # nothing to upsert or delete: only the app transaction is recorded (an empty commit), without the
            # MERGE's planning and scan (most tables of a small micro-batch)
            write_deltalake(delta, data, mode="append", commit_properties=props, writer_properties=WRITER)
        elif mode == "merge" and not delta.get_add_actions().num_rows:
            # nothing to match or delete in an empty table: the MERGE would insert every row, which an
            # append does at a fraction of the cost (the first load of every table)
            write_deltalake(delta, data, mode="append", commit_properties=props, writer_properties=WRITER)
        elif mode == "merge" and doomed is None and not others_present:
            # the rows left after the equal ones are all of new keys: appended, as below
            write_deltalake(delta, data, mode="append", commit_properties=props, writer_properties=WRITER)
        elif (
            mode == "merge" and table.new_keys_mostly and doomed is None and not self._keys_present(delta, table, data)
        ):
            # no row's key is in the table yet: the MERGE would insert them all, which an append does at a
            # fraction of the cost (facts of new days, holdings of new trades; a MERGE costs 0.1-0.2 s however small)
            write_deltalake(delta, data, mode="append", commit_properties=props, writer_properties=WRITER)
        elif mode == "merge" and merge_in_order(
            delta, table, self.path(table), data, props, self._held(table), doomed, self._hold(table)
        ):
            pass  # merged keeping the files in the declared order (`streamdi.delta_merge`)
        elif mode == "merge":
            read_version = delta.version()
            self._merge(delta, table, data, props, doomed)
            _catch_up(self.path(table), delta)
            if delta.version() == read_version:
                # delta-rs skips the commit of a merge that changes nothing, and the app transaction with
                # it; record the transaction in an empty commit so a replay is still skipped.
                empty = data.slice(0, 0)
                write_deltalake(delta, empty, mode="append", commit_properties=props, writer_properties=WRITER)
        else:
            write_deltalake(delta, data, mode=mode, commit_properties=props, writer_properties=WRITER)
            if mode == "append":
                self._hold_appended(delta, table, data)

    def _hold_appended(self, delta: DeltaTable, table: Table, data: pa.Table) -> None:
        """Give a held resident table (`_hold`) the rows an append just wrote, when its commit wrote them as one file:
        the next read of the version takes them instead of reading the file back. Each micro-batch's staged records
        are read by the steps right after the stage appended them (SF 6: the five CDC tables' new files, ~0.2 s of
        reads a micro-batch on a busy machine). The caller holds the table's commit lock, so the latest version is
        this append's."""
        hold = self._hold(table)
        if hold is None or data.num_rows == 0:
            return
        _catch_up(self.path(table), delta)
        added = appended_files(self.path(table), delta.version(), delta.version())
        if added is None or len(added[0][1]) != 1:
            return
        (file,) = added[0][1]
        schema = table.arrow_schema()
        hold(file.relative_to(self.path(table)).as_posix(), data.select(schema.names).cast(schema).combine_chunks())

    def _held(self, table: Table) -> Callable[[str], pa.Table | None]:
        """The rows of one of `table`'s data files (path relative to the table) when held in memory, else None."""
        path = self.path(table)
        stamp = table_id(path)
        return lambda file: self._file_rows.get((path, stamp, file)) if table.resident and stamp else None

    def _hold(self, table: Table) -> Callable[[str, pa.Table], None] | None:
        """Where a MERGE puts the rows of the files it wrote for `table`, when the table is resident and some of its
        files are held (`_whole`): the next read of the version takes them instead of reading the files back."""
        path = self.path(table)
        stamp = table_id(path)
        if not table.resident or stamp is None or not self._file_rows.weight_where(lambda k: k[:2] == (path, stamp)):
            return None
        return lambda file, rows: self._file_rows.put((path, stamp, file), rows)

    def _keys_present(self, delta: DeltaTable, table: Table, data: pa.Table) -> bool:
        """Whether a key of `data` is in the table (`_rows_with_keys`); a key of strings only is taken as present,
        without a look (a condition on a string column is read whole from files a MERGE wrote, see `_scan`)."""
        if all(table.column(k).type == "string" for k in table.key):
            return True
        return self._rows_with_keys(delta, table, data, list(table.key)).num_rows > 0

    def _rows_with_keys(self, delta: DeltaTable, table: Table, keys: pa.Table, columns: list[str]) -> pa.Table:
        """`columns` (the key among them) of the table's rows whose key is a key of `keys`: read within the range of
        each non-string key column, the values of the first, and the MERGE's bounds (`streamdi.merge_bounds`), so
        files and row groups of other keys are skipped by their statistics; then matched on the whole key. A
        resident table held in memory is filtered there instead (`_where`): DimTrade's recomputed trades reach
        most of its row groups (a scan of ~0.3 s at SF 6, ~0.05 s held)."""
        key = list(table.key)
        ranged = [k for k in key if table.column(k).type != "string"]
        near = pc.scalar(True)
        if ranged:
            near = reduce(operator.and_, [within_range(k, keys[k]) for k in ranged])
            near = near & pc.field(ranged[0]).isin(pc.unique(keys[ranged[0]]))
        bounds = key_bounds(table, keys)
        rows = self._where(delta, table, near if bounds is None else near & bounds, columns)
        if rows.num_rows == 0:
            return rows
        return rows.join(keys.select(key), key, join_type="left semi")

    def _without_equal_rows(self, delta: DeltaTable, table: Table, data: pa.Table) -> tuple[pa.Table, bool]:
        """`data` without the rows equal, column for column (NULL equal to NULL), to the table's row of the same
        key, which a MERGE would leave alone; and whether a key of the rows left is in the table (the table's rows of
        `data`'s keys: `_rows_with_keys`). A MERGE reads every file its source's keys reach: T3 recomputes the trades
        of every changed account, old trades all over DimTrade that come out equal, and without them the MERGE reads
        the files of the newest trades only (SF 6: ~1,200 of ~1,800 rows left out, the MERGE 0.40 -> 0.12-0.15 s,
        the read ~0.1 s)."""
        present = self._rows_with_keys(delta, table, data, table.column_names)
        if present.num_rows == 0:
            return data, False
        marked = data.append_column("_streamdi_row", pa.array(range(data.num_rows), pa.int64()))
        pairs = marked.join(present, list(table.key), join_type="inner", right_suffix="_streamdi_table")
        equal = pa.array([True] * pairs.num_rows, pa.bool_())
        for name in table.column_names:
            if name in table.key:
                continue
            mine, theirs = pairs[name], pairs[f"{name}_streamdi_table"]
            same = pc.or_(pc.fill_null(pc.equal(mine, theirs), False), pc.and_(pc.is_null(mine), pc.is_null(theirs)))
            equal = pc.and_(equal, same)
        dropped = pairs.filter(equal)["_streamdi_row"]
        kept = pc.invert(pc.is_in(marked["_streamdi_row"], value_set=dropped))
        return data.filter(kept), pairs.num_rows > len(dropped)

    def _delete_keys(self, table: Table, deletes: DataFrame | pa.Table | None) -> pa.Table | None:
        if deletes is None:
            return None
        key_schema = pa.schema([table.arrow_schema().field(k) for k in table.key])
        if _spark_frame(deletes):
            deletes = deletes.select(*table.key).toArrow()
        keys = deletes.select(list(table.key)).cast(key_schema)
        if keys.num_rows == 0:
            return None
        return keys.sort_by([(k, "ascending") for k in table.key])

    @staticmethod
    def _merger(delta: DeltaTable, table: Table, source: pa.Table, on: str, props: CommitProperties):
        """A MERGE of `source` (alias `s`) into the table (alias `t`) on `on`, writing with `WRITER`; the join
        also bounds the target by the source's keys (`streamdi.merge_bounds`), so fewer files are read.

        The source is an Arrow table already in memory, so it is not streamed: delta-rs then derives a pruning
        predicate from the source's keys and scans only the files that can match. Streamed (delta-rs's default)
        it scans every file of the table (measured: T3's DimTrade MERGE at SF 12, 1,142 trades, one file of 22
        rewritten either way: 0.41-0.76 s streamed, 0.07-0.12 s not)."""
        bounds = target_bounds(table, source, "t")
        return delta.merge(
            source=source,
            predicate=f"{on} AND ({bounds})" if bounds else on,
            source_alias="s",
            target_alias="t",
            streamed_exec=False,
            commit_properties=props,
            writer_properties=WRITER,
        )

    @staticmethod
    def _merge(
        delta: DeltaTable, table: Table, data: pa.Table, props: CommitProperties, doomed: pa.Table | None = None
    ) -> None:
        on = " AND ".join(f"t.{k} = s.{k}" for k in table.key)
        values = [c for c in table.column_names if c not in table.key]
        if doomed is None:
            merger = Lake._merger(delta, table, data, on, props)
            if values:
                changed = " OR ".join(f"(t.{c} IS DISTINCT FROM s.{c})" for c in values)
                merger = merger.when_matched_update_all(predicate=changed)
            merger.when_not_matched_insert_all().execute()
            return
        # Upserts and deletes in one MERGE: the source carries a flag column; delete rows hold only the key.
        # delta-rs fails on a delete row that matches nothing, so only keys present in the table are kept.
        key = list(table.key)
        # only the files that can hold a doomed key are read (`_delete_keys` gives at least one)
        near = reduce(operator.and_, [within_range(k, doomed[k]) for k in key])
        bounds = key_bounds(table, doomed)
        present = Lake._scan(delta, table, key, near if bounds is None else near & bounds)
        doomed = doomed.join(present, key, join_type="inner").select(key)
        doomed = doomed.sort_by([(k, "ascending") for k in key])
        if doomed.num_rows == 0:
            Lake._merge(delta, table, data, props, None)
            return
        flag = "_streamdi_delete"
        relaxed = pa.schema([f.with_nullable(True) for f in table.arrow_schema()])
        upserts = data.cast(relaxed).append_column(flag, pa.array([False] * data.num_rows, pa.bool_()))
        tombstones = pa.table(
            {f.name: doomed[f.name] if f.name in table.key else pa.nulls(doomed.num_rows, f.type) for f in relaxed},
            schema=relaxed,
        ).append_column(flag, pa.array([True] * doomed.num_rows, pa.bool_()))
        source = pa.concat_tables([upserts, tombstones])
        merger = Lake._merger(delta, table, source, on, props)
        merger = merger.when_matched_delete(predicate=f"s.{flag}")
        if values:
            changed = " OR ".join(f"(t.{c} IS DISTINCT FROM s.{c})" for c in values)
            merger = merger.when_matched_update(
                updates={c: f"s.{c}" for c in values}, predicate=f"NOT s.{flag} AND ({changed})"
            )
        merger.when_not_matched_insert(
            updates={c: f"s.{c}" for c in table.column_names}, predicate=f"NOT s.{flag}"
        ).execute()

    # ----------------------------------------------------------------------------------------- maintenance
    def compact(self, min_small_files: int, *, written_only: bool = False) -> dict[str, int]:
        """Bin-pack the small data files of every table of the lake that has at least `min_small_files` of them
        (files under `COMPACT_TARGET_BYTES`) into files of up to that size; returns the files removed per table
        compacted (qualified name). `min_small_files` 0 compacts nothing. With `written_only`, only the tables this
        Lake committed to since its last such call are looked at (a table gains small files only when written: the
        rest need no look, which costs a Delta table's opening, ~3 ms, each of ~60 tables); the looks run on a few
        threads.

        Each micro-batch adds a file to every table it writes, and Spark pays per file on every read of the
        table, so without this a streaming load slows down as it ages. Compaction is one Delta commit per table
        (operation OPTIMIZE) that changes no rows: it carries no app transaction, the change data feed has no
        rows for it (so migration and validation skip it), and the files it replaces stay on disk, so older
        snapshots and readers still on them keep working. It runs under the table's commit lock; a crash
        leaves either the old or the new file set, both with the same rows, and the next call compacts again.
        A table that cannot be compacted (say, an unreadable log) is logged and skipped.
        """
        done: dict[str, int] = {}
        if min_small_files <= 0:
            return done
        if written_only:
            with self._written_lock:
                paths, self._written = sorted(self._written), set()
        else:
            paths = [log_dir.parent for log_dir in sorted(self.root.glob("*/*/_delta_log"))]

        def compacted(path: Path) -> int | None:
            name = f"{path.parent.name}.{path.name}"  # the table's qualified name: its lock
            try:
                return self._compact(path, name, min_small_files)
            except Exception:  # noqa: BLE001 - one table that cannot be compacted must not stop the others
                log.exception("could not compact %s at %s; the next call tries again", name, path)
                if written_only:
                    with self._written_lock:
                        self._written.add(path)
                return None

        for path, removed in zip(paths, kept_pool("compact", COMPACT_THREADS).map(compacted, paths), strict=True):
            if removed:
                done[f"{path.parent.name}.{path.name}"] = removed
        return done

    def _compact(self, path: Path, name: str, min_small_files: int) -> int:
        with self._delta_at(path) as delta:
            if _small_files(delta) < min_small_files:  # the common case, without the lock
                return 0
        with self.lock(name), self._delta_at(path) as delta:
            if _small_files(delta) < min_small_files:
                return 0
            target = _target_file_bytes(delta) or COMPACT_TARGET_BYTES
            metrics = delta.optimize.compact(target_size=target, writer_properties=WRITER)
            fault_point("lake.after_compact")
            delta.update_incremental()
        log.info("compacted %s: %s small files into %s", name, metrics["numFilesRemoved"], metrics["numFilesAdded"])
        return int(metrics["numFilesRemoved"])

    def maintain(self, checkpoint_every: int, retention_hours: int) -> dict[str, int]:
        """Keep a long-running lake small and quick to open: for every table whose version is `checkpoint_every`
        or more commits past its last checkpoint, write a checkpoint (a reader then opens the table from it instead
        of replaying every commit file), delete the log's files before the previous checkpoint
        (`delta_log.remove_before`: the log keeps the commits since then, ~`checkpoint_every` to twice that, so its
        directory, which every catch-up of the table lists, does not grow with the table's age), and vacuum: delete
        the data files the table stopped using (replaced by compaction or a MERGE) more than `retention_hours` ago,
        and the change-data files of the commits the log no longer holds (`delta_log.remove_change_files`: no change
        feed can read them; delta-rs's vacuum leaves them). Returns the files deleted per table maintained (qualified
        name).

        The caller runs this only when nothing is pending in the batch log: every commit has then been read by what
        reads it afterwards (the transform's change feeds of its own micro-batch, the migration's feed up to the
        last migrated version), so no reader needs a removed file: the commits between a table's last migrated
        version and the log's first are then ones without data (compaction, vacuum), which the migrator passes over.
        Older snapshots (time travel) are given up: the log holds the commits since the previous checkpoint. The
        checkpoints keep the tombstones of replaced files for `retention_hours` too (`_keep_tombstones_for`), not
        Delta's 7 days. Like
        compaction it changes no rows, carries no app transaction, and runs under the table's commit lock; a table
        that cannot be maintained is logged and skipped. `checkpoint_every` 0 does nothing."""
        done: dict[str, int] = {}
        if checkpoint_every <= 0:
            return done
        for log_dir in sorted(self.root.glob("*/*/_delta_log")):
            path = log_dir.parent
            name = f"{path.parent.name}.{path.name}"
            try:
                if log_version(log_dir) - last_checkpoint(log_dir) < checkpoint_every:
                    continue
                with self.lock(name), self._delta_at(path) as delta:
                    previous = last_checkpoint(log_dir)
                    _keep_tombstones_for(delta, retention_hours)
                    delta.create_checkpoint()
                    remove_before(log_dir, previous)
                    removed = delta.vacuum(retention_hours, dry_run=False, enforce_retention_duration=False)
                    changes = remove_change_files(path, retention_hours * 3600)
                    fault_point("lake.after_maintain")
                    version = delta.version()
            except Exception:  # noqa: BLE001 - one table that cannot be maintained must not stop the others
                log.exception("could not maintain %s at %s; the next call tries again", name, path)
                continue
            log.info(
                "maintained %s: checkpoint at v%s, %d unused data files and %d change files deleted",
                *(name, version, len(removed), changes),
            )
            done[name] = len(removed) + changes
        return done

    def to_arrow(self, table: Table, df: DataFrame | pa.Table) -> pa.Table:
        """Rows of `df` as an Arrow table with exactly the declared schema, in the declared order."""
        if _spark_frame(df):
            missing = [c for c in table.column_names if c not in df.columns]
            if missing:
                raise ValueError(f"{table.qualified_name}: DataFrame lacks declared columns {missing}")
            data = _declared_frame(table, df).toArrow()
        else:
            data = df.select(table.column_names)
        data = data.cast(table.arrow_schema())
        return _sorted(data, table)

    def _spark(self) -> SparkSession:
        if self.spark is None and self._spark_factory is not None:
            self.spark = self._spark_factory()
        if self.spark is None:
            raise RuntimeError("this Lake was opened without a SparkSession; pass one to read DataFrames")
        return self.spark


@dataclass
class PieceFiles:
    """The pieces of one commit, each written as a file of its own as it comes (`Lake.write_piece`, numbered in
    order), then committed at once (`commit`)."""

    lake: Lake
    table: Table
    app_id: str
    version: int
    written: int = 0

    def add(self, rows: pa.Table) -> None:
        self.lake.write_piece(self.table, rows, app_id=self.app_id, version=self.version, position=self.written)
        self.written += 1

    def commit(self) -> CommitResult:
        if not self.written:  # nothing of an earlier attempt's may be committed
            self.lake.discard_written(self.table, app_id=self.app_id, version=self.version)
        return self.lake.append_written(self.table, app_id=self.app_id, version=self.version)


def _file_stem(app_id: str, version: int) -> str:
    """The name stem of the files Spark's executors write for commit `(app_id, version)` of a table."""
    return f"{re.sub(r'[^A-Za-z0-9]+', '-', app_id).strip('-')}-v{version}"


def _remove_scratch(scratch: Path) -> None:
    """Remove a commit's scratch directory, and the table's directory of them once it holds no other."""
    shutil.rmtree(scratch, ignore_errors=True)
    with contextlib.suppress(OSError):  # another commit's scratch is still there (or it is gone already)
        scratch.parent.rmdir()


def _data_files(delta: DeltaTable) -> dict[str, int]:
    """The snapshot's data files (paths relative to the table, decoded) and their sizes in bytes, in its order."""
    actions = pa.table(delta.get_add_actions(flatten=True))
    if not actions.num_rows:
        return {}
    return dict(zip((unquote(f) for f in actions["path"].to_pylist()), actions["size_bytes"].to_pylist(), strict=True))


def _inserts(appended: list[tuple[int, list[Path]]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The change feed (in `schema`: the table columns wanted, then `CHANGE_COLUMNS`) of commits that only added
    files: every row of each file, an insert of its commit."""
    names = schema.names[: -len(CHANGE_COLUMNS)]
    declared = pa.schema([schema.field(n) for n in names])
    for version, files in appended:
        for batch in file_batches(files, declared):
            n = batch.num_rows
            yield pa.RecordBatch.from_arrays(
                [
                    *batch.columns,
                    pa.nulls(n, pa.string()).fill_null("insert"),
                    pa.array(np.full(n, version, dtype=np.int64)),
                ],
                schema=schema,
            )


def _changed_rows(
    changed: list[tuple[int, list[tuple[Path, str | None]]]], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The change feed (in `schema`, as `_inserts`) of the files `delta_appends.changed_files` found: a change data
    file's rows with their own change type, an added or removed file's rows as inserts or deletes of its commit; in
    the order of the commits, of the files in each, and of the rows in each file."""
    names = schema.names[: -len(CHANGE_COLUMNS)]
    declared = pa.schema([schema.field(n) for n in names])
    with_type = pa.schema([*declared, schema.field("_change_type")])
    for version, files in changed:
        for file, change in files:
            for batch in file_batches([file], declared if change else with_type):
                n = batch.num_rows
                kind = batch.column(len(names)) if change is None else pa.nulls(n, pa.string()).fill_null(change)
                columns = batch.columns[: len(names)]
                yield pa.RecordBatch.from_arrays(
                    [*columns, kind, pa.array(np.full(n, version, dtype=np.int64))], schema=schema
                )


def within_range(column: str, values: pa.Array | pa.ChunkedArray) -> pc.Expression:
    """A filter for rows whose `column` lies between the least and the greatest of `values` (not empty): a scan
    skips the files and row groups outside that range by their statistics, which an `isin` alone does not."""
    low, high = pc.min_max(values).values()
    return (pc.field(column) >= low.as_py()) & (pc.field(column) <= high.as_py())


def table_properties(table: Table) -> dict[str, str]:
    """The Delta table properties `ensure_table` creates `table` with."""
    if table.file_bytes is None:
        return dict(TABLE_PROPERTIES)
    return {**TABLE_PROPERTIES, TARGET_FILE_SIZE: str(table.file_bytes)}


def _target_file_bytes(delta: DeltaTable) -> int | None:
    """The table's own data file size (`Table.file_bytes`, stored as a table property), if it has one."""
    value = delta.metadata().configuration.get(TARGET_FILE_SIZE)
    return int(value) if value else None


@contextmanager
def _disk_full_is_clear(root: Path, table: Table) -> Iterator[None]:
    """A commit that fails because the lake's file system is full raises LakeDiskFull, which says so and what to do
    (delta-rs reports it as an error of its own whose text carries the OS error)."""
    try:
        yield
    except Exception as exc:
        cause = next((str(e) for e in causes(exc) if _no_space(e)), None)
        if cause is None:
            raise
        raise LakeDiskFull(
            errno.ENOSPC,
            f"the lake's disk is full ({root}): the commit to {table.qualified_name} failed "
            f"({' '.join(cause.split())[:300]}). Nothing of that commit is in the table; free space and run again: "
            "the run resumes exactly once from the commits made so far",
        ) from exc


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text


TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"  # how long a checkpoint keeps a replaced file's `remove`


def _keep_tombstones_for(delta: DeltaTable, retention_hours: int) -> None:
    """Make the table's checkpoints keep the tombstones (`remove` actions) of replaced files for `retention_hours`,
    as long as the vacuum keeps the files, instead of Delta's default 7 days: every micro-batch replaces a few files
    of a busy table, so a week of a stream would put ~100,000 tombstones in each of its checkpoints, which every open
    of the table reads (delta-rs drops the expired ones when it writes a checkpoint). One metadata commit
    (SET TBLPROPERTIES, no data: the migration and the change feeds pass over it) when the property differs."""
    wanted = f"interval {retention_hours} hours"
    if delta.metadata().configuration.get(TOMBSTONE_RETENTION) != wanted:
        delta.alter.set_table_properties({TOMBSTONE_RETENTION: wanted})


def _catch_up(path: Path, delta: DeltaTable) -> None:
    """Bring a kept handle of the table at `path` up to date, when a commit was made since its version: the next
    commit file exists (commits are numbered without gaps). delta-rs's catch-up lists the log and rebuilds the
    snapshot's file list even when nothing changed (~7 ms a call, contended, in an SF 3 incremental load: 400 calls
    2.8 s); looking for the next commit file costs one `stat`. Without it, a checkpoint past the handle's version
    means the commits in between were cleaned up (`maintain`): the handle cannot catch up, and a new one is opened."""
    log_dir = path / "_delta_log"
    version = delta.version()
    if (log_dir / f"{version + 1:020d}.json").exists():
        delta.update_incremental()
    elif last_checkpoint(log_dir) > version:
        raise LookupError(f"the commits after version {version} of {path} were cleaned up: open the table afresh")


def _small_files(delta: DeltaTable) -> int:
    """Data files of the latest snapshot that compaction would merge: below the compaction target size, or, in a
    table with its own file size, below half of it (its files are written at that size; two of them never fit in
    one, and counting them would make every micro-batch try)."""
    actions = delta.get_add_actions(flatten=True)
    if actions.num_rows == 0:
        return 0
    own = _target_file_bytes(delta)
    limit = own // 2 if own else COMPACT_TARGET_BYTES
    # delta-rs returns arro3 arrays, which pyarrow.compute does not take; a table has few files, so count in Python
    return sum(1 for size in actions.column("size_bytes").to_pylist() if size < limit)


def _sorted(data: pa.Table, table: Table) -> pa.Table:
    return sorted_rows(data, table.order_by or table.key)


def sorted_rows(rows: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """`rows` sorted by `columns` (ascending, stable, nulls last); as they are (no copy) when they already stand in
    that order, as most writes do (a source's lines in file order, a step's rows built in key order) and every
    first-load feed: a sorted copy of a large table is the size of the table (SF 30's staged files in the driver)."""
    if rows.num_rows < 2 or not columns or _in_order(rows, columns):
        return rows
    order = np.asarray(row_order.sort_indices(rows, columns, nulls_first=False), dtype=np.int64)
    if np.array_equal(order, np.arange(rows.num_rows, dtype=np.int64)):
        return rows
    return rows.take(order)


def _in_order(rows: pa.Table, columns: tuple[str, ...]) -> bool:
    """Whether `rows` already stand in the order of `columns` (ascending; equal keys in any order, as a stable sort
    keeps them): each row's key compared with the next one's, column by column where they tie, in one pass instead
    of a sort (SF 10 Batch1's staging appends: 14 M rows sorted only to find them in order, ~1.7 s of CPU). False when
    unsure (a key column with NULLs or floats): the caller sorts."""
    n = rows.num_rows
    ties: pa.Array | None = None  # where a row's key equals the next one's on the columns so far
    for name in columns:
        col = rows[name]
        if col.null_count or pa.types.is_floating(col.type):
            return False
        this, following = col.slice(0, n - 1), col.slice(1)  # (chunks kept: combining them copies even one)
        descends = pc.less(following, this)
        if pc.any(descends if ties is None else pc.and_(ties, descends)).as_py():
            return False
        equal = pc.equal(following, this)
        ties = equal if ties is None else pc.and_(ties, equal)
        if not pc.any(ties).as_py():
            return True
    return True


def _one_chunk(data: pa.Table) -> pa.Table:
    """`data` with each column in one chunk (copied only when it is in several). delta-rs writes the record batches of
    a table given in several across its threads and interleaves them in its files in no fixed order (deltalake 1.6:
    batches 1, 3, 5 ... then 2, 4, 6 ..., or the other way round, run to run); one batch keeps the declared order, so
    the same rows give the same files."""
    return data if all(column.num_chunks <= 1 for column in data.columns) else data.combine_chunks()


def _spark_frame(rows: DataFrame | pa.Table | None) -> bool:
    """Whether `rows` is a Spark DataFrame (the other kinds a commit takes are Arrow tables and None)."""
    return rows is not None and not isinstance(rows, pa.Table)


def _declared_frame(table: Table, df: DataFrame) -> DataFrame:
    """`df`'s declared columns, in the declared order and types."""
    from pyspark.sql import functions as F

    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in table.spark_schema().fields])
