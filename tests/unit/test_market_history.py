"""FactMarketHistory's 52-week windows and P/E on hand-written data (`jobs.market_slices`, `jobs.market_rows`,
pure functions).

The oracle is a from-scratch computation written here: for each day, look at every day of its 52 weeks and take
the highest high and the lowest low (first day on ties). The slices must give exactly that, at the window's
edges, across a leap day, in a security's first year, and when the days arrive split into micro-batches."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from jobs import market_rows as mr
from jobs import market_slices as ms

EPOCH = dt.date(1970, 1, 1)


def day(text: str) -> int:
    return (dt.date.fromisoformat(text) - EPOCH).days


def from_scratch(codes, days, highs, lows):
    """(high, its first day, low, its first day) of each row's 52 weeks, by looking at every day."""
    out = []
    for c, d in zip(codes, days, strict=True):
        inside = (codes == c) & (days >= d - 363) & (days <= d)
        h = highs[inside].max()
        lo = lows[inside].min()
        out.append((h, days[inside][highs[inside] == h].min(), lo, days[inside][lows[inside] == lo].min()))
    return out


def by_slices(codes, days, highs, lows, known=None):
    store = ms.Slices.of(ms.block_keys(codes, 0, days), ms.high_words(highs, days), ms.low_words(lows, days))
    fresh = ms.rebuild_slices(ms.affected_blocks(codes, days), [store])
    high, low = ms.window_extremes(codes, days, [fresh, store])
    hc, hd = ms.decode_high(high)
    lc, ld = ms.decode_low(low)
    return list(zip(hc.tolist(), hd.tolist(), lc.tolist(), ld.tolist(), strict=True)), fresh


def test_windows_cover_exactly_the_52_weeks_ending_on_the_day_with_at_most_two_blocks_per_level():
    days = np.arange(day("2015-12-01"), day("2017-03-01"))
    q, level, block = ms.window_nodes(days)
    for i, d in enumerate(days):
        mine = q == i
        covered = sorted(x for k, b in zip(level[mine], block[mine], strict=True) for x in range(b << k, (b + 1) << k))
        assert covered == list(range(d - 363, d + 1))  # every day once, none outside
        assert np.bincount(level[mine]).max() <= 2
    assert level.max() <= ms.LEVELS


def test_a_high_counts_for_exactly_364_days_and_ties_go_to_the_first_day():
    days = np.arange(day("2016-01-01"), day("2017-06-01"))  # across 2016-02-29
    codes = np.zeros(len(days), np.int64)
    highs = np.full(len(days), 500)
    lows = np.full(len(days), 300)
    peak = day("2016-02-29")
    highs[days == peak] = 900
    lows[days == day("2016-03-01")] = 100
    highs[days == day("2016-05-01")] = 900  # the same high later: the window keeps the first day
    got, _ = by_slices(codes, days, highs, lows)
    at = {int(d): g for d, g in zip(days, got, strict=True)}
    assert at[peak] == (900, peak, 300, day("2016-01-01"))
    assert at[peak + 363][:2] == (900, peak)  # the last window that holds the leap day
    assert at[peak + 364][:2] == (900, day("2016-05-01"))  # then the later equal high
    assert at[day("2016-05-01") + 364][:2] == (500, day("2016-05-01") + 1)  # both gone: the first of the 500s
    assert at[day("2016-03-01") + 363][2:] == (100, day("2016-03-01"))
    assert at[day("2016-03-01") + 364][2:] == (300, day("2016-03-01") + 1)
    # a security's first days: the window holds only what there is
    assert at[day("2016-01-01")] == (500, day("2016-01-01"), 300, day("2016-01-01"))


def test_random_prices_with_gaps_and_many_securities_match_the_from_scratch_windows():
    rng = np.random.default_rng(7)
    codes, days = [], []
    for code in range(4):
        picked = np.sort(rng.choice(np.arange(day("2015-06-01"), day("2018-06-01")), 500, replace=False))
        codes.append(np.full(len(picked), code))
        days.append(picked)
    codes, days = np.concatenate(codes), np.concatenate(days)
    highs = rng.integers(1000, 1100, len(days))  # narrow ranges: many ties
    lows = rng.integers(1, 40, len(days))
    got, _ = by_slices(codes, days, highs, lows)
    assert got == [tuple(int(x) for x in e) for e in from_scratch(codes, days, highs, lows)]


