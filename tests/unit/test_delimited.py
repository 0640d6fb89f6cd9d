"""Delimited lines: every good line typed exactly, every bad line rejected with each of its problems."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from builders import source_line

from jobs.delimited import check_lines, parse_delimited, split_whole
from jobs.stage_parse import parse_file
from schemas import sources as src
from schemas.model import Column, SourceFile
from streamdi.batchlog import BatchFile

UTC = dt.UTC

# One optional column of each declared type: a value either types or is rejected, alone on its line.
EVERY_TYPE = SourceFile(
    name="EveryType",
    pattern="EveryType*.txt",
    delimiter="|",
    columns=(
        Column("i", "int"),
        Column("b", "bigint"),
        Column("d", "decimal(6,2)"),
        Column("day", "date", fmt="yyyy-MM-dd"),
        Column("ts", "timestamp", fmt="yyyy-MM-dd HH:mm:ss"),
        Column("flag", "boolean"),
        Column("t", "time"),
        Column("s", "string"),
    ),
)
NAMES = [c.name for c in EVERY_TYPE.columns]


def lines(*texts: str, **extra: pa.Array) -> pa.Table:
    table = pa.table(
        {"line_no": pa.array(range(1, len(texts) + 1), pa.int64()), "line": pa.array(texts, pa.large_string())}
    )
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table


def one_value(column: str, text: str, via: str = "lines") -> tuple[object, str]:
    """(typed value, reason) of a line whose only non-empty field is `column` = `text`, checked as a numbered line
    (`via` "lines") or as a file's bytes ("file": `parse_file`, split whole when it can be)."""
    fields = ["" if name != column else text for name in NAMES]
    if via == "file":
        staged, rejected = file_rows(["|".join(fields)], EVERY_TYPE)
        return (staged[0][column], "") if staged else (None, rejected[0]["reason"])
    row = check_lines(lines("|".join(fields)), EVERY_TYPE).to_pylist()[0]
    return row[column], row["reason"]


def file_rows(texts: list[str], source: SourceFile, ending: str = "\n") -> tuple[list[dict], list[dict]]:
    """(staged, rejected) rows of a file of `texts`, each line ended by `ending`, through `parse_file`."""
    data = "".join(t + ending for t in texts).encode()
    staged, rejected, read = parse_file(data, BatchFile(1, 1, "f.txt", len(data), "x", None, 1), source, 1)
    assert read == len(texts)
    return staged.to_pylist(), rejected.to_pylist()


