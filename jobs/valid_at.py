"""Which version of a dimension was valid on a day, for many (natural key, day) pairs at once, in the driver.

The fact tables (`jobs.cash_balances`, `jobs.holdings`, `jobs.watches`, `jobs.market_rows`) look their dimension
keys up here. A version is valid on the days `effectivedate <= day < enddate`; SCD2 versions of one key
never overlap, so at most one is.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao

_DAY_BITS = 23  # days since 1970 shifted by 2**21: every date from year 1 to 9999 fits below 2**23
_DAY_SHIFT = 1 << 21


def valid_versions(
    keys: pa.Array | pa.ChunkedArray,
    days: np.ndarray,
    version_keys: pa.Array | pa.ChunkedArray,
    effective: pa.Array | pa.ChunkedArray,
    end: pa.Array | pa.ChunkedArray,
) -> np.ndarray:
    """For every (keys[i], days[i]) the row index of the version (`version_keys`, `effective`, `end` dates) valid on
    that day (days since 1970-01-01), or -1 when the key has no version then."""
    keys = ao.column(pa.table({"k": keys}), "k")
    version_keys = ao.column(pa.table({"k": version_keys}), "k")
    if len(version_keys) == 0 or len(keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    if keys.type != version_keys.type:
        keys = keys.cast(version_keys.type)
    distinct = pc.unique(version_keys)
    v_code = pc.index_in(version_keys, value_set=distinct).to_numpy(zero_copy_only=False).astype(np.int64)
    q_found = pc.index_in(keys, value_set=distinct)
    q_code = pc.fill_null(q_found, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    eff = ao.days(effective) + _DAY_SHIFT
    stop = ao.days(end) + _DAY_SHIFT
    v_sort = (v_code << _DAY_BITS) | eff
    order = np.argsort(v_sort, kind="stable")
    sorted_keys = v_sort[order]
    query = (np.maximum(q_code, 0) << _DAY_BITS) | (np.asarray(days, dtype=np.int64) + _DAY_SHIFT)
    pos = np.searchsorted(sorted_keys, query, side="right") - 1
    candidate = order[np.maximum(pos, 0)]
    ok = (
        (q_code >= 0)
        & (pos >= 0)
        & (v_code[candidate] == q_code)
        & (np.asarray(days, dtype=np.int64) + _DAY_SHIFT < stop[candidate])
    )
    return np.where(ok, candidate, -1)


def take(values: pa.Array | pa.ChunkedArray, index: np.ndarray) -> pa.Array:
    """values[index] with NULL where index is -1."""
    arr = ao.column(pa.table({"v": values}), "v")
    if len(arr) == 0:
        return pa.nulls(len(index), arr.type)
    taken = arr.take(pa.array(np.maximum(index, 0)))
    if (index < 0).any():
        taken = pc.if_else(pa.array(index >= 0), taken, pa.scalar(None, arr.type))
    return taken
