"""Field typing: each declared pattern takes exactly its shape and real calendar values (UTC); a value types
alike whatever its neighbours; bad values are rejected, never fatal."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from jobs.customer_mgmt import check_actions
from jobs.fields import DATETIME_PATTERNS, Problems, typed
from schemas.model import Column
from schemas.sources import CUSTOMER_MGMT_ACTION, CUSTOMER_MGMT_XML

UTC = dt.UTC


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [
        ("yyyy-MM-dd", "2012-02-29", dt.date(2012, 2, 29)),
        ("yyyy-MM-dd", "2013-02-29", None),
        ("yyyy-MM-dd", "2012-1-05", None),
        ("yyyy-MM-dd", "2012-01-05 ", None),
        ("yyyy-MM-dd", "2012-01-05T00:00", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 23:59:59", dt.datetime(2012, 1, 5, 23, 59, 59, tzinfo=UTC)),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 24:00:00", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 10:11:12.5", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05T10:11:12", None),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-01-05T10:11:12", dt.datetime(2012, 1, 5, 10, 11, 12, tzinfo=UTC)),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-01-05 10:11:12", None),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-02-30T10:11:12", None),
        ("yyyyMMdd", "20120229", dt.date(2012, 2, 29)),
        ("yyyyMMdd", "20121301", None),
        ("yyyyMMdd", "2012015", None),
        ("yyyyMMdd-HHmmss", "20120105-101112", dt.datetime(2012, 1, 5, 10, 11, 12, tzinfo=UTC)),
        ("yyyyMMdd-HHmmss", "20120105-106012", None),
        ("yyyyMMdd-HHmmss", "20120105 101112", None),
    ],
)
def test_datetime_fields_parse_exactly_their_pattern(fmt: str, text: str, expected: object):
    logical = "timestamp" if "HH" in fmt else "date"
    value = typed(pa.array([text], pa.large_string()), pa.array([True]), Column("x", logical, fmt=fmt))
    assert (value.values.to_pylist(), value.invalid.to_pylist()) == ([expected], [expected is None])


def test_every_pattern_is_tested():
    assert set(DATETIME_PATTERNS) == {
        "yyyy-MM-dd",
        "yyyy-MM-dd HH:mm:ss",
        "yyyy-MM-dd'T'HH:mm:ss",
        "yyyyMMdd",
        "yyyyMMdd-HHmmss",
    }


def test_problems_are_joined_in_the_order_found_and_empty_for_a_good_record():
    problems = Problems(3)
    problems.add(pa.array([True, False, False]), "first")
    problems.add(pa.array([False, False, False]), "never")
    problems.add(pa.array([True, False, True]), ("<", pa.array(["a", "b", "c"], pa.large_string()), ">"))
    assert problems.reason().to_pylist() == ["first; <a>", "", "<c>"]
    assert Problems(2).reason().to_pylist() == ["", ""]


def test_a_problem_text_is_built_only_when_a_record_has_the_problem():
    """Per-record texts come as parts joined only for a bad record; a column no record fails builds nothing, so a
    part that cannot be joined at all (a list here) is never touched."""
    problems = Problems(2)
    problems.add(pa.array([False, False]), ("x: '", pa.array([[1], [2]]), "' is bad"))
    assert problems.reason().to_pylist() == ["", ""]


def test_a_column_the_cast_rejects_everywhere_is_typed_value_by_value():
    texts = [f"{n}.{n % 10}05" for n in range(1000)]  # three decimals for a scale of two: each one is rounded
    value = typed(pa.array(texts, pa.large_string()), pa.array([True] * 1000), Column("d", "decimal(8,2)"))
    assert value.values.to_pylist()[:3] == [Decimal("0.01"), Decimal("1.11"), Decimal("2.21")]
    assert value.values.to_pylist()[999] == Decimal("999.91")
    assert value.invalid.to_pylist() == [False] * 1000


@pytest.mark.parametrize(
    ("column", "text"),
    [
        (Column("day", "date"), "0000-01-01"),  # Arrow's cast takes year 0, Python's date does not
        (Column("i", "int"), "+5"),
        (Column("d", "decimal(38,2)"), "9" * 36 + ".99"),
        (Column("d", "decimal(38,2)"), "1.005"),
    ],
)
def test_a_value_types_alike_alone_or_next_to_a_value_the_cast_rejects(column: Column, text: str):
    """A bad neighbour sends a run of values through the one-by-one path; it must give what the column cast gives."""
    bad = {"date": "2012-02-30", "int": "2147483648", "decimal(38,2)": "1" * 37}[column.type]
    alone = typed(pa.array([text], pa.large_string()), pa.array([True]), column)
    beside = typed(pa.array([text, bad], pa.large_string()), pa.array([True, True]), column)
    assert beside.values.slice(0, 1).equals(alone.values)
    assert (alone.invalid.to_pylist(), beside.invalid.to_pylist()) == ([False], [False, True])


def test_huge_numbers_are_rejected_not_fatal():
    value = typed(pa.array(["1" * 5000, "+" + "1" * 5000], pa.large_string()), pa.array([True] * 2), Column("i", "int"))
    assert value.invalid.to_pylist() == [True, True]
    value = typed(pa.array(["9" * 36 + ".995"], pa.large_string()), pa.array([True]), Column("d", "decimal(38,2)"))
    assert value.invalid.to_pylist() == [True]  # rounds to 39 digits


def test_an_xml_value_with_a_line_terminator_is_rejected():
    """CustomerMgmt.xml values are typed like any other: `<CA_B_ID>7\\n</CA_B_ID>` is not a bigint (Spark's cast
    used to trim it)."""
    names = [f.name for f in (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)]
    row = dict.fromkeys(names) | {"action_type": "NEW", "action_ts": "2007-07-07T10:00:00", "c_id": "1"}
    raw = pa.table(
        {
            "action_seq": pa.array([1, 2], pa.int64()),
            **{n: pa.array([row[n], row[n]], pa.large_string()) for n in names},
            "_accounts": pa.array([1, 1], pa.int32()),
            "_corrupt": pa.array([None, None], pa.large_string()),
            "_as_read": pa.array(["{}", "{}"], pa.large_string()),
        }
    ).set_column(names.index("ca_b_id") + 1, "ca_b_id", pa.array(["7", "7\n"], pa.large_string()))
    checked = check_actions(raw).to_pylist()
    assert [(r["ca_b_id"], r["reason"]) for r in checked] == [(7, ""), (None, "ca_b_id: '7\n' is not a valid bigint")]


def test_doubles_parse_decimal_and_exponent_forms_only():
    texts = ["1.5", "-2e3", "+.25", "7.", "1E-2", "nan", "inf", "1_000", "1.2.3", "e5", "\u0661", "0x10"]
    got = typed(pa.array(texts), pa.array([True] * len(texts)), Column("d", "double"))
    assert got.values.to_pylist() == [1.5, -2000.0, 0.25, 7.0, 0.01, None, None, None, None, None, None, None]
    assert got.invalid.to_pylist() == [False] * 5 + [True] * 7
