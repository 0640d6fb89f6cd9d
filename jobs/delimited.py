"""Parse delimited source lines (pipe- or comma-separated) into typed rows, with Arrow's C++ kernels.

A delimited file is already split into numbered lines in the driver (`jobs.landing.numbered_lines`); the fields
are split here and typed by `jobs.fields`, column by column, without a round trip through the JVM (measured on
SF 3's Batch1: see `bench/README.md`). A line is bad when it is empty, has the wrong number of fields, has a
value that is not of its declared type, leaves a required field empty, or has an action code outside its set
(`ACTION_CODES`); its `reason` then names every problem, in column order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv

from jobs import fields
from schemas.model import SourceFile

# Codes that say how a line is applied (TPC-DI 2.2.2): CDC_FLAG of every incremental file (I insert, U update) and
# W_ACTION of WatchHistory (ACTV adds a watch, CNCL removes it). A line with another code cannot be applied (the
# watch transform would take any other action for a removal), so it is rejected like a value that is not of its
# type. Other coded values are checked by the staging suites (`expectations/staging/`).
ACTION_CODES: dict[str, tuple[str, ...]] = {"cdc_flag": ("I", "U"), "w_action": ("ACTV", "CNCL")}
_BOM = b"\xef\xbb\xbf"  # Arrow's CSV reader would drop it; the line path keeps it in the first field
_CSV_BLOCK = 16 << 20  # bytes the CSV reader takes at a time, at most (a longer line is left to the line path)


def check_lines(lines: pa.Table, source: SourceFile) -> pa.Table:
    """Split and type `lines` of `source`: `line_no`, `line`, the other columns of `lines` (lineage, passed
    through), the declared columns and `reason` ('' for a good line).

    `lines` has `line_no` and `line` (the raw text, line ending removed). Typed values of a bad line are
    NULL or partial; only `reason` is meant to be read for it.
    """
    fields.check_supported(source.columns, source.name)
    expected = len(source.columns)
    line = lines["line"].combine_chunks().cast(pa.large_string())
    split = pc.split_pattern(line, source.delimiter)
    count = pc.list_value_length(split)
    right_width = pc.equal(count, expected)
    if not pc.all(right_width).as_py():
        # A line of the wrong width is checked as if it were a line of empty fields: its reason is its width.
        filler = pa.scalar(source.delimiter * (expected - 1), line.type)
        split = pc.split_pattern(pc.if_else(right_width, line, filler), source.delimiter)
    values, problems = _typed(source, [pc.list_element(split, i) for i in range(expected)])
    wrong_width = (f"expected {expected} fields, found ", count.cast(pa.string()))
    return fields.checked_lines(lines, line, values, fields.line_reason(line, right_width, problems, wrong_width))


def split_whole(data: bytes, source: SourceFile) -> list[pa.Array] | None:
    """The raw text of each declared column of a file's lines (or of a piece of them that starts a line), split by
    Arrow's CSV reader (no quoting, no escapes: a field is the text between two delimiters), when every line is
    UTF-8 and has the declared number of fields, and the last one ends with a line ending (LF or CRLF); None
    otherwise, and for a file with a byte order mark, a carriage return that ends no line, a line of empty fields
    (maybe an empty line), a multi-character delimiter or a single column: `check_lines` then finds each line's
    reason. The reader holds no Python lock; the one pass here that does is counting the line feeds.

    SF 10's DailyMarket.txt (4.17 M lines) is split so in ~1 s, where splitting it into lines and then into fields
    took ~3.8 s (bench/README.md, a twenty-fifth session)."""
    names = [f"c{i}" for i in range(len(source.columns))]
    if len(names) < 2 or len(source.delimiter) != 1 or not data.endswith(b"\n") or data.startswith(_BOM):
        return None
    try:
        table = csv.read_csv(
            pa.py_buffer(data),
            read_options=csv.ReadOptions(
                column_names=names, use_threads=False, block_size=min(_CSV_BLOCK, len(data) + 1)
            ),
            parse_options=csv.ParseOptions(
                delimiter=source.delimiter,
                quote_char=False,
                escape_char=False,
                double_quote=False,
                newlines_in_values=False,
                ignore_empty_lines=False,  # an empty line is read as a line of empty fields
            ),
            convert_options=csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.large_string()),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=True,
            ),
        )
    except pa.ArrowInvalid:  # a line of another width, not UTF-8, longer than a block
        return None
    if table.num_rows != data.count(b"\n"):  # a carriage return alone ended a line for the reader
        return None
    raws = [table[name].combine_chunks() for name in names]
    if pc.any(pc.and_(pc.equal(raws[0], ""), pc.equal(raws[1], ""))).as_py():
        return None  # an empty line reads like a line of only delimiters: the line path tells them apart
    return raws


def check_split(lines: pa.Table, raws: list[pa.Array], source: SourceFile) -> pa.Table:
    """`check_lines` of lines already split into their declared columns (`split_whole`): `lines` has `line_no` and
    the lineage columns, one row per line. Every line has the declared width; the `line` text is built (the fields
    joined by the delimiter, as the line was written) only for a bad line, '' for a good one."""
    fields.check_supported(source.columns, source.name)
    values, problems = _typed(source, raws)
    reason = problems.reason()
    bad = pc.not_equal(reason, "")
    if pc.any(bad).as_py():
        joined = pc.binary_join_element_wise(*raws, pa.scalar(source.delimiter, pa.large_string()))
        line = pc.if_else(bad, joined, pa.scalar("", pa.large_string()))
    else:
        line = pa.repeat(pa.scalar("", pa.large_string()), lines.num_rows)
    return fields.checked_lines(lines.append_column("line", line), line, values, reason)


def _typed(source: SourceFile, raws: list[pa.Array]) -> tuple[dict[str, pa.Array], fields.Problems]:
    """Each declared column typed from its raw texts, and the problems found, in column order."""
    problems = fields.Problems(len(raws[0]) if raws else 0)
    values = {}
    for col, raw in zip(source.columns, raws, strict=True):
        present = pc.not_equal(raw, "")
        values[col.name] = fields.type_column(problems, raw, present, col)
        codes = ACTION_CODES.get(col.name)
        if codes is not None:
            unknown = pc.and_(present, pc.invert(pc.is_in(raw, pa.array(codes, raw.type))))
            problems.add(unknown, (f"{col.name}: '", raw, f"' is not one of {', '.join(codes)}"))
    return values, problems


def parse_delimited(lines: pa.Table, source: SourceFile) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` lines of one source: `staged` has the declared columns, `line_no` and the other
    columns of `lines`; `rejected` has `line_no`, `line`, `reason` and the other columns. Every input line is in
    exactly one of the two."""
    return fields.split_checked(check_lines(lines, source), [c.name for c in source.columns])