@pytest.mark.parametrize("parts", [2, 5, 30])
def test_days_arriving_in_micro_batches_in_any_order_give_the_whole_load_windows_and_slices(parts):
    """The slices a micro-batch keeps are those a whole load keeps, and each micro-batch's windows, combined
    from the stored slices, the days it brings and the days of the edges, are the from-scratch ones."""
    rng = np.random.default_rng(parts)
    days = np.sort(rng.choice(np.arange(day("2015-06-01"), day("2017-06-01")), 400, replace=False))
    codes = np.zeros(len(days), np.int64)
    highs = rng.integers(100, 200, len(days))
    lows = rng.integers(1, 50, len(days))
    expected = from_scratch(codes, days, highs, lows)
    whole, whole_slices = by_slices(codes, days, highs, lows)
    all_days = ms.Slices.of(ms.block_keys(codes, 0, days), ms.high_words(highs, days), ms.low_words(lows, days))
    order = rng.permutation(len(days))  # arrival order: any
    stored = ms.Slices.empty()
    seen = np.zeros(len(days), dtype=bool)
    for chunk in np.array_split(order, parts):
        seen[chunk] = True
        changed = ms.affected_blocks(codes[chunk], days[chunk])
        # what the edge reads can see: the days staged so far, and the slices stored so far
        staged = ms.Slices(all_days.keys[seen], all_days.highs[seen], all_days.lows[seen])
        fresh = ms.rebuild_slices(changed, [staged, stored])
        stored = stored.union(fresh)
        # the windows of the new days and of the later days whose windows hold one of them
        first = days[chunk].min()
        redo = seen & (days >= first) & (days <= days[chunk].max() + 363)
        high, low = ms.window_extremes(codes[redo], days[redo], [fresh, staged, stored])
        hc, hd = ms.decode_high(high)
        lc, ld = ms.decode_low(low)
        for i, got in zip(np.flatnonzero(redo), zip(hc, hd, lc, ld, strict=True), strict=True):
            # a window is exact once every day of it has arrived; the last micro-batch makes all of them so
            if seen[(days >= days[i] - 363) & (days <= days[i])].all():
                assert tuple(int(x) for x in got) == tuple(int(x) for x in expected[i])
    assert np.array_equal(stored.keys, whole_slices.keys)
    assert np.array_equal(stored.highs, whole_slices.highs) and np.array_equal(stored.lows, whole_slices.lows)
    assert whole == [tuple(int(x) for x in e) for e in expected]


def test_pe_from_the_four_quarters_before_the_day_and_fewer_when_there_are_fewer():
    # company 7: EPS 1.00 in 2016 Q1..Q4 and 2.50 in 2017 Q1; company 8: one quarter, 2016 Q4
    financials = pa.table(
        {
            "sk_companyid": pa.array([70, 70, 71, 71, 71, 80], pa.int64()),
            "fi_year": pa.array([2016, 2016, 2016, 2016, 2017, 2016], pa.int32()),
            "fi_qtr": pa.array([1, 2, 3, 4, 1, 4], pa.int32()),
            "fi_basic_eps": pa.array(
                [Decimal(x) for x in ("1.00", "1.00", "1.00", "1.00", "2.50", "0.40")], pa.decimal128(10, 2)
            ),
        }
    )
    # 70 and 71 are two versions of company 7
    companies = pa.table({"sk_companyid": pa.array([70, 71, 80], pa.int64()), "companyid": [7, 7, 8]})
    eps = mr.earnings(financials, companies)
    ciks = pa.array([7, 7, 7, 8, 8, 9], pa.int64())
    days = np.array(
        [day(d) for d in ("2017-01-01", "2017-03-31", "2017-04-01", "2017-01-15", "2016-12-31", "2017-05-01")]
    )
    total, quarters = mr.last_four_quarters(ciks, days, eps)
    # 2017 Q1 days: 2016 Q1..Q4 = 4.00; 2017 Q2: 2016 Q2..2017 Q1 = 5.50; company 8 in 2017 Q1: one quarter;
    # company 8 in 2016 Q4: none before; company 9: no Financial at all
    assert total.tolist() == [400, 400, 550, 40, 0, 0]
    assert quarters.tolist() == [4, 4, 4, 1, 0, 0]


def test_rounding_of_pe_and_yield_is_half_up_in_cents():
    # close 10.00 / EPS 3.00 = 3.333.. -> 3.33; close 10.00 / EPS 0.08 = 125.00; -10.01 / 4.00 = -2.5025 -> -2.50
    assert mr.ao.divide_round_half_up(np.array([1000, 1000, -1001]) * 100, np.array([300, 8, 400])).tolist() == [
        333,
        12500,
        -250,
    ]


def test_only_slices_that_differ_from_the_stored_ones_are_committed():
    stored = ms.Slices.of(np.array([3, 1, 2]), np.array([30, 10, 20]), np.array([-3, -1, -2]))
    fresh = ms.Slices.of(np.array([1, 2, 3, 4]), np.array([10, 21, 30, 40]), np.array([-1, -2, -9, -4]))
    changed = fresh.differing_from(stored)
    assert changed.keys.tolist() == [2, 3, 4]  # 2: a new high; 3: a new low; 4: not stored
    assert changed.highs.tolist() == [21, 30, 40]
    assert changed.lows.tolist() == [-2, -9, -4]
    assert len(fresh.differing_from(ms.Slices.empty())) == 4
