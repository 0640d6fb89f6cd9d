"""`literal_frame`: small frames built in the JVM from literals, typed as declared, empty or not."""

from __future__ import annotations

import datetime as dt

import pytest

from streamdi.spark import literal_frame

pytestmark = pytest.mark.integration


def test_rows_come_back_typed_and_in_order(spark):
    rows = [(2, dt.date(2017, 7, 8), "b"), (1, None, "a")]
    frame = literal_frame(spark, rows, "batch int, day date, label string")
    assert frame.dtypes == [("batch", "int"), ("day", "date"), ("label", "string")]
    assert [tuple(r) for r in frame.collect()] == rows


def test_no_rows_give_an_empty_frame_with_the_columns(spark):
    frame = literal_frame(spark, [], "batch int, day date")
    assert frame.dtypes == [("batch", "int"), ("day", "date")]
    assert frame.count() == 0


def test_a_row_of_the_wrong_width_is_refused(spark):
    with pytest.raises(ValueError):
        literal_frame(spark, [(1, 2)], "batch int")