@pytest.mark.parametrize(
    ("column", "text", "expected"),
    [
        ("i", "42", 42),
        ("i", "+42", 42),
        ("i", "-0", 0),
        ("i", "007", 7),
        ("i", "2147483647", 2147483647),
        ("i", "-2147483648", -2147483648),
        ("i", "2147483648", None),
        ("i", "-2147483649", None),
        ("i", "4.0", None),
        ("i", " 4", None),
        ("i", "4\r", None),  # a stray carriage return inside a line is not a line ending
        ("i", "1e3", None),
        ("i", "0x1F", None),  # Arrow's cast takes hexadecimal
        ("b", "0X1F", None),
        ("b", "9223372036854775807", 9223372036854775807),
        ("b", "9223372036854775808", None),
        ("d", "1234.5", Decimal("1234.50")),
        ("d", ".5", Decimal("0.50")),
        ("d", "5.", Decimal("5.00")),
        ("d", "+1.25", Decimal("1.25")),
        ("d", "-1.25", Decimal("-1.25")),
        ("d", "1.005", Decimal("1.01")),  # rounded half up to the scale
        ("d", "-1.005", Decimal("-1.01")),
        ("d", "1.0049", Decimal("1.00")),
        ("d", "9999.994", Decimal("9999.99")),
        ("d", "9999.995", None),  # rounds to 10000.00, more digits than decimal(6,2) holds
        ("d", "10000", None),
        ("d", "1e2", None),
        ("d", "1.5E+2", None),  # Arrow's cast takes an exponent
        ("d", "-", None),
        ("day", "2012-02-29", dt.date(2012, 2, 29)),
        ("day", "2013-02-29", None),
        ("day", "2012-13-01", None),
        ("day", "2012-1-05", None),
        ("day", "2012-01-05 ", None),
        ("day", "20120105", None),
        ("day", "+2012-01-05", None),
        ("day", "2012-01-05T00:00:00", None),
        ("ts", "2012-01-05 23:59:59", dt.datetime(2012, 1, 5, 23, 59, 59, tzinfo=UTC)),
        ("ts", "2012-02-30 10:00:00", None),
        ("ts", "2012-01-05 24:00:00", None),
        ("ts", "2012-01-05 23:59:60", None),
        ("ts", "2012-01-05T10:11:12", None),
        ("ts", "2012-01-05 10:11:12.5", None),
        ("ts", "2012-01-05 10:11", None),
        ("flag", "true", True),
        ("flag", "TRUE", True),
        ("flag", "1", True),
        ("flag", "False", False),
        ("flag", "0", False),
        ("flag", "yes", None),
        ("t", "09:30:00", "09:30:00"),
        ("t", "23:59:59", "23:59:59"),
        ("t", "24:00:00", None),
        ("t", "9:30:00", None),
        ("s", " kept as written ", " kept as written "),
    ],
)
@pytest.mark.parametrize("via", ["lines", "file"])
def test_each_type_takes_exactly_its_values(column: str, text: str, expected: object, via: str):
    value, reason = one_value(column, text, via)
    assert value == expected
    declared = EVERY_TYPE.columns[NAMES.index(column)].type
    assert reason == ("" if expected is not None else f"{column}: '{text}' is not a valid {declared}")


def test_a_value_that_does_not_convert_is_found_among_many_good_ones():
    """Arrow's cast fails a whole column on one value; the bad value, and only it, is rejected."""
    texts = [f"{n}|{n}|{n}.25|2012-01-{n % 28 + 1:02d}||||" for n in range(1000)]
    texts[617] = "2147483648|1|1.25|2012-01-01||||"  # int overflow
    texts[618] = "1|1|1.255|2012-01-01||||"  # rounded: stays good
    texts[901] = "1|1|1.25|2012-02-30||||"  # no such day
    rows = check_lines(lines(*texts), EVERY_TYPE).to_pylist()
    bad = {r["line_no"]: r["reason"] for r in rows if r["reason"]}
    assert bad == {
        618: "i: '2147483648' is not a valid int",
        902: "day: '2012-02-30' is not a valid date",
    }
    staged, rejected = file_rows(texts, EVERY_TYPE, "\r\n")  # the file split whole, as the generator writes it
    assert {r["line_no"]: (r["reason"], r["line"]) for r in rejected} == {
        618: ("i: '2147483648' is not a valid int", texts[617]),
        902: ("day: '2012-02-30' is not a valid date", texts[901]),
    }
    assert [r["line_no"] for r in staged] == [n for n in range(1, 1001) if n not in (618, 902)]
    assert (staged[617]["line_no"], staged[617]["d"]) == (619, Decimal("1.26"))
    assert staged[-1]["day"] == dt.date(2012, 1, 999 % 28 + 1)
    assert [r["i"] for r in rows[:3]] == [0, 1, 2]
    assert rows[618]["d"] == Decimal("1.26")
    assert rows[999]["day"] == dt.date(2012, 1, 999 % 28 + 1)


