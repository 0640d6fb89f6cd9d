"""The packed multi-key sort (`streamdi.row_order`) gives exactly Arrow's stable permutation."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streamdi import row_order


def arrow_order(data: pa.Table, keys: list[str], nulls_first: bool) -> np.ndarray:
    placement = "at_start" if nulls_first else "at_end"
    order = pc.sort_indices(data, sort_keys=[(k, "ascending", placement) for k in keys])
    return np.asarray(order, dtype=np.int64)


def with_nulls(values: list, rng: np.random.Generator, share: float) -> list:
    return [None if rng.random() < share else v for v in values]


def random_table(seed: int, n: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    share = [0.0, 0.1, 0.6][seed % 3]
    symbols = ["", "A", "AB", "B", "a", "é", "Ab", "zz", "A\x00"]
    day = dt.date(2015, 1, 1)
    return pa.table(
        {
            "small": pa.array(with_nulls(rng.integers(-3, 4, n).tolist(), rng, share), pa.int32()),
            "symbol": pa.array(with_nulls(rng.choice(symbols, n).tolist(), rng, share), pa.string()),
            "huge": pa.array(with_nulls(rng.integers(-(2**61), 2**61, n).tolist(), rng, share), pa.int64()),
            "day": pa.array(
                with_nulls([day + dt.timedelta(days=int(d)) for d in rng.integers(0, 5, n)], rng, share), pa.date32()
            ),
            "at": pa.array(
                with_nulls([dt.datetime(2015, 1, 1, 0, 0, int(s)) for s in rng.integers(0, 3, n)], rng, share),
                pa.timestamp("us"),
            ),
            "flag": pa.array(with_nulls(rng.integers(0, 2, n).astype(bool).tolist(), rng, share), pa.bool_()),
            "unsigned": pa.array(rng.integers(0, 3, n), pa.uint8()),
            "line": pa.array(np.arange(n) % 7, pa.int64()),
        }
    )


KEY_SETS = [
    ["small"],
    ["symbol"],
    ["small", "symbol"],
    ["symbol", "small", "day", "at", "flag"],
    ["huge", "small"],  # the first key alone fills the 64 bits: two packed groups
    ["small", "huge", "symbol", "unsigned"],
    ["at", "day", "unsigned", "line"],
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keys", KEY_SETS, ids="-".join)
@pytest.mark.parametrize("nulls_first", [True, False])
def test_same_permutation_as_arrow(seed: int, keys: list[str], nulls_first: bool) -> None:
    data = random_table(seed, 400)
    order = row_order.packed_order(data, keys, nulls_first=nulls_first)
    assert order is not None
    assert np.array_equal(order, arrow_order(data, keys, nulls_first))


def test_columns_in_several_chunks() -> None:
    data = pa.concat_tables([random_table(1, 150), random_table(2, 90), random_table(3, 0), random_table(4, 60)])
    assert data["symbol"].num_chunks > 1
    keys = ["symbol", "day", "small"]
    assert np.array_equal(row_order.packed_order(data, keys, nulls_first=True), arrow_order(data, keys, True))


def test_a_small_case_written_out() -> None:
    data = pa.table(
        {
            "cust": pa.array([2, 1, 2, None, 1, 2], pa.int64()),
            "symb": pa.array(["B", "B", "A", "A", None, "A"]),
        }
    )
    # NULLs first: (None, A) then (1, None), (1, B), then 2's A rows in their input order, then (2, B)
    assert row_order.packed_order(data, ["cust", "symb"], nulls_first=True).tolist() == [3, 4, 1, 2, 5, 0]
    assert row_order.packed_order(data, ["cust", "symb"], nulls_first=False).tolist() == [1, 4, 2, 5, 0, 3]


def test_a_unique_first_key_decides_alone() -> None:
    data = pa.table({"agency": ["c", "a", "b"], "other": [1.5, 2.5, 0.5]})  # floats have no codes here
    assert row_order.packed_order(data, ["agency", "other"], nulls_first=True).tolist() == [1, 2, 0]


def test_other_types_keep_arrows_sort() -> None:
    data = pa.table({"price": pa.array([2.5, None, 1.0, float("nan")] * 10_000), "n": np.arange(40_000) % 3})
    assert row_order.packed_order(data, ["price", "n"], nulls_first=True) is None
    order = row_order.sort_indices(data, ["price", "n"], nulls_first=True)
    assert np.array_equal(np.asarray(order, dtype=np.int64), arrow_order(data, ["price", "n"], True))


def test_large_tables_take_the_packed_sort() -> None:
    data = pa.concat_tables([random_table(seed, 5_000) for seed in range(6)])
    assert data.num_rows >= row_order.MIN_ROWS
    keys = ["symbol", "small", "at"]
    order = row_order.sort_indices(data, keys, nulls_first=False)
    assert isinstance(order, np.ndarray)
    assert np.array_equal(order, arrow_order(data, keys, False))
    assert row_order.sorted_by(data, keys, nulls_first=False).equals(data.take(arrow_order(data, keys, False)))


def test_keys_without_codes_after_a_prefix_that_tells_rows_apart() -> None:
    n = 30_000
    data = pa.table(
        {
            "symbol": pa.array([f"S{i % 50:03d}" for i in range(n)]),
            "day": pa.array(np.arange(n)[::-1] // 50, pa.int64()),
            "close": pa.array(np.linspace(1, 2, n), pa.float64()),
        }
    )
    keys = ["symbol", "day", "close"]
    order = row_order.packed_order(data, keys, nulls_first=True)
    assert order is not None  # (symbol, day) is unique: the prices never decide
    assert np.array_equal(order, arrow_order(data, keys, True))
    tied = data.set_column(1, "day", pa.array(np.zeros(n, np.int64)))
    assert row_order.packed_order(tied, keys, nulls_first=True) is None  # the prices decide: Arrow's sort
    assert np.array_equal(row_order.sort_indices(tied, keys, nulls_first=True), arrow_order(tied, keys, True))


def test_columns_of_nulls_only() -> None:
    data = pa.table({"s": pa.nulls(5, pa.string()), "i": pa.nulls(5, pa.int64()), "n": [3, 1, 2, 1, 0]})
    for nulls_first in (True, False):
        order = row_order.packed_order(data, ["s", "i", "n"], nulls_first=nulls_first)
        assert order.tolist() == [4, 1, 3, 2, 0]


def head_in_order(data: pa.Table, keys: list[str], head: int, nulls_first: bool) -> pa.Table:
    """`data` with its first `head` rows sorted (as a MERGE's rows kept from files written in order)."""
    first = data.slice(0, head)
    return pa.concat_tables([first.take(arrow_order(first, keys, nulls_first)), data.slice(head)])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("keys", KEY_SETS, ids="-".join)
@pytest.mark.parametrize("nulls_first", [True, False])
@pytest.mark.parametrize("head", [2, 150, 399, 400])
def test_rows_placed_among_rows_in_order_as_arrow_sorts_them(
    seed: int, keys: list[str], nulls_first: bool, head: int
) -> None:
    data = head_in_order(random_table(seed, 400), keys, head, nulls_first)
    order = row_order.merged_order(data, keys, head, nulls_first=nulls_first)
    assert np.array_equal(order, arrow_order(data, keys, nulls_first))


def test_a_placement_written_out() -> None:
    # the first four rows are in order; equal keys keep the earlier row first, so (1, "B") goes after the one there
    data = pa.table({"cust": [1, 1, 2, 4, 1, 3, 0, 2], "symb": ["A", "B", "A", "A", "B", "A", "Z", "A"]})
    order = row_order.merged_order(data, ["cust", "symb"], 4, nulls_first=True)
    assert order.tolist() == [6, 0, 1, 4, 2, 7, 5, 3]


@pytest.mark.parametrize("keys", [["small", "symbol"], ["huge", "small"], ["at", "day", "unsigned", "line"]])
def test_a_first_part_out_of_order_is_sorted_whole(keys: list[str]) -> None:
    data = random_table(7, 400)  # its first rows are not in order
    assert np.array_equal(row_order.merged_order(data, keys, 300, nulls_first=False), arrow_order(data, keys, False))


def test_large_tables_with_rows_in_order_first() -> None:
    keys = ["at", "symbol", "small"]
    data = head_in_order(pa.concat_tables([random_table(seed, 5_000) for seed in range(6)]), keys, 29_000, False)
    order = row_order.sort_indices(data, keys, nulls_first=False, sorted_rows=29_000)
    assert np.array_equal(order, arrow_order(data, keys, False))


def test_many_rows_tied_on_the_first_packed_key_are_sorted_whole() -> None:
    keys = ["huge", "small"]  # two packed groups; a few values of "huge" only, so every new row ties
    data = random_table(3, 2_000).set_column(2, "huge", pa.array(np.arange(2_000) % 3 * 2**61, pa.int64()))
    data = head_in_order(data, keys, 1_000, False)
    assert np.array_equal(row_order.merged_order(data, keys, 1_000, nulls_first=False), arrow_order(data, keys, False))
