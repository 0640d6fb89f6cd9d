"""FactMarketHistory's 52-week high and low (step T4, `jobs.market_history`): the window of each day combined from
slices of days kept between micro-batches.

**The 52-week window from shared slices.** The windows of consecutive days overlap on 363 of their 364 days. Rather
than re-reading a year of DailyMarket for every new day, the step keeps, per security, the partial aggregates
(highest DM_HIGH and lowest DM_LOW, each with its first day) of aligned blocks of 2, 4, .., 256 days in
`staging.market_slices` (`schemas.holds.MARKET_SLICES`; a block of level k covers days j*2**k .. (j+1)*2**k - 1
counted from 1970-01-01; the day itself, level 0, is the DailyMarket record). Any window is the union of at most
two blocks per level (`jobs.slicing.decompose`: the decomposition of a range over a segment tree; the same slices
and blocks answer the live windows of `jobs.windows_slices`, which build theirs in memory), and max/min with
the earliest day on ties combine in any grouping, so a day's window is combined from about 18 slices, each shared
by every window that covers it. A micro-batch that brings day d rebuilds the 8 blocks containing d from their two
halves and combines the new day's window: its cost grows with the days it brings, not with the year behind them.
Days are combined as 64-bit words (price in cents above, day below) so that one max or min gives both the extreme
and its first day.

Where it sits: the step (`jobs.market_history`) reads the records and stored slices a micro-batch needs, calls
`rebuild_slices` and `window_extremes`, and commits the rebuilt slices (`slices_table`) last; the rows
(`jobs.market_rows`) decode the window words. Pure: no lake.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.slicing import block_keys, decompose, key_parts
from schemas.holds import MARKET_SLICES

WINDOW_DAYS = 364  # 52 weeks, ending on the day itself
LEVELS = 8  # blocks of up to 2**8 = 256 days: the largest that fits in a window

_BITS = 22  # a combined word: price in cents << 22 | a day code (22 bits)
_MASK = (1 << _BITS) - 1
_DAY_SHIFT = 1 << 21  # days since 1970 + this is in [0, 2**22) for years 1 to 9999
NO_HIGH = np.int64(-1)  # identity of the max: below every real word
NO_LOW = np.int64(np.iinfo(np.int64).max)  # identity of the min


def high_words(cents: np.ndarray, days: np.ndarray) -> np.ndarray:
    """Words whose maximum is the highest price and, among equal prices, the earliest day."""
    return (np.asarray(cents, np.int64) << _BITS) | (_MASK - (np.asarray(days, np.int64) + _DAY_SHIFT))


def low_words(cents: np.ndarray, days: np.ndarray) -> np.ndarray:
    """Words whose minimum is the lowest price and, among equal prices, the earliest day."""
    return (np.asarray(cents, np.int64) << _BITS) | (np.asarray(days, np.int64) + _DAY_SHIFT)


def decode_high(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return words >> _BITS, _MASK - (words & _MASK) - _DAY_SHIFT


def decode_low(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return words >> _BITS, (words & _MASK) - _DAY_SHIFT


@dataclass
class Slices:
    """Slices (security code, level, block) -> (high word, low word), sorted by key for lookups."""

    keys: np.ndarray
    highs: np.ndarray
    lows: np.ndarray

    @classmethod
    def empty(cls) -> Slices:
        return cls(np.array([], np.int64), np.array([], np.int64), np.array([], np.int64))

    @classmethod
    def of(cls, keys: np.ndarray, highs: np.ndarray, lows: np.ndarray) -> Slices:
        order = np.argsort(keys, kind="stable")
        return cls(np.asarray(keys, np.int64)[order], np.asarray(highs)[order], np.asarray(lows)[order])

    def __len__(self) -> int:
        return len(self.keys)

    def union(self, other: Slices) -> Slices:
        """Both sets of slices; where both have a key, `other`'s."""
        keys = np.r_[self.keys, other.keys]
        highs, lows = np.r_[self.highs, other.highs], np.r_[self.lows, other.lows]
        order = np.argsort(keys, kind="stable")
        keys, highs, lows = keys[order], highs[order], lows[order]
        last = np.r_[keys[1:] != keys[:-1], True]
        return Slices(keys[last], highs[last], lows[last])

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(high words, low words, found) of `keys`; the identities where a slice does not exist (no data)."""
        keys = np.asarray(keys, np.int64)
        if len(self.keys) == 0:
            return np.full(len(keys), NO_HIGH), np.full(len(keys), NO_LOW), np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found = self.keys[pos] == keys
        return np.where(found, self.highs[pos], NO_HIGH), np.where(found, self.lows[pos], NO_LOW), found

    def only(self, keys: np.ndarray) -> Slices:
        """The slices whose key is one of `keys`."""
        keep = ao.member(self.keys, ao.distinct(keys))
        return Slices(self.keys[keep], self.highs[keep], self.lows[keep])

    def differing_from(self, stored: Slices) -> Slices:
        """The slices that `stored` lacks or holds with other values (what a commit of these slices changes)."""
        high, low, found = stored.lookup(self.keys)
        keep = ~(found & (high == self.highs) & (low == self.lows))
        return Slices(self.keys[keep], self.highs[keep], self.lows[keep])


def lookup(stores: list[Slices], keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high words, low words) of `keys` from the first of `stores` that has each key (identities where none)."""
    high = np.full(len(keys), NO_HIGH)
    low = np.full(len(keys), NO_LOW)
    todo = np.ones(len(keys), dtype=bool)
    for store in stores:
        if not todo.any() or len(store) == 0:
            continue
        index = np.flatnonzero(todo)
        h, lo, found = store.lookup(keys[index])
        high[index[found]], low[index[found]] = h[found], lo[found]
        todo[index[found]] = False
    return high, low


