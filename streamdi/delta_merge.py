"""A MERGE that keeps a table's data files in its declared order, for the tables with their own file size
(`Table.file_bytes`); used by `streamdi.lake.Lake` in place of delta-rs's MERGE where it applies (`merge_in_order`).

Why. delta-rs's MERGE writes the rows of the files it rewrites in no particular order (its threads' hash join), so
the files it leaves overlap in key range, and every later MERGE whose keys reach that range reads and rewrites all
of them again. At SF 6, each micro-batch a TPC-DI batch: FactWatches' MERGE rewrote ~10 overlapping files (430,000
rows copied for ~700 source rows), the market slices' 7 (575,000 rows), DimTrade's 3 (181,000 rows for 606 trades).

What it does. The files that may hold a key of the source are found by their statistics (the range of each integer,
date or timestamp key column) and read (from the rows `Lake` holds when it holds them); the source's rows are matched
to theirs on the whole key. A matched row whose values all equal the source's is left alone, as delta-rs's MERGE of
`Lake._merge` leaves it (`IS DISTINCT FROM`); the others are updated and the source's other rows inserted. The files
holding an updated row are rewritten together with the inserted rows, all sorted by the declared order and written
as consecutive files of about the table's file size; the sorted rows are cut wherever a file left alone starts
between two of them (by the first `order_by` column), and the last file joins when the inserts pass the end of the
table while it is smaller than the file size, so the table's files stay apart and appends grow its last file.

What it commits is what that MERGE would: the same rows, the change data feed (update pre- and post-images and
inserts, in a `_change_data/` file), the app transaction and the commit metadata, in one commit written as the Delta
protocol defines it (remove and add actions with statistics, a `cdc` action, `txn`, `commitInfo`) and created only if
no commit of that version exists yet. It runs under the table's lock (`Lake._checked_commit`); files written by an
attempt that died before its commit are in no commit (vacuum removes them), and a replay is skipped by the app
transaction as any other commit. An upsert's deletes (keys whose rows go) are part of the same commit: their files
are rewritten without them and the feed has their rows as deletes. It applies to tables of reader version 1 and
writer version up to 4 (change data feed; no deletion vectors, no column mapping, no partitions), to upserts that do
not also delete one of their keys, and while the files to read are under `MAX_READ_BYTES`; elsewhere
`merge_in_order` returns False and delta-rs merges.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.model import Table
from streamdi import row_order
from streamdi.delta_log import CHANGE_DIR
from streamdi.faults import fault_point
from streamdi.parquet_stats import delta_stats, write_parquet

if TYPE_CHECKING:  # the handle and commit properties come from `streamdi.lake`, the one deltalake importer
    from deltalake import CommitProperties, DeltaTable

MAX_READ_BYTES = 64 * 1024 * 1024  # Parquet bytes of the files a MERGE may read here (~4x in memory; more: delta-rs)
INSERTS_PER_LOOK = 4_096  # inserted rows compared with every file's ranges at once
CHANGE_TYPE = "_change_type"

Held = Callable[[str], pa.Table | None]  # a data file's rows when held in memory, else None
Hold = Callable[[str, pa.Table], None]  # be given the rows of a data file just committed


def rows_per_file(data: pa.Table, file_bytes: int | None, sample_rows: int = 16_384) -> int:
    """Rows of `data` per Parquet file of about `file_bytes` (all of them when None, or when their Arrow size is
    within it: Parquet's is smaller), from the size of its first `sample_rows` rows written alone."""
    if file_bytes is None or data.nbytes <= file_bytes:
        return max(data.num_rows, 1)
    sample = data.slice(0, sample_rows)
    sink = pa.BufferOutputStream()
    write_parquet(sample, sink)
    return max(int(file_bytes * sample.num_rows / sink.getvalue().size), 1)


def merge_in_order(
    delta: DeltaTable,
    table: Table,
    path: Path,
    source: pa.Table,
    props: CommitProperties,
    held: Held,
    doomed: pa.Table | None = None,
    hold: Hold | None = None,
) -> bool:
    """MERGE `source` (the table's declared columns, one row per key) into `delta`, the latest snapshot of `table` at
    `path`, and delete the rows of the keys `doomed` names (keys the table lacks are let be), as the module's text
    says; False when it does not apply (nothing written). Once committed, `hold` is given each written file's rows
    (a resident table's reader then need not read them back)."""
    if not _applies(delta, table):
        return False
    schema = table.arrow_schema()
    key = list(table.key)
    source = source.select(schema.names).cast(schema)
    doomed = (doomed if doomed is not None else source.slice(0, 0)).select(key).cast(source.select(key).schema)
    if doomed.num_rows and source.join(doomed, keys=key, join_type="left semi").num_rows:
        return False  # a key both upserted and deleted: delta-rs's MERGE says what that means
    actions = pa.table(delta.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return False
    files = [unquote(p) for p in actions["path"].to_pylist()]
    sizes = np.asarray(actions["size_bytes"].to_pylist(), dtype=np.int64)
    reach = _reached(actions, table, pa.concat_tables([source.select(key), doomed]))
    if sizes[reach].sum() > MAX_READ_BYTES:
        return False
    read = np.flatnonzero(reach)
    parts = [_rows(path, files[i], schema, held) for i in read]
    target = pa.concat_tables(parts) if parts else schema.empty_table()
    file_of = np.repeat(read, [p.num_rows for p in parts]).astype(np.int64)
    t_rows, s_rows = _matches(target, source, key)
    if len(np.unique(t_rows)) < len(t_rows):
        return False  # a key twice in the source: delta-rs's MERGE refuses it
    differs = _differ(target.take(t_rows), source.take(s_rows), [c for c in schema.names if c not in table.key])
    changed_t, changed_s = t_rows[differs], s_rows[differs]
    inserted = np.setdiff1d(np.arange(source.num_rows), s_rows)
    deleted_t = np.unique(_matches(target, doomed, key)[0])  # a key named twice is deleted once
    if len(changed_t) == 0 and len(inserted) == 0 and len(deleted_t) == 0:
        _commit(path, delta, props, [], [], None, _metrics(source, 0, 0, 0, 0, 0, 0))
        return True

    rewritten = set(np.unique(file_of[np.concatenate([changed_t, deleted_t])]).tolist())
    first = table.order_by[0]
    lows, _ = _bounds(actions, first)
    inserts = source.take(pa.array(inserted, pa.int64()))
    if len(inserted):
        rewritten |= _joined_by_inserts(actions, table, inserts, sizes, table.file_bytes or 0)
    extra = sorted(rewritten - set(read.tolist()))
    if sizes[sorted(rewritten)].sum() > MAX_READ_BYTES:
        return False
    if extra:  # files the inserts join that hold no key of the source
        extra_rows = [_rows(path, files[i], schema, held) for i in extra]
        target = pa.concat_tables([target, *extra_rows])
        file_of = np.concatenate([file_of, np.repeat(extra, [t.num_rows for t in extra_rows]).astype(np.int64)])

    in_rewritten = np.isin(file_of, sorted(rewritten))
    keep = in_rewritten.copy()
    keep[changed_t] = False
    keep[deleted_t] = False
    kept = _in_file_order(np.flatnonzero(keep), file_of, lows)
    new_rows = pa.concat_tables([source.take(pa.array(changed_s, pa.int64())), inserts])
    merged = pa.concat_tables([target.take(pa.array(kept, pa.int64())), new_rows])
    merged = merged.take(row_order.sort_indices(merged, list(table.order_by), nulls_first=False, sorted_rows=len(kept)))
    untouched_lows = None if lows is None else np.sort(np.delete(lows, sorted(rewritten)))
    name = f"{_stem(props)}-{uuid.uuid4().hex[:12]}"
    written = _write_runs(path, merged, table, first, untouched_lows, name)
    added = [entry for entry, _ in written]
    change = _change_file(path, target, changed_t, source, changed_s, inserts, deleted_t, name)
    fault_point("lake.merge_files_written")  # a crash here leaves files no commit names
    removed = [(files[i], int(sizes[i])) for i in sorted(rewritten)]
    copied = int(in_rewritten.sum()) - len(changed_t) - len(deleted_t)
    metrics = _metrics(source, len(inserted), len(changed_t), len(deleted_t), copied, len(added), len(removed))
    _commit(path, delta, props, removed, added, change, metrics)
    if hold is not None:
        for (file, *_), rows in written:
            hold(file, rows)
    return True


def _in_file_order(rows: np.ndarray, file_of: np.ndarray, lows: np.ndarray | None) -> np.ndarray:
    """The target `rows` (ascending positions) with their files taken by the low of the first order column, each
    file's rows in its own order: files this MERGE (or a first load's pieces) wrote hold sorted rows and do not
    overlap, so the rows kept come out in order and only the new rows need a place among them
    (`row_order.sort_indices`'s `sorted_rows`)."""
    if lows is None or len(rows) == 0:
        return rows
    return rows[np.argsort(lows[file_of[rows]], kind="stable")]


def _applies(delta: DeltaTable, table: Table) -> bool:
    if table.file_bytes is None or not table.order_by or not table.key:
        return False
    protocol = delta.protocol()
    if protocol.min_reader_version > 1 or protocol.min_writer_version > 4:
        return False
    metadata = delta.metadata()
    config = metadata.configuration
    return not metadata.partition_columns and config.get("delta.enableChangeDataFeed") == "true"


def _as_int64(values: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """Integer, date or timestamp values as int64 (NULL as 0; see the caller's mask), None for other types."""
    kind = values.type
    if pa.types.is_integer(kind):
        ints = values
    elif pa.types.is_date32(kind):
        ints = values.cast(pa.int32())
    elif pa.types.is_timestamp(kind):
        ints = values.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64())
    else:
        return None
    return pc.fill_null(ints.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)


def _bounds(actions: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Per file, the smallest and largest value of `column` (int64; a file without them: the widest range)."""
    low_name, high_name = f"min.{column}", f"max.{column}"
    if low_name not in actions.column_names or high_name not in actions.column_names:
        return None, None
    lows, highs = _as_int64(actions[low_name]), _as_int64(actions[high_name])
    if lows is None or highs is None:
        return None, None
    unknown = (pc.is_null(actions[low_name]).to_numpy(zero_copy_only=False)) | (
        pc.is_null(actions[high_name]).to_numpy(zero_copy_only=False)
    )
    info = np.iinfo(np.int64)
    return np.where(unknown, info.min, lows), np.where(unknown, info.max, highs)


def _reached(actions: pa.Table, table: Table, source: pa.Table) -> np.ndarray:
    """Per file, whether it may hold a key of `source`: for every integer, date or timestamp key column, a source
    value within the file's range (a file without a range may hold anything)."""
    reach = np.ones(actions.num_rows, dtype=bool)
    for column in table.key:
        values = _as_int64(source[column])
        lows, highs = _bounds(actions, column)
        if values is None or lows is None:
            continue
        present = np.unique(values[~pc.is_null(source[column]).to_numpy(zero_copy_only=False)])
        reach &= np.searchsorted(present, highs, "right") > np.searchsorted(present, lows, "left")
    return reach


def _rows(path: Path, file: str, schema: pa.Schema, held: Held) -> pa.Table:
    rows = held(file)
    if rows is None:
        rows = pq.read_table(path / file, columns=schema.names).select(schema.names).cast(schema)
    return rows.combine_chunks()


def _matches(target: pa.Table, source: pa.Table, key: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(target row, source row) of every key the two share, ordered by target row."""
    left = target.select(key).append_column("_t", pa.array(np.arange(target.num_rows), pa.int64()))
    right = source.select(key).append_column("_s", pa.array(np.arange(source.num_rows), pa.int64()))
    pairs = left.join(right, keys=key, join_type="inner", use_threads=False)
    t_rows = pairs["_t"].to_numpy()
    s_rows = pairs["_s"].to_numpy()
    order = np.argsort(t_rows, kind="stable")
    return t_rows[order], s_rows[order]


def _differ(old: pa.Table, new: pa.Table, columns: list[str]) -> np.ndarray:
    """Per row, whether any of `columns` differs (NULL equals NULL only)."""
    differs = np.zeros(old.num_rows, dtype=bool)
    for name in columns:
        a, b = old[name], new[name]
        same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        differs |= ~same.to_numpy(zero_copy_only=False)
    return differs


def _joined_by_inserts(
    actions: pa.Table, table: Table, inserts: pa.Table, sizes: np.ndarray, file_bytes: int
) -> set[int]:
    """Files an insert must be written with: those whose ranges of the integer, date or timestamp `order_by`
    columns all hold an inserted row's values (the row falls inside the file in every one of them), and the table's
    last file in the first order column, while smaller than the file size, when inserts pass the end of the table."""
    ranged = []
    for column in table.order_by:
        values = _as_int64(inserts[column])
        lows, highs = _bounds(actions, column)
        if values is not None and lows is not None:
            ranged.append((column, values, lows, highs))
    out: set[int] = set()
    if not ranged:
        return out
    held = np.zeros(actions.num_rows, dtype=bool)
    for start in range(0, inserts.num_rows, INSERTS_PER_LOOK):
        inside = np.ones((min(INSERTS_PER_LOOK, inserts.num_rows - start), actions.num_rows), dtype=bool)
        for _, values, lows, highs in ranged:
            v = values[start : start + INSERTS_PER_LOOK, None]
            inside &= (v >= lows[None, :]) & (v <= highs[None, :])
        held |= inside.any(axis=0)
    out.update(np.flatnonzero(held).tolist())
    column, values, _, highs = ranged[0]
    if column == table.order_by[0]:
        last = int(np.argmax(highs))
        if values.max() > highs[last] and sizes[last] < file_bytes:
            out.add(last)
    return out


def _write_runs(
    path: Path, rows: pa.Table, table: Table, first: str, untouched_lows: np.ndarray | None, name: str
) -> list[tuple[tuple[str, int, int, str], pa.Table]]:
    """Write the sorted `rows` as data files: cut where a file left alone starts between two rows, then into files
    of about the table's size. Returns ((file, bytes, modification time in ms, statistics JSON), rows) of each."""
    cuts = [0, rows.num_rows]
    values = _as_int64(rows[first]) if untouched_lows is not None else None
    if values is not None and len(untouched_lows) and rows.num_rows > 1:
        between = np.searchsorted(untouched_lows, values[1:], "right") > np.searchsorted(
            untouched_lows, values[:-1], "right"
        )
        cuts = [0, *(np.flatnonzero(between) + 1).tolist(), rows.num_rows]
    step = rows_per_file(rows, table.file_bytes)
    schema = table.arrow_schema()
    out = []
    for start, end in zip(cuts, cuts[1:], strict=False):
        for piece in range(start, end, step):
            file = f"part-{len(out):05d}-{name}.snappy.parquet"
            chunk = rows.slice(piece, min(step, end - piece)).combine_chunks()
            write_parquet(chunk, path / file)
            out.append((_added(path, file, schema), chunk))
    return out


def _added(path: Path, file: str, schema: pa.Schema) -> tuple[str, int, int, str]:
    info = (path / file).stat()
    _, stats = delta_stats(path / file, schema)
    return file, info.st_size, info.st_mtime_ns // 1_000_000, stats


def _change_file(
    path: Path,
    target: pa.Table,
    changed_t: np.ndarray,
    source: pa.Table,
    changed_s: np.ndarray,
    inserts: pa.Table,
    deleted_t: np.ndarray,
    name: str,
) -> tuple[str, int]:
    """Write the change data feed of the MERGE (pre- and post-images of the updated rows, the inserted rows, the
    deleted ones)."""
    parts = [
        (target.take(pa.array(changed_t, pa.int64())), "update_preimage"),
        (source.take(pa.array(changed_s, pa.int64())), "update_postimage"),
        (inserts, "insert"),
        (target.take(pa.array(deleted_t, pa.int64())), "delete"),
    ]
    typed = [
        rows.append_column(CHANGE_TYPE, pa.array([kind] * rows.num_rows, pa.large_string())) for rows, kind in parts
    ]
    feed = pa.concat_tables(typed)
    (path / CHANGE_DIR).mkdir(exist_ok=True)
    file = f"{CHANGE_DIR}/cdc-{name}.snappy.parquet"
    write_parquet(feed, path / file)
    return file, (path / file).stat().st_size


def _stem(props: CommitProperties) -> str:
    txn = props.app_transactions[0] if props.app_transactions else None
    text = f"{txn.app_id}-v{txn.version}" if txn is not None else "merge"
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _metrics(
    source: pa.Table, inserted: int, updated: int, deleted: int, copied: int, added: int, removed: int
) -> dict:
    return {
        "num_source_rows": source.num_rows,
        "num_target_rows_inserted": inserted,
        "num_target_rows_updated": updated,
        "num_target_rows_deleted": deleted,
        "num_target_rows_copied": copied,
        "num_target_files_added": added,
        "num_target_files_removed": removed,
    }


def _commit(
    path: Path,
    delta: DeltaTable,
    props: CommitProperties,
    removed: list[tuple[str, int]],
    added: list[tuple[str, int, int, str]],
    change: tuple[str, int] | None,
    metrics: dict,
) -> None:
    """Write the commit after `delta`'s version; fails if a commit of that version exists already."""
    read_version = delta.version()
    now = int(time.time() * 1000)
    info = {
        "timestamp": now,
        "operation": "MERGE",
        "operationParameters": {"writer": "streamdi.delta_merge"},
        "readVersion": read_version,
        "operationMetrics": metrics,
        "clientVersion": "streamdi",
        **(props.custom_metadata or {}),
    }
    lines = [{"commitInfo": info}]
    for txn in props.app_transactions or []:
        lines.append({"txn": {"appId": txn.app_id, "version": txn.version, "lastUpdated": now}})
    for file, size in removed:
        remove = {"path": file, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True}
        lines.append({"remove": {**remove, "partitionValues": {}, "size": size}})
    for file, size, mtime, stats in added:
        add = {"path": file, "partitionValues": {}, "size": size, "modificationTime": mtime, "dataChange": True}
        lines.append({"add": {**add, "stats": stats}})
    if change is not None:
        file, size = change
        lines.append({"cdc": {"path": file, "partitionValues": {}, "size": size, "dataChange": False}})
    log_dir = path / "_delta_log"
    final = log_dir / f"{read_version + 1:020d}.json"
    temporary = log_dir / f".{final.name}.{uuid.uuid4().hex}.tmp"
    temporary.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    try:
        os.link(temporary, final)  # created only if absent: another commit of this version wins
    finally:
        temporary.unlink()
