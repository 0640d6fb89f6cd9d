"""Slices of event time: the one mechanism every window over event time is answered with.

Event time is cut into **slices** of one unit (an hour of trades, a day of market data): slice `i` covers
`[i * unit, (i + 1) * unit)` from 1970-01-01 (plus an offset, see `schemas.windows`). Per key (a security, an
account, a sector) a slice holds the **partial aggregate** of its records: sums, maxima and minima, every one of
them associative and commutative, so records can be added in any order and partials combined in any grouping.

Above the slices sit aligned **blocks**: the block `j` of level `k` covers slices `j * 2**k .. (j + 1) * 2**k - 1`
and holds the combination of its two halves (level 0 is the slice itself). A window over slices `[lo, hi)` is the
union of at most two blocks per level (`decompose`: a range query on a segment tree whose leaves are the slices),
so every window -- tumbling, sliding, any size -- is combined from a few blocks, and every block is shared by all
the windows that cover it. Two users:
- the live windows (`jobs.windows_slices`) build the blocks in memory from the slices of the time they recompute and
  answer every declared window from them;
- FactMarketHistory's 52-week high and low (`jobs.market_slices`) keeps its blocks of days in
  `staging.market_slices` between micro-batches, since its windows reach a year back.

Keys pack (key code, level, block) into one int64 (`block_keys`), so that lookups are one `searchsorted`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

OPS = ("sum", "max", "min")
_IDENTITY = {"sum": 0, "max": np.iinfo(np.int64).min, "min": np.iinfo(np.int64).max}
_BLOCK_SHIFT = 1 << 31  # blocks (and slices) may be negative: before 1970


def identity(op: str) -> int:
    """The value that changes nothing under `op` (what an empty slice holds)."""
    return _IDENTITY[op]


def block_keys(codes: np.ndarray, level: int | np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """One int64 per (key code, level, block): the lookup key of a block (level 0: of a slice)."""
    return ((np.asarray(codes, np.int64) * 16 + level) << 32) | (np.asarray(blocks, np.int64) + _BLOCK_SHIFT)


def key_parts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key codes, levels, blocks) of `block_keys`."""
    keys = np.asarray(keys, np.int64)
    code_level = keys >> 32
    return code_level // 16, code_level % 16, (keys & 0xFFFFFFFF) - _BLOCK_SHIFT


def decompose(lo: np.ndarray, hi: np.ndarray, max_level: int) -> list[tuple[np.ndarray, int, np.ndarray]]:
    """The aligned blocks that exactly cover each range of slices `[lo[i], hi[i])`: at most two per level, as
    segments (query indexes, level, blocks), one per level and side; a query appears at most once in a segment and
    a segment keeps the order of the queries. Raises when a range needs a block above `max_level`."""
    lo = np.asarray(lo, np.int64).copy()
    hi = np.asarray(hi, np.int64).copy()
    index = np.arange(len(lo))
    segments = []
    level = 0
    while True:
        open_ = lo < hi
        if not open_.any():
            break
        if level > max_level:
            raise ValueError(f"a window needs blocks above level {max_level}")
        take_lo = open_ & ((lo & 1) == 1)
        segments.append((index[take_lo], level, lo[take_lo]))
        lo = lo + take_lo
        take_hi = (lo < hi) & ((hi & 1) == 1)
        hi = hi - take_hi
        segments.append((index[take_hi], level, hi[take_hi]))
        lo, hi = lo >> 1, hi >> 1
        level += 1
    return [(q, lvl, blocks) for q, lvl, blocks in segments if len(q)]


def levels_for(slices: int) -> int:
    """The highest block level a window of `slices` slices can need."""
    return max(int(slices).bit_length(), 1)


@dataclass
class Partials:
    """Partial aggregates by block key (`block_keys`), sorted by key; `values[name]` is combined with `ops[name]`."""

    keys: np.ndarray
    values: dict[str, np.ndarray]
    ops: Mapping[str, str]

    @classmethod
    def of(cls, keys: np.ndarray, values: Mapping[str, np.ndarray], ops: Mapping[str, str]) -> Partials:
        """The partials of records (or of smaller partials) with these keys: equal keys combined."""
        keys = np.asarray(keys, np.int64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], np.int64)
        out = {}
        for name, op in ops.items():
            v = np.asarray(values[name], np.int64)[order]
            out[name] = reduce_runs(op, v, starts) if len(keys) else v
        return cls(keys[starts] if len(keys) else keys, out, dict(ops))

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, keys: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(values, found) of `keys`: the identities where a key has no partial (an empty block)."""
        keys = np.asarray(keys, np.int64)
        if len(self.keys) == 0:
            found = np.zeros(len(keys), dtype=bool)
            return {n: np.full(len(keys), identity(op), np.int64) for n, op in self.ops.items()}, found
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found = self.keys[pos] == keys
        return {n: np.where(found, self.values[n][pos], identity(op)) for n, op in self.ops.items()}, found


def reduce_runs(op: str, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`op` over each run of `values` beginning at `starts` (sorted, the first 0): one partial per run."""
    if op == "sum":
        return np.add.reduceat(values, starts)
    if op == "max":
        return np.maximum.reduceat(values, starts)
    if op == "min":
        return np.minimum.reduceat(values, starts)
    raise ValueError(f"unknown operator {op!r}; expected one of {OPS}")


def _combine(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "sum":
        return a + b
    if op == "max":
        return np.maximum(a, b)
    return np.minimum(a, b)


def build_blocks(slices: Partials, max_level: int) -> Partials:
    """The slices (level 0) and every block of levels 1..`max_level` that holds one of them, each block the
    combination of the slices it covers."""
    codes, level, block = key_parts(slices.keys)
    if len(slices) and (level != 0).any():
        raise ValueError("build_blocks takes slices (level 0)")
    keys = [slices.keys]
    values = {n: [v] for n, v in slices.values.items()}
    for k in range(1, max_level + 1):
        # the slices are sorted by (code, slice), so their blocks of each level are too: one reduceat per level
        level_keys = block_keys(codes, k, block >> k)
        starts = np.flatnonzero(np.r_[True, level_keys[1:] != level_keys[:-1]]) if len(level_keys) else level_keys
        keys.append(level_keys[starts] if len(level_keys) else level_keys)
        for n, op in slices.ops.items():
            values[n].append(reduce_runs(op, slices.values[n], starts) if len(level_keys) else slices.values[n][:0])
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    return Partials(all_keys[order], {n: np.concatenate(v)[order] for n, v in values.items()}, slices.ops)


def combine(
    codes: np.ndarray, lo: np.ndarray, hi: np.ndarray, blocks: Partials, max_level: int
) -> dict[str, np.ndarray]:
    """The aggregate of each window: key `codes[i]`, slices `[lo[i], hi[i])`, combined from `blocks`
    (`build_blocks`). A window without records holds the identities."""
    codes = np.asarray(codes, np.int64)
    out = {n: np.full(len(codes), identity(op), np.int64) for n, op in blocks.ops.items()}
    for q, level, block in decompose(lo, hi, max_level):
        found, _ = blocks.lookup(block_keys(codes[q], level, block))
        for n, op in blocks.ops.items():
            out[n][q] = _combine(op, out[n][q], found[n])
    return out
