"""The order of a table's rows by several key columns, the same permutation as Arrow's stable `sort_indices`, found
faster on large tables.

Arrow sorts by several keys with a comparison of row against row that goes back to every key column for each
pair; with a string among the keys that is slow (SF 10 Batch1's 2.1 M WatchHistory records by customer and symbol:
3.0 s). Here each key becomes an integer code that keeps its order (integers, dates and times shifted to start at
zero; strings replaced by the rank of their value among the column's distinct values, found by Arrow's own sort of
the few distinct values), NULLs become the lowest or the highest code, as many consecutive codes as fit are packed
into one 64-bit integer, and numpy's stable sort orders the packed keys (`np.lexsort` when they need several):
0.45 s for the watches. Small tables keep Arrow's sort, and so do keys of other types (floats, decimals,
nested) unless the keys before them already tell every row apart.

Rows of which most are known to be in order already (a MERGE's rows kept from files it wrote sorted, then its new
rows) are not sorted whole: only the new rows are, and each is placed among the others by binary search
(`merged_order`; FactWatches' MERGE of a SF 6 micro-batch, ~340k rows rewritten: 0.22 -> 0.18 s).

Both sorts are stable and compare strings byte by byte, so the permutation is the same either way (tested against
Arrow's on the types and NULLs above): the choice cannot change a warehouse.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Below this many rows Arrow's sort costs little, and codes for every key could cost more than it does.
MIN_ROWS = 20_000
# At most this many new rows placed one at a time among rows in order (`merged_order`), else a whole sort.
MAX_TIED = 256
_PACKED_LIMIT = 1 << 63  # codes multiplied up to here still fit in an int64


def sort_indices(
    data: pa.Table, keys: Sequence[str], *, nulls_first: bool, sorted_rows: int = 0
) -> pa.Array | np.ndarray:
    """The positions of `data`'s rows sorted by `keys`, ascending, stable, NULLs first or last: what
    `pc.sort_indices(data, [(k, "ascending", placement) ...])` gives (as int64 numpy positions when found
    here). `sorted_rows`: the first so many rows are likely in order already (a MERGE's rows kept from files written
    in order, followed by its few new rows); when they are, only the rows after them are sorted and each is put in
    its place among them (`merged_order`), which gives the same positions."""
    if data.num_rows >= MIN_ROWS:
        order = (
            packed_order(data, keys, nulls_first=nulls_first)
            if sorted_rows < 2
            else merged_order(data, keys, sorted_rows, nulls_first=nulls_first)
        )
        if order is not None:
            return order
    placement = "at_start" if nulls_first else "at_end"
    return pc.sort_indices(data, sort_keys=[(k, "ascending", placement) for k in keys])


def sorted_by(data: pa.Table, keys: Sequence[str], *, nulls_first: bool) -> pa.Table:
    """`data` sorted by `keys` (`sort_indices`)."""
    if data.num_rows < 2 or not keys:
        return data
    return data.take(sort_indices(data, keys, nulls_first=nulls_first))


def packed_order(data: pa.Table, keys: Sequence[str], *, nulls_first: bool) -> np.ndarray | None:
    """`sort_indices` through packed integer codes, whatever the size; None when a key's type has no code here and
    the keys before it leave rows tied (keys after a prefix that tells every row apart never decide: the prices
    after DailyMarket's symbol, date, batch and CDC_DSN)."""
    if data.num_rows == 0 or not keys:
        return np.arange(data.num_rows, dtype=np.int64)
    return _whole_order(*_packed(data, keys, nulls_first=nulls_first), len(keys))


def _whole_order(groups: list[np.ndarray], coded: int, settled: bool, keys: int) -> np.ndarray | None:
    """`packed_order` of the packed codes `_packed` gave for `keys` keys."""
    if not groups:
        return None
    order = _ordered(groups)
    if settled or coded == keys:
        return order
    return None if _ties(groups, order) else order


def merged_order(data: pa.Table, keys: Sequence[str], head: int, *, nulls_first: bool) -> np.ndarray | None:
    """`packed_order`, found without sorting the first `head` rows when they are in order: the rows after them are
    sorted and each goes after the last of those rows that is not greater (a stable sort puts the earlier row first
    among equal keys). Rows out of order among the first `head`: the whole sort, as `packed_order`."""
    if data.num_rows == 0 or not keys:
        return np.arange(data.num_rows, dtype=np.int64)
    groups, coded, settled = _packed(data, keys, nulls_first=nulls_first)
    if not groups or not (settled or coded == len(keys)):
        return _whole_order(groups, coded, settled, len(keys))  # the codes leave rows tied: as `packed_order`
    first = [g[:head] for g in groups]
    if not _in_order(first):
        return _ordered(groups)
    rest = [g[head:] for g in groups]
    rest_order = _ordered(rest)
    values = [g[rest_order] for g in rest]
    places = _places(first, values)
    if places is None:
        return _ordered(groups)
    order = np.empty(data.num_rows, dtype=np.int64)
    slots = places + np.arange(len(places), dtype=np.int64)  # each earlier new row moves the later ones on by one
    order[slots] = rest_order + head
    free = np.ones(data.num_rows, dtype=bool)
    free[slots] = False
    order[free] = np.arange(head, dtype=np.int64)
    return order


def _in_order(groups: list[np.ndarray]) -> bool:
    """Whether the rows of packed keys are in ascending order (equal neighbours allowed)."""
    n = len(groups[0])
    if n < 2:
        return True
    after = np.zeros(n - 1, dtype=bool)  # row i+1 already known greater than row i
    tied = np.ones(n - 1, dtype=bool)  # equal so far
    for packed in groups:
        later, earlier = packed[1:], packed[:-1]
        after |= tied & (later > earlier)
        tied &= later == earlier
    return bool((after | tied).all())


def _places(first: list[np.ndarray], values: list[np.ndarray]) -> np.ndarray | None:
    """For each row of packed `values`, how many rows of the ordered `first` are not greater than it; None when more
    than `MAX_TIED` rows tie with some of `first` on the first packed key (each is then placed by a look of its own
    at the later keys, in Python: a whole sort costs less)."""
    low = np.searchsorted(first[0], values[0], "left")
    high = np.searchsorted(first[0], values[0], "right")
    tied = np.flatnonzero(high > low) if len(first) > 1 else np.empty(0, dtype=np.int64)
    if len(tied) > MAX_TIED:
        return None
    for row in tied:
        lo, hi = int(low[row]), int(high[row])
        for packed, value in zip(first[1:], values[1:], strict=True):
            span = packed[lo:hi]
            lo, hi = (
                lo + int(np.searchsorted(span, value[row], "left")),
                lo + int(np.searchsorted(span, value[row], "right")),
            )
            if lo == hi:
                break
        high[row] = hi
    return high.astype(np.int64)


def rows_distinct(data: pa.Table, keys: Sequence[str]) -> bool:
    """Whether no two rows of `data` are equal on `keys` (NULL equal to NULL): the packed codes sorted and compared
    with their neighbours, 8 bytes a row where a hash aggregation keeps a table of every key (SF 100's
    FactMarketHistory, 42 M keys of symbol and day: ~4 GiB). Arrow's grouping where a key has no codes here."""
    if data.num_rows < 2 or not keys:
        return data.num_rows < 2
    groups, coded, settled = _packed(data, keys, nulls_first=True)
    if settled:
        return True
    if coded < len(keys):
        return data.select(list(keys)).group_by(list(keys), use_threads=False).aggregate([]).num_rows == data.num_rows
    if len(groups) == 1:
        ranked = groups[0]
        ranked.sort()  # in place: the codes are this call's own
        return not bool((ranked[1:] == ranked[:-1]).any())
    return not _ties(groups, _ordered(groups))


def _packed(data: pa.Table, keys: Sequence[str], *, nulls_first: bool) -> tuple[list[np.ndarray], int, bool]:
    """The codes of `keys` up to the first key without codes here, packed into as few int64 columns as they fit in;
    how many keys they cover; and whether the first key alone tells every row apart (a unique string column: its
    codes are then all that is returned, the other keys never decide)."""
    groups: list[np.ndarray] = []
    packed: np.ndarray | None = None
    span, coded = 1, 0
    for name in keys:
        found = _codes(data[name], nulls_first=nulls_first)
        if found is None:
            break
        codes, size, distinct = found
        if coded == 0 and distinct:
            return [codes], 1, True
        coded += 1
        if packed is not None and span * size < _PACKED_LIMIT:
            packed *= size  # in place: every code array is made here (SF 100's 42 M keys: 336 MB each)
            packed += codes
            span *= size
            continue
        if packed is not None:
            groups.append(packed)
        packed, span = codes, size
    return ([*groups, packed] if packed is not None else groups), coded, False


def _ordered(groups: list[np.ndarray]) -> np.ndarray:
    """The stable order of packed keys, the first the most significant."""
    if len(groups) == 1:
        return np.argsort(groups[0], kind="stable")
    return np.lexsort(groups[::-1])


def _ties(groups: list[np.ndarray], order: np.ndarray) -> bool:
    """Whether two rows have equal keys (`order`: their sorted order)."""
    tied = np.ones(len(order) - 1, dtype=bool)
    for packed in groups:
        ranked = packed[order]
        tied &= ranked[1:] == ranked[:-1]
    return bool(tied.any())


def _codes(column: pa.ChunkedArray, *, nulls_first: bool) -> tuple[np.ndarray, int, bool] | None:
    """Each value's code (int64 from 0, in the value's order, equal values equal), how many codes there can be, and
    whether every value is known to differ from the others; None for a type without codes here."""
    values = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = values.type
    if any(check(kind) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)):
        codes, size = _ranked(values, nulls_first=nulls_first)
        return codes, size, values.null_count == 0 and size == len(values)
    as_int = _integers(values)
    if as_int is None:
        return None
    nulls = values.null_count
    filled = np.asarray(pc.fill_null(as_int, 0) if nulls else as_int, dtype=np.int64)
    valid = None if not nulls else np.asarray(values.is_valid(), dtype=bool)
    present = filled if valid is None else filled[valid]
    if present.size == 0:
        return np.zeros(len(values), np.int64), 1, False
    low, high = int(present.min()), int(present.max())
    size = high - low + 1 + (1 if nulls else 0)
    if size >= _PACKED_LIMIT:
        return None
    codes = filled - low
    if valid is not None:
        if nulls_first:
            codes += 1
            codes[~valid] = 0
        else:
            codes[~valid] = high - low + 1
    return codes, size, False


