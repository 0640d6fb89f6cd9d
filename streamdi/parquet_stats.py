"""The Delta statistics of a Parquet file another engine or streamdi wrote (Spark's executors, `Lake.write_piece`,
`streamdi.delta_merge`), read from its footer; and how streamdi writes such a file itself (`write_parquet`).

A Delta add action carries per-file statistics: `numRecords`, and per column `minValues`, `maxValues` and
`nullCount`. Readers skip files by them (delta-rs's scans of `streamdi.lake`, the MERGE's file pruning), so a file
committed without them would be read by every filtered read. delta-rs computes them for the files it writes; for a
file Spark wrote, `delta_stats` derives them from the row groups' statistics in the file's footer (no data is read).

Bounds are written only where they are exact in Delta's JSON: integers, floating point numbers (not NaN), dates,
timestamps of up to microseconds (in UTC, with six decimals), booleans, strings, and decimals of up to 15 digits (a
JSON number of more digits may come back rounded, and a bound rounded the wrong way would skip a file that holds a
match). Other columns get their null count only, which Delta
allows: a reader then reads the file for any condition on them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

EXACT_DECIMAL_DIGITS = 15  # a decimal of up to this many digits survives a JSON number (a float) unchanged
# Row groups of at most this many rows, so that a read filtered on a sorted column (a trade id range: the records
# of a micro-batch's trades) skips the others by their statistics; delta-rs writes one per million rows otherwise.
ROW_GROUP_ROWS = 65_536


def write_parquet(rows: pa.Table, where: Path | pa.NativeFile) -> None:
    """Write `rows` as a Parquet data file the way every writer of the lake does (`streamdi.lake.WRITER`'s row
    groups, Snappy)."""
    pq.write_table(rows, where, row_group_size=ROW_GROUP_ROWS, compression="snappy")


def delta_stats(path: Path, schema: pa.Schema) -> tuple[int, str]:
    """(rows, Delta statistics JSON) of the Parquet file at `path`, for the columns of `schema` (the table's)."""
    meta = pq.read_metadata(path)
    rows = meta.num_rows
    columns = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in schema:
        index = columns.get(field.name)
        if index is None:  # a column the file lacks reads as NULL everywhere
            nulls[field.name] = rows
            continue
        low = high = None
        bounded = _boundable(field.type)
        null_count = 0
        for group in range(meta.num_row_groups):
            chunk = meta.row_group(group).column(index)
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                null_count = None
                bounded = False
                break
            null_count += stats.null_count
            if chunk.num_values == stats.null_count:  # only NULLs in this row group: no bounds to take
                continue
            if not stats.has_min_max:
                bounded = False
                continue
            if bounded:
                low = stats.min if low is None else min(low, stats.min)
                high = stats.max if high is None else max(high, stats.max)
        if null_count is not None:
            nulls[field.name] = null_count
        if bounded and low is not None and _exact(low) and _exact(high):
            lows[field.name] = _json_value(low)
            highs[field.name] = _json_value(high)
    stats = {"numRecords": rows, "minValues": lows, "maxValues": highs, "nullCount": nulls}
    return rows, json.dumps(stats, separators=(",", ":"))


def _boundable(kind: pa.DataType) -> bool:
    if pa.types.is_decimal(kind):
        return kind.precision <= EXACT_DECIMAL_DIGITS
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_date32(kind)
        or (pa.types.is_timestamp(kind) and kind.unit in ("s", "ms", "us"))
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
    )


def _exact(value: Any) -> bool:
    return not (isinstance(value, float) and math.isnan(value))


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):  # before `date`, of which it is a kind
        moment = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value
