"""Parse delimited source lines (pipe- or comma-separated) into typed rows, with Arrow's C++ kernels.

A delimited file is already split into numbered lines in the driver (`jobs.stage.numbered_lines`); the fields
are split, checked and typed here, column by column, without a round trip through the JVM (measured on SF 3's
Batch1: see `bench/README.md`). The rules are those of every other source (`jobs.stage`):
- a line is bad when it is empty, has the wrong number of fields, has a value that is not of its declared
  type, or leaves a required field empty; its `reason` then names every problem, in column order;
- an integer is `[+-]digits` within its type's range; a decimal is `[+-]digits[.digits]` (or `.digits`),
  rounded half up to its scale, and must fit its precision after rounding; a date is `yyyy-MM-dd`, a timestamp
  `yyyy-MM-dd HH:mm:ss` (UTC), both real calendar values; a boolean is `true`/`false`/`1`/`0` in any case; a
  time is `HH:mm:ss`; text is kept as written.

A value is typed by one vectorized cast of its column. Arrow's casts reject the whole column when one value
does not convert (an overflow, a decimal with more digits than its scale, 30 February), so a failed cast is
retried on halves until the values that fail are found one by one (`_cast`); only those go through the
per-value rule. Clean data costs one cast per column.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Column as Declared
from schemas.model import SourceFile, decimal_precision

# Shapes of valid texts, also used by the Spark parsers of the fixed-width and XML sources (`jobs.stage`).
INTEGER_SHAPE = r"^[+-]?[0-9]+$"
DECIMAL_SHAPE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
TIME_SHAPE = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$"
_DATE_SHAPE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIMESTAMP_SHAPE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$"
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
_ISO_FORMATS = {"date": "yyyy-MM-dd", "timestamp": "yyyy-MM-dd HH:mm:ss"}


@dataclass(frozen=True)
class _Typed:
    """A column's typed values (NULL where absent or invalid) and where a present value is invalid."""

    values: pa.Array
    invalid: pa.Array  # boolean, never NULL


def check_lines(lines: pa.Table, source: SourceFile) -> pa.Table:
    """Split and type `lines` of `source`: `line_no`, `line`, the other columns of `lines` (lineage, passed
    through), the declared columns and `reason` ('' for a good line).

    `lines` has `line_no` and `line` (the raw text, line ending removed). Typed values of a bad line are
    NULL or partial; only `reason` is meant to be read for it.
    """
    _check_supported(source)
    expected = len(source.columns)
    line = lines["line"].combine_chunks()
    count = pc.list_value_length(pc.split_pattern(line, source.delimiter))
    right_width = pc.equal(count, expected)
    # A line of the wrong width is checked as if it were a line of empty fields: its reason is its width.
    filler = pa.scalar(source.delimiter * (expected - 1), line.type)
    fields = pc.split_pattern(pc.if_else(right_width, line, filler), source.delimiter)
    problems, typed = [], []
    for i, col in enumerate(source.columns):
        raw = pc.list_element(fields, i)
        present = pc.not_equal(raw, "")
        value = _typed(raw, present, col.type)
        typed.append(value.values)
        problem = _problem(col, raw, present, value.invalid)
        if problem is not None:
            problems.append(problem)
    # Each problem is '; text' or '' (Arrow's join that skips NULLs drops rows whose values are all NULL).
    reasons = pa.scalar("", line.type)
    if problems:
        reasons = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*problems, pa.scalar("", line.type)), 2)
    width_text = pc.binary_join_element_wise(
        *_texts(line.type, f"expected {expected} fields, found "), pc.cast(count, line.type), *_texts(line.type, "", "")
    )
    reason = pc.if_else(
        pc.equal(line, ""), pa.scalar("empty line", line.type), pc.if_else(right_width, reasons, width_text)
    )
    out = lines.drop_columns(["line"]).add_column(1, "line", line)
    for col, values in zip(source.columns, typed, strict=True):
        out = out.append_column(col.name, values)
    return out.append_column("reason", reason)


