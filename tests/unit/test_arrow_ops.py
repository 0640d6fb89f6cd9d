"""The key-set helpers and `changes_against` of jobs.arrow_ops on hand-written values."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa

from jobs import arrow_ops as ao


def test_distinct_sorts_and_drops_repeats_wherever_they_are():
    keys = np.array([5, 5, 5, 1, 1, 9, 5, 1, -3, 9, 9], np.int64)
    assert ao.distinct(keys).tolist() == [-3, 1, 5, 9]
    assert ao.distinct(np.array([], np.int64)).tolist() == []
    assert ao.distinct(np.array([7], np.int64)).tolist() == [7]


def test_union_and_member():
    assert ao.union(np.array([4, 2, 2]), np.array([3, 4, 10])).tolist() == [2, 3, 4, 10]
    assert ao.member(np.array([1, 2, 3, 11, -1]), np.array([2, 3, 10])).tolist() == [False, True, True, False, False]
    assert ao.member(np.array([1, 2]), np.array([], np.int64)).tolist() == [False, False]


SCHEMA = pa.schema(
    [
        pa.field("owner", pa.int64(), False),
        pa.field("day", pa.int32(), False),
        pa.field("cash", pa.decimal128(15, 2)),
        pa.field("note", pa.large_string()),
    ]
)


def rows(*values: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, v, strict=True)) for v in values], schema=SCHEMA)


def test_changes_against_keeps_new_and_changed_rows_and_lists_the_vanished_keys():
    stored = rows(
        (1, 10, Decimal("5.00"), "a"),  # unchanged
        (1, 11, Decimal("6.00"), None),  # unchanged, NULL equals NULL
        (1, 12, Decimal("7.00"), "b"),  # cash changes
        (2, 10, Decimal("1.00"), None),  # NULL becomes a value
        (2, 11, Decimal("2.00"), "x"),  # gone
        (3, 10, Decimal("3.00"), "y"),  # gone
    )
    recomputed = rows(
        (1, 12, Decimal("7.50"), "b"),
        (1, 10, Decimal("5.00"), "a"),
        (2, 10, Decimal("1.00"), "now"),
        (1, 11, Decimal("6.00"), None),
        (4, 10, Decimal("0.00"), None),  # new
    )

    upserts, gone = ao.changes_against(recomputed, stored, ["owner", "day"])

    assert (
        upserts.to_pylist()
        == rows(
            (1, 12, Decimal("7.50"), "b"), (2, 10, Decimal("1.00"), "now"), (4, 10, Decimal("0.00"), None)
        ).to_pylist()
    )
    assert gone.to_pylist() == [{"owner": 2, "day": 11}, {"owner": 3, "day": 10}]


def test_changes_against_nothing_stored_or_nothing_recomputed():
    recomputed = rows((1, 10, Decimal("5.00"), "a"))
    upserts, gone = ao.changes_against(recomputed, SCHEMA.empty_table(), ["owner", "day"])
    assert upserts.to_pylist() == recomputed.to_pylist()
    assert gone.num_rows == 0
    upserts, gone = ao.changes_against(SCHEMA.empty_table(), recomputed, ["owner", "day"])
    assert upserts.num_rows == 0
    assert gone.to_pylist() == [{"owner": 1, "day": 10}]
