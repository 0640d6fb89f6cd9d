"""Which data files a range of Delta commits added, when those commits only added rows.

A Delta commit is one JSON file per version in `_delta_log/`, one action per line. When every commit of a range
only adds files (a first load, an append of new rows) its change data feed is exactly the rows of those files,
each an `insert` of its commit: `streamdi.lake.Lake.changes` then reads the files with pyarrow instead of asking
delta-rs for the feed. delta-rs builds the feed in memory of its own, outside pyarrow's pool (SF 30's
FactMarketHistory, 12.6 M rows, 2.3 GiB of Arrow data: the process's RSS 3.6 GiB after reading it through delta-rs,
3.0 GiB from the files). Anything else in the range -- a removed file (MERGE, delete, compaction), change data
files, a deletion vector, a file given by a URI (outside the table's folder), a commit whose JSON file is gone
(cleaned up after a checkpoint) -- returns None, and the caller asks delta-rs.

`changed_files` finds the files of any range's feed the same way (change data files, or added and removed files),
so that `Lake.changes` reads a MERGE's feed with pyarrow too.

`AppendedRows` is such a range's rows read from the files only when asked: a first load's migration streams a big
table into PostgreSQL's COPY from it instead of holding the table (`streamdi.migrator`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

# Actions that say nothing about rows: the commit's metadata, app transactions, schema and protocol changes.
NO_ROWS = frozenset({"commitInfo", "txn", "metaData", "protocol", "domainMetadata"})


def appended_files(table_path: Path, start: int, end: int) -> list[tuple[int, list[Path]]] | None:
    """Per version in [start, end], the data files it added (in the order its log lists them), when every one of
    these commits only added files with rows; None otherwise (see the module docstring)."""
    added = _added(table_path, start, end)
    return None if added is None else [(version, [f for f, _ in files]) for version, files in added]


def _added(table_path: Path, start: int, end: int) -> list[tuple[int, list[tuple[Path, int | None]]]] | None:
    """`appended_files` with each file's row count from its add action's statistics (None when it has none)."""
    out = []
    for version in range(start, end + 1):
        log_file = table_path / "_delta_log" / f"{version:020d}.json"
        try:
            text = log_file.read_text()
        except FileNotFoundError:
            return None
        files = []
        for line in text.splitlines():
            if not line.strip():
                continue
            ((kind, action),) = json.loads(line).items()
            if kind == "add":
                if not action.get("dataChange", True) or action.get("deletionVector") or "://" in action["path"]:
                    return None  # a rewrite (compaction), rows masked out, or a file outside the table
                stats = json.loads(action["stats"]) if action.get("stats") else {}
                files.append((table_path / unquote(action["path"]), stats.get("numRecords")))
            elif kind not in NO_ROWS:
                return None
        out.append((version, files))
    return out


def changed_files(table_path: Path, start: int, end: int) -> list[tuple[int, list[tuple[Path, str | None]]]] | None:
    """Per version in [start, end], the files that hold its change data feed, read from the commit files as Delta's
    protocol defines the feed: a commit with change data files (`cdc` actions: a MERGE's updates, deletes and
    inserts, each row with its `_change_type`) has exactly their rows; any other commit has its added files' rows as
    inserts and its removed files' rows as deletes (an append, an overwrite); files added or removed without a
    change of data (compaction) are not in the feed. A file is paired with its change type, None for a change data
    file. delta-rs's `load_cdf` plans each read with DataFusion, ~40 ms even for a feed of a few rows, with
    Python's lock held much of it. None for what this does not read (a deletion vector, a partition value, a file
    outside the table's folder, a commit or removed file that is gone): the caller asks delta-rs."""
    out = []
    for version in range(start, end + 1):
        try:
            text = (table_path / "_delta_log" / f"{version:020d}.json").read_text()
        except FileNotFoundError:
            return None
        data: list[tuple[Path, str | None]] = []
        changes: list[tuple[Path, str | None]] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            ((kind, action),) = json.loads(line).items()
            if kind in NO_ROWS:
                continue
            if kind not in ("add", "remove", "cdc") or action.get("deletionVector") or action.get("partitionValues"):
                return None
            if "://" in action["path"]:
                return None
            file = table_path / unquote(action["path"])
            if kind == "cdc":
                changes.append((file, None))
            elif action.get("dataChange", True):
                if kind == "remove" and not file.exists():
                    return None  # vacuumed: its rows are gone
                data.append((file, "insert" if kind == "add" else "delete"))
        out.append((version, changes or data))
    return out


def file_batches(files: Iterable[Path], schema: pa.Schema, batch_size: int | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of `files`, in order, a record batch (of at most `batch_size` rows) at a time, in `schema`'s
    columns and types."""
    for file in files:
        with pq.ParquetFile(file) as reader:
            for batch in reader.iter_batches(batch_size=batch_size or 65_536, columns=schema.names):
                yield batch.select(schema.names).cast(schema)


@dataclass(frozen=True, eq=False)
class AppendedRows:
    """The rows a range of commits only appended, read from their files when asked rather than held (SF 30's
    FactMarketHistory is 2.3 GiB of Arrow data as one table). It answers what the migration asks of a table of
    upserts -- `column_names`, `num_rows`, `select` of a few columns (its check of distinct keys), `to_batches`
    -- in `schema`, the table's declared columns and types. Build it with `AppendedRows.of`."""

    schema: pa.Schema
    files: tuple[Path, ...]
    rows_per_version: Mapping[int, int]

    @classmethod
    def of(cls, table_path: Path, start: int, end: int, schema: pa.Schema) -> AppendedRows | None:
        """The rows that versions [start, end] of the table at `table_path` appended; None when one of these
        commits did more than append (then only the change data feed says what changed)."""
        added = _added(table_path, start, end)
        if added is None:
            return None
        per_version = {}
        for version, files in added:
            counted = [n if n is not None else pq.read_metadata(f).num_rows for f, n in files]
            if counted:
                per_version[version] = sum(counted)
        return cls(schema, tuple(f for _, files in added for f, _ in files), per_version)

    @property
    def column_names(self) -> list[str]:
        return self.schema.names

    @property
    def num_rows(self) -> int:
        return sum(self.rows_per_version.values())

    def select(self, columns: list[str]) -> pa.Table:
        """`columns` of every row, held (the key columns of a table are a small part of it)."""
        wanted = pa.schema([self.schema.field(c) for c in columns])
        return pa.Table.from_batches(list(file_batches(self.files, wanted)), wanted)

    def to_batches(self, max_chunksize: int | None = None) -> Iterator[pa.RecordBatch]:
        return file_batches(self.files, self.schema, max_chunksize)
