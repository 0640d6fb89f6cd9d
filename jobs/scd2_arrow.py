"""SCD type 2 history on Arrow tables in the driver, with `jobs.scd2`'s conventions, for every dimension: DimCustomer
and DimAccount (T2), DimCompany and DimSecurity (T1). Their change records are few enough for one process (thousands
of keys per scale factor; FINWIRE's SEC records ~30,000 at SF 10), where Spark plans cost seconds of planning per
micro-batch whatever its size.

A key's history is a function of its change records in their declared order only; at most one version per key and
day (the day's last change); `enddate` is the next version's `effectivedate`, the open version ends on 9999-12-31
and is the only one with `iscurrent`; `batchid` is the TPC-DI batch of the change that made the version. Surrogate
keys: `surrogate_keys` for numeric natural keys, `hashed_surrogate_keys` for strings.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from jobs.arrow_ops import EPOCH, column, days, same_as_next, same_as_previous, sort
from jobs.scd2 import BATCH, DAY_SLOTS, END_OF_TIME, EPOCH_1900, TS, present_flag

DAYS_1900 = (EPOCH_1900 - EPOCH).days  # days from 1970-01-01 to 1900-01-01 (negative)
_SPARK_SEED = 42  # the seed of Spark's xxhash64
_SIGN_CLEARED = 0x7FFFFFFFFFFFFFFF


def surrogate_keys(natural: pa.Array | pa.ChunkedArray, day: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`natural * 100000 + days since 1900-01-01` of `day` (int64; NULL where either is NULL)."""
    natural = natural.combine_chunks() if isinstance(natural, pa.ChunkedArray) else natural
    day = day.combine_chunks() if isinstance(day, pa.ChunkedArray) else day
    valid = np.asarray(pc.and_(pc.is_valid(natural), pc.is_valid(day)), dtype=bool)
    n = np.asarray(pc.fill_null(natural.cast(pa.int64()), 0), dtype=np.int64)
    d = days(pc.fill_null(day, EPOCH)) - DAYS_1900
    return pa.array(n * DAY_SLOTS + d, pa.int64(), mask=~valid)


def hashed_surrogate_keys(tag: str, natural: pa.Array | pa.ChunkedArray, day: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A non-negative 63-bit hash of `(tag, natural key, day)` per row, for natural keys that are strings (DimSecurity's
    symbol): Spark's `xxhash64(tag, natural, day)` (seed 42; each value hashed with XXH64 seeded by the hash so far,
    a string by its UTF-8 bytes, a date by its days since 1970 as 4 little-endian bytes; NULL skipped) with the sign
    bit cleared. A fixed function of its input: the same history always gets the same keys."""
    seed = xxhash.xxh64_intdigest(tag.encode(), _SPARK_SEED)
    keys = []
    for value, when in zip(natural.to_pylist(), days(day).tolist(), strict=True):
        h = seed if value is None else xxhash.xxh64_intdigest(value.encode(), seed)
        keys.append(xxhash.xxh64_intdigest(struct.pack("<i", when), h) & _SIGN_CLEARED)
    return pa.array(keys, pa.int64())


def midnight(dates: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Midnight (UTC) of each date, as `timestamp[us, tz=UTC]` (NULL stays NULL): the `_ts` of a record dated
    by its batch."""
    dates = dates.combine_chunks() if isinstance(dates, pa.ChunkedArray) else dates
    micros = pc.multiply(dates.cast(pa.int32()).cast(pa.int64()), 86_400_000_000)
    return micros.cast(pa.timestamp("us", tz="UTC"))


def build_versions(changes: pa.Table, key: str, order: Sequence[str], values: Sequence[str]) -> pa.Table:
    """Versions of every key in `changes`, one per key per day.

    `changes`: one row per change record with `key`, `_ts` (timestamp[us, tz=UTC]), `_batch`, the `values` and
    optionally `_has_<value>` booleans (a record with the flag false or NULL keeps the previous record's value).
    `order` sorts a key's records in their declared order (total per key). Returns `key`, the `values` as of the
    day's last change, `effectivedate`, `enddate`, `iscurrent` and `batchid` (int32), sorted by key and date."""
    order = list(order)
    data = sort(changes, [key, *order])
    n = data.num_rows
    rows = np.arange(n)
    first_of_key = ~same_as_previous(data, [key])
    key_start = np.maximum.accumulate(np.where(first_of_key, rows, 0)) if n else rows
    filled: dict[str, pa.Array] = {}
    for v in values:
        flag = present_flag(v)
        col = column(data, v)
        if flag in data.column_names:
            has = np.asarray(pc.fill_null(column(data, flag), False), dtype=bool)
            last = np.maximum.accumulate(np.where(has, rows, -1)) if n else rows
            carried = last >= key_start
            col = col.take(pa.array(np.where(carried, last, 0), pa.int64(), mask=~carried))
        filled[v] = col
    extra = [c for c in dict.fromkeys([*order, BATCH]) if c != key]
    states = pa.table(
        {
            key: column(data, key),
            **{c: column(data, c) for c in extra},
            "effectivedate": pc.cast(column(data, TS), pa.date32()),
            **filled,
        }
    )
    # the last change of each day makes the day's version
    by_day = sort(states, [key, "effectivedate", *order])
    versions = by_day.filter(pa.array(~same_as_next(by_day, [key, "effectivedate"]), pa.bool_()))
    m = versions.num_rows
    next_same_key = same_as_next(versions, [key])
    eff = column(versions, "effectivedate")
    following = pa.concat_arrays([eff.slice(1), pa.array([END_OF_TIME], pa.date32())]).slice(0, m)
    end = pc.if_else(pa.array(next_same_key, pa.bool_()), following, pa.scalar(END_OF_TIME, pa.date32()))
    return pa.table(
        {
            key: column(versions, key),
            **{v: column(versions, v) for v in values},
            "effectivedate": eff,
            "enddate": end,
            "iscurrent": pa.array(~next_same_key, pa.bool_()),
            "batchid": column(versions, BATCH).cast(pa.int32()),
        }
    )


def has_problem(versions: pa.Table) -> pa.Array:
    """Per version: whether it has a `_problem` (a reason it cannot be loaded)."""
    return pc.is_valid(versions["_problem"])


def loadable(versions: pa.Table, natural: str) -> pa.Table:
    """The versions of the keys none of whose versions has a `_problem`."""
    bad = pc.unique(versions.filter(has_problem(versions))[natural])
    return versions.filter(pc.invert(pc.is_in(versions[natural], value_set=bad)))


def version_changes(
    current: pa.Table, versions: pa.Table, columns: Sequence[str], natural: str, sk: str, touched: pa.Array
) -> tuple[pa.Table, pa.Array]:
    """What to commit so that the touched keys' versions become `versions`: every recomputed version (`columns`;
    the MERGE leaves equal rows alone) and the surrogate keys `sk` of the `current` rows of `touched` keys that no
    longer exist (a key with no version left loses all its rows)."""
    old = current.filter(pc.is_in(current[natural], value_set=touched))[sk]
    gone = old.filter(pc.invert(pc.is_in(old, value_set=versions[sk].combine_chunks())))
    return versions.select(list(columns)), gone.combine_chunks()
