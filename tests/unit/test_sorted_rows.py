"""`streamdi.lake.sorted_rows`, the order every write is put in: rows already in order come back as they are."""

from __future__ import annotations

import pyarrow as pa

from streamdi.lake import sorted_rows


def rows(batch, files, lines):
    return pa.table({"batch_id": batch, "source_file": files, "line_no": lines, "v": list(range(len(lines)))})


ORDER = ("batch_id", "source_file", "line_no")


def test_rows_already_in_order_are_returned_without_a_copy():
    data = rows([1, 1, 1, 2], ["a", "a", "b", "a"], [1, 2, 1, 1])
    assert sorted_rows(data, ORDER) is data
    equal_keys = rows([1, 1], ["a", "a"], [3, 3])  # ties stand in order too
    assert sorted_rows(equal_keys, ORDER) is equal_keys
    assert sorted_rows(data, ()) is data


def test_rows_out_of_order_are_sorted_stably_with_nulls_last():
    data = rows([2, 1, 1, 1, 1], ["a", "b", None, "a", "b"], [1, 1, 9, 2, 1])
    out = sorted_rows(data, ORDER)
    assert out.select(["batch_id", "source_file", "line_no"]).to_pylist() == [
        {"batch_id": 1, "source_file": "a", "line_no": 2},
        {"batch_id": 1, "source_file": "b", "line_no": 1},
        {"batch_id": 1, "source_file": "b", "line_no": 1},
        {"batch_id": 1, "source_file": None, "line_no": 9},
        {"batch_id": 2, "source_file": "a", "line_no": 1},
    ]
    assert out["v"].to_pylist() == [3, 1, 4, 2, 0]  # equal keys keep their order


def test_rows_out_of_order_on_a_later_column_only_where_the_earlier_ones_tie_are_sorted():
    data = rows([1, 1, 2, 2], ["b", "a", "a", "a"], [1, 1, 2, 1])  # batch 1: files b, a; batch 2: lines 2, 1
    out = sorted_rows(data, ORDER)
    assert out["v"].to_pylist() == [1, 0, 3, 2]
    in_order = rows([1, 2, 2, 3], ["z", "a", "b", "a"], [9, 5, 1, 0])  # later columns descend only across a step
    assert sorted_rows(in_order, ORDER) is in_order
    chunked = pa.concat_tables([in_order.slice(0, 2), in_order.slice(2)])
    assert sorted_rows(chunked, ORDER) is chunked
    assert sorted_rows(pa.concat_tables([in_order.slice(2), in_order.slice(0, 2)]), ORDER)["v"].to_pylist() == [
        0,
        1,
        2,
        3,
    ]