def _integers(values: pa.Array) -> pa.Array | None:
    """`values` as 64-bit integers in the same order, or None (floats, decimals, unsigned beyond int64, nested)."""
    kind = values.type
    if pa.types.is_boolean(kind):
        return values.cast(pa.int8())
    if pa.types.is_integer(kind):
        if kind == pa.uint64() and len(values) and (pc.max(values).as_py() or 0) >= _PACKED_LIMIT:
            return None
        return values.cast(pa.int64())
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        return values.view(pa.int32()).cast(pa.int64())
    if pa.types.is_date64(kind) or pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        return values.view(pa.int64())
    if pa.types.is_duration(kind):
        return values.view(pa.int64())
    return None


def _ranked(values: pa.Array, *, nulls_first: bool) -> tuple[np.ndarray, int]:
    """Strings as the rank of each value among the distinct values (ranked by Arrow's sort: byte order)."""
    encoded = pc.dictionary_encode(values)
    distinct = encoded.dictionary
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.asarray(pc.sort_indices(distinct))] = np.arange(len(distinct), dtype=np.int64)
    nulls = values.null_count
    if nulls == len(values):
        return np.zeros(len(values), dtype=np.int64), 1
    if not nulls:
        return rank[np.asarray(encoded.indices, dtype=np.int64)], max(len(distinct), 1)
    valid = np.asarray(encoded.indices.is_valid(), dtype=bool)
    codes = rank[np.asarray(pc.fill_null(encoded.indices, 0), dtype=np.int64)]
    if nulls_first:
        codes += 1
        codes[~valid] = 0
    else:
        codes[~valid] = len(distinct)
    return codes, len(distinct) + 1