def parse_delimited(lines: pa.Table, source: SourceFile) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` lines of one source: `staged` has the declared columns, `line_no` and the other
    columns of `lines`; `rejected` has `line_no`, `line`, `reason` and the other columns. Every input line is in
    exactly one of the two."""
    checked = check_lines(lines, source)
    good = pc.equal(checked["reason"], "")
    passthrough = [c for c in lines.column_names if c not in ("line_no", "line")]
    staged = checked.filter(good).select([*[c.name for c in source.columns], "line_no", *passthrough])
    rejected = checked.filter(pc.invert(good)).select(["line_no", "line", "reason", *passthrough])
    return staged, rejected


def _check_supported(source: SourceFile) -> None:
    for col in source.columns:
        if col.type in _ISO_FORMATS and col.fmt not in (None, _ISO_FORMATS[col.type]):
            raise ValueError(f"{source.name}.{col.name}: no delimited parser for {col.type} format {col.fmt}")
        if col.type not in ("string", "int", "bigint", "boolean", "time", *_ISO_FORMATS) and not decimal_precision(
            col.type
        ):
            raise ValueError(f"{source.name}.{col.name}: no delimited parser for type {col.type}")


def _problem(col: Declared, raw: pa.Array, present: pa.Array, invalid: pa.Array) -> pa.Array | None:
    """'; ' and the problem text of each line for column `col` ('' where the value is fine); None when the value
    of every line is fine."""
    missing = pc.invert(present) if not col.nullable else None
    bad = invalid if missing is None else pc.or_(invalid, missing)
    if not pc.any(bad).as_py():
        return None
    prefix, suffix, empty = _texts(raw.type, f"; {col.name}: '", f"' is not a valid {col.type}", "")
    text = pc.binary_join_element_wise(prefix, raw, suffix, empty)
    if missing is not None:
        text = pc.if_else(missing, pa.scalar(f"; {col.name}: required value is empty", raw.type), text)
    return pc.if_else(bad, text, empty)


def _texts(kind: pa.DataType, *texts: str) -> list[pa.Scalar]:
    return [pa.scalar(t, kind) for t in texts]


def _typed(raw: pa.Array, present: pa.Array, logical: str) -> _Typed:
    """Typed values of one column of raw texts (`present`: not empty)."""
    if logical == "string":
        return _Typed(pc.if_else(present, raw, pa.scalar(None, raw.type)), pc.and_(present, False))
    if logical == "boolean":
        lowered = pc.utf8_lower(raw)
        value = pc.if_else(
            pc.is_in(lowered, pa.array(["true", "1"])),
            True,
            pc.if_else(pc.is_in(lowered, pa.array(["false", "0"])), False, pa.scalar(None, pa.bool_())),
        )
        return _Typed(value, pc.and_(present, pc.is_null(value)))
    if logical == "time":
        shaped = pc.match_substring_regex(raw, TIME_SHAPE)
        return _Typed(pc.if_else(shaped, raw, pa.scalar(None, raw.type)), pc.and_(present, pc.invert(shaped)))
    if logical in _INT_RANGE:
        kind = pa.int32() if logical == "int" else pa.int64()
        return _cast_shaped(raw, present, INTEGER_SHAPE, kind, _integer(logical))
    if logical == "date":
        return _cast_shaped(raw, present, _DATE_SHAPE, pa.date32(), _date)
    if logical == "timestamp":
        value = _cast_shaped(raw, present, _TIMESTAMP_SHAPE, pa.timestamp("us"), _timestamp)
        return _Typed(value.values.cast(pa.timestamp("us", tz="UTC")), value.invalid)  # the text is UTC
    precision, scale = decimal_precision(logical)
    return _cast_shaped(raw, present, DECIMAL_SHAPE, pa.decimal128(precision, scale), _decimal(precision, scale))


def _cast_shaped(
    raw: pa.Array, present: pa.Array, shape: str, to: pa.DataType, one: Callable[[str], object | None]
) -> _Typed:
    """Values of the texts that have `shape`, cast to `to` (`one` converts a text the cast rejects, or gives
    None); `invalid` where a present text has another shape or does not convert."""
    shaped = pc.match_substring_regex(raw, shape)
    values = _cast(pc.if_else(shaped, raw, pa.scalar(None, raw.type)), to, one)
    return _Typed(values, pc.and_(present, pc.is_null(values)))


def _cast(texts: pa.Array, to: pa.DataType, one: Callable[[str], object | None]) -> pa.Array:
    """`texts` cast to `to`; where Arrow rejects the cast, halves are retried until single texts are left, and
    those go through `one`."""
    try:
        return texts.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(texts) > 1:
            half = len(texts) // 2
            return pa.concat_arrays([_cast(texts.slice(0, half), to, one), _cast(texts.slice(half), to, one)])
        return pa.array([one(texts[0].as_py())], to)


def _integer(logical: str) -> Callable[[str], int | None]:
    low, high = _INT_RANGE[logical]

    def one(text: str) -> int | None:
        value = int(text)  # the shape is checked: digits with an optional sign ('+' is not Arrow's)
        return value if low <= value <= high else None

    return one


def _decimal(precision: int, scale: int) -> Callable[[str], decimal.Decimal | None]:
    step, limit = decimal.Decimal(1).scaleb(-scale), decimal.Decimal(10) ** (precision - scale)

    def one(text: str) -> decimal.Decimal | None:
        with decimal.localcontext(prec=precision + len(text)):
            value = decimal.Decimal(text).quantize(step, rounding=decimal.ROUND_HALF_UP)
        return value if abs(value) < limit else None

    return one


def _date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _timestamp(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None