def test_parse_keeps_good_lines_and_explains_bad_ones():
    staged, rejected = parse_delimited(
        lines(
            source_line(src.TAX_RATE, tx_id="US1", tx_rate="0.15000"),
            "US2|only two fields",
            source_line(src.TAX_RATE, tx_id="US3", tx_rate="abc"),
            source_line(src.TAX_RATE, tx_id="US4", tx_name=""),
            "",
            source_line(src.TAX_RATE, tx_id="US6", tx_rate="12.5"),  # overflows decimal(6,5)
            "US7|a|b|c",
            source_line(src.TAX_RATE, tx_id="", tx_name="", tx_rate="x"),
        ),
        src.TAX_RATE,
    )
    assert staged.to_pylist() == [
        {"tx_id": "US1", "tx_name": "Bracket one", "tx_rate": Decimal("0.15000"), "line_no": 1}
    ]
    assert [(r["line_no"], r["reason"]) for r in rejected.to_pylist()] == [
        (2, "expected 3 fields, found 2"),
        (3, "tx_rate: 'abc' is not a valid decimal(6,5)"),
        (4, "tx_name: required value is empty"),
        (5, "empty line"),
        (6, "tx_rate: '12.5' is not a valid decimal(6,5)"),
        (7, "expected 3 fields, found 4"),
        (
            8,
            "tx_id: required value is empty; tx_name: required value is empty; "
            "tx_rate: 'x' is not a valid decimal(6,5)",
        ),
    ]
    assert rejected["line"].to_pylist()[:2] == [
        "US2|only two fields",
        source_line(src.TAX_RATE, tx_id="US3", tx_rate="abc"),
    ]


@pytest.mark.parametrize(
    ("texts", "ending", "whole"),
    [
        (["1|a|0.5", "2|b|0.25"], "\n", True),
        (["1|a|0.5", "2|b|0.25"], "\r\n", True),
        (['1|"a|b"|0.5'], "\n", False),  # no quoting: four fields
        (["1|a|0.5", "", "2|b|0.25"], "\n", False),  # an empty line
        (["", "1|a|0.5"], "\r\n", False),
        (["1|a|0.5", "||"], "\n", False),  # only delimiters: read like an empty line
        (["1|a|0.5", "2|b"], "\n", False),  # a line of another width
        (["1|a\r|0.5"], "\n", False),  # a carriage return inside a line
        (["\ufeff1|a|0.5"], "\n", False),  # a byte order mark
    ],
)
def test_a_file_is_split_whole_only_when_every_line_has_the_declared_width(texts, ending, whole):
    data = "".join(t + ending for t in texts).encode()
    split = split_whole(data, src.TAX_RATE)
    assert (split is not None) == whole
    if whole:
        assert [c.to_pylist() for c in split] == [["1", "2"], ["a", "b"], ["0.5", "0.25"]]
    assert split_whole(b"1|a|0.5\n2|b|0.25", src.TAX_RATE) is None  # the last line without its line ending
    assert split_whole(b"1|\xff|0.5\n", src.TAX_RATE) is None  # not UTF-8
    assert split_whole(b"20170704\n", src.BATCH_DATE) is None  # one column: an empty line would be a value


def test_a_file_split_whole_or_line_by_line_gives_the_same_rows_and_reasons():
    """The file of `test_parse_keeps_good_lines_and_explains_bad_ones` goes line by line (some lines have another
    width); without those lines it is split whole: the rows and reasons are the ones each line gets alone."""
    texts = [
        source_line(src.TAX_RATE, tx_id="US1", tx_rate="0.15000"),
        source_line(src.TAX_RATE, tx_id="US3", tx_rate="abc"),
        source_line(src.TAX_RATE, tx_id="US4", tx_name=""),
        source_line(src.TAX_RATE, tx_id="US6", tx_rate="12.5"),
        source_line(src.TAX_RATE, tx_id='"US7"', tx_name='a "quoted" name'),
        source_line(src.TAX_RATE, tx_id="", tx_rate="x"),
    ]
    assert split_whole("".join(t + "\n" for t in texts).encode(), src.TAX_RATE) is not None
    odd = [
        (7, "US2|only two fields", "expected 3 fields, found 2"),
        (8, "", "empty line"),
        (9, "||", "tx_id: required value is empty; tx_name: required value is empty; tx_rate: required value is empty"),
    ]
    for with_odd_lines in (False, True):
        more = ["US2|only two fields", "", "||"] if with_odd_lines else []
        staged, rejected = file_rows([*texts, *more], src.TAX_RATE)
        assert [(r["line_no"], r["tx_id"], r["batch_id"], r["source_file"]) for r in staged] == [
            (1, "US1", 1, "f.txt"),
            (5, '"US7"', 1, "f.txt"),
        ]
        assert [(r["line_no"], r["line"], r["reason"]) for r in rejected] == [
            (2, texts[1], "tx_rate: 'abc' is not a valid decimal(6,5)"),
            (3, texts[2], "tx_name: required value is empty"),
            (4, texts[3], "tx_rate: '12.5' is not a valid decimal(6,5)"),
            (6, texts[5], "tx_id: required value is empty; tx_rate: 'x' is not a valid decimal(6,5)"),
            *(odd if with_odd_lines else []),
        ]