def affected_blocks(codes: np.ndarray, days: np.ndarray) -> list[np.ndarray]:
    """Per level 1..LEVELS (list index level - 1): the distinct keys of the blocks that contain the (code, day)
    pairs, i.e. the slices a change to those days alters."""
    out = []
    for level in range(1, LEVELS + 1):
        out.append(ao.distinct(block_keys(codes, level, np.asarray(days, np.int64) >> level)))
    return out


def _children(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys of the two halves (level - 1) of the blocks `keys`."""
    code, level, block = key_parts(keys)
    return block_keys(code, level - 1, 2 * block), block_keys(code, level - 1, 2 * block + 1)


def rebuild_needs(changed: list[np.ndarray]) -> np.ndarray:
    """The keys of the slices (any level below LEVELS, days included) that rebuilding the `changed` blocks
    (`affected_blocks`) reads and does not rebuild itself."""
    if not changed or not sum(len(k) for k in changed):
        return np.array([], np.int64)
    need = ao.distinct(np.concatenate([np.r_[left, right] for left, right in map(_children, changed)]))
    return need[~ao.member(need, ao.distinct(np.concatenate(changed)))]


def rebuild_slices(changed: list[np.ndarray], known: list[Slices]) -> Slices:
    """The `changed` blocks (`affected_blocks`) rebuilt bottom-up from their halves: halves that are themselves
    rebuilt come from the level below, the others (and the days, level 0) from the first of `known` that has them.
    A block without data in either half is left out."""
    levels = []
    below = Slices.empty()
    for keys in changed:  # level 1 first
        left, right = _children(keys)
        lh, ll = lookup([below, *known], left)
        rh, rl = lookup([below, *known], right)
        highs, lows = np.maximum(lh, rh), np.minimum(ll, rl)
        has = highs != NO_HIGH
        below = Slices.of(keys[has], highs[has], lows[has])
        levels.append(below)
    if not levels:
        return Slices.empty()
    return Slices.of(
        np.concatenate([x.keys for x in levels]),
        np.concatenate([x.highs for x in levels]),
        np.concatenate([x.lows for x in levels]),
    )


def window_segments(days: np.ndarray, window: int = WINDOW_DAYS) -> list[tuple[np.ndarray, int, np.ndarray]]:
    """The aligned blocks that cover each window days[i] - window + 1 .. days[i] (`jobs.slicing.decompose`)."""
    days = np.asarray(days, np.int64)
    return decompose(days - window + 1, days + 1, LEVELS)


def window_nodes(days: np.ndarray, window: int = WINDOW_DAYS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`window_segments` as parallel arrays (query index, level, block)."""
    segments = window_segments(days, window)
    if not segments:
        empty = np.array([], np.int64)
        return empty, empty, empty
    return (
        np.concatenate([q for q, _, _ in segments]),
        np.concatenate([np.full(len(q), level) for q, level, _ in segments]),
        np.concatenate([blocks for _, _, blocks in segments]),
    )


def window_extremes(codes: np.ndarray, days: np.ndarray, stores: list[Slices]) -> tuple[np.ndarray, np.ndarray]:
    """(high word, low word) of each (code, day)'s 52-week window, combined from the days and slices of `stores`
    (the first that has a key gives it). A run of equal keys in a segment (neighbouring days of a security
    share most of their blocks) is looked up once."""
    codes = np.asarray(codes, np.int64)
    high = np.full(len(days), NO_HIGH)
    low = np.full(len(days), NO_LOW)
    for q, level, blocks in window_segments(days):
        keys = block_keys(codes[q], level, blocks)
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        runs = np.diff(np.r_[starts, len(keys)])
        highs, lows = lookup(stores, keys[starts])
        high[q] = np.maximum(high[q], np.repeat(highs, runs))
        low[q] = np.minimum(low[q], np.repeat(lows, runs))
    return high, low


def window_needs(codes: np.ndarray, days: np.ndarray) -> np.ndarray:
    """The distinct slice keys the windows of the (code, day) pairs combine."""
    codes = np.asarray(codes, np.int64)
    keys = [block_keys(codes[q], level, blocks) for q, level, blocks in window_segments(days)]
    return ao.distinct(np.concatenate(keys)) if keys else np.array([], np.int64)


def day_slices(codes: np.ndarray, records: pa.Table) -> Slices:
    """The level-0 slices (the days) of `records` (`effective_records`), for the security codes given per row."""
    days = ao.days(records["dm_date"])
    return Slices.of(
        block_keys(codes, 0, days),
        high_words(ao.cents(records["dm_high"]), days),
        low_words(ao.cents(records["dm_low"]), days),
    )


def slices_from_table(rows: pa.Table, symbols: pa.Array) -> Slices:
    """`staging.market_slices` rows as Slices, the security code being the index of the symbol in `symbols`."""
    code = pc.index_in(rows["symbol"].cast(symbols.type), value_set=symbols)
    known = pc.is_valid(code)
    rows = rows.filter(known)
    codes = code.filter(known).to_numpy(zero_copy_only=False).astype(np.int64)
    level = ao.column(rows, "level").to_numpy(zero_copy_only=False).astype(np.int64)
    block = ao.column(rows, "block").to_numpy(zero_copy_only=False).astype(np.int64)
    highs = high_words(ao.cents(rows["high"]), ao.days(rows["high_date"]))
    lows = low_words(ao.cents(rows["low"]), ao.days(rows["low_date"]))
    return Slices.of(block_keys(codes, level, block), highs, lows)


def slices_table(slices: Slices, symbols: pa.Array) -> pa.Table:
    """Slices of levels 1.. as `staging.market_slices` rows (symbol from the code's index in `symbols`)."""
    code, level, block = key_parts(slices.keys)
    keep = level >= 1
    high_cents, high_day = decode_high(slices.highs[keep])
    low_cents, low_day = decode_low(slices.lows[keep])
    return pa.table(
        {
            "symbol": symbols.take(pa.array(code[keep])),
            "level": pa.array(level[keep], pa.int32()),
            "block": pa.array(block[keep], pa.int32()),
            "high": ao.decimals(high_cents, 8, 2),
            "high_date": pa.array(high_day.astype(np.int32), pa.int32()).cast(pa.date32()),
            "low": ao.decimals(low_cents, 8, 2),
            "low_date": pa.array(low_day.astype(np.int32), pa.int32()).cast(pa.date32()),
        }
    ).cast(MARKET_SLICES.arrow_schema())