def test_parse_types_every_declared_field():
    staged, rejected = parse_delimited(lines(source_line(src.DATE_FILE)), src.DATE_FILE)
    assert rejected.num_rows == 0
    row = staged.to_pylist()[0]
    assert (row["sk_dateid"], row["datevalue"], row["dayofweeknum"], row["holidayflag"]) == (
        20170704,
        dt.date(2017, 7, 4),
        2,
        True,
    )
    staged, rejected = parse_delimited(lines(source_line(src.TIME_FILE)), src.TIME_FILE)
    row = staged.to_pylist()[0]
    assert (row["sk_timeid"], row["timevalue"], row["markethoursflag"], rejected.num_rows) == (
        93000,
        "09:30:00",
        True,
        0,
    )


def test_bad_date_bad_boolean_and_bad_int_are_rejected():
    staged, rejected = parse_delimited(
        lines(
            source_line(src.DATE_FILE, datevalue="2017-13-01"),
            source_line(src.DATE_FILE, holidayflag="maybe"),
            source_line(src.DATE_FILE, sk_dateid="2017x"),
        ),
        src.DATE_FILE,
    )
    assert staged.num_rows == 0
    assert [(r["line_no"], r["reason"]) for r in rejected.to_pylist()] == [
        (1, "datevalue: '2017-13-01' is not a valid date"),
        (2, "holidayflag: 'maybe' is not a valid boolean"),
        (3, "sk_dateid: '2017x' is not a valid int"),
    ]


def test_lineage_columns_pass_through_and_comma_files_split_on_commas():
    files = pa.array(["a.csv", "b.csv"], pa.large_string())
    staged, rejected = parse_delimited(lines("1|x", "7,2,Ann,Lee,,314,,,", source_file=files), src.HR)
    assert [(r["employeeid"], r["employeejobcode"], r["employeemi"], r["source_file"]) for r in staged.to_pylist()] == [
        (7, 314, None, "b.csv")
    ]
    assert [(r["line_no"], r["reason"], r["source_file"]) for r in rejected.to_pylist()] == [
        (1, "expected 9 fields, found 1", "a.csv")
    ]


def test_no_lines_give_empty_tables():
    staged, rejected = parse_delimited(lines(), src.TRADE)
    assert (staged.num_rows, rejected.num_rows) == (0, 0)
    assert staged.column_names == [*[c.name for c in src.TRADE.columns], "line_no"]


def test_a_type_or_format_without_a_parser_is_refused():
    # Every declared logical type has a parser (double since the audit's figures are typed here); patterns not all.
    for column in (Column("x", "timestamp", fmt="dd/MM/yyyy HH:mm"), Column("x", "date", fmt="dd/MM/yyyy")):
        source = SourceFile(name="Odd", pattern="Odd*.txt", delimiter="|", columns=(column,))
        with pytest.raises(ValueError, match="Odd.x: no parser for"):
            check_lines(lines("1"), source)
