"""Type raw text fields of staged records with Arrow's C++ kernels: the one implementation of the field rules.

Delimited lines (`jobs.delimited`), FINWIRE records (`jobs.finwire`), CustomerMgmt.xml actions
(`jobs.customer_mgmt`) and the generator's audit figures (`jobs.audit_figures`) all arrive as columns of text, one
value per record, and are typed here, column by column, in the driver:
- an integer is `[+-]digits` within its type's range;
- a decimal is `[+-]digits[.digits]` (or `.digits`), rounded half up to its scale, and must fit its precision
  after rounding;
- a double is a decimal with an optional exponent (`[eE][+-]digits`), the nearest float64 (no NaN, no infinity
  spelled out);
- a date or timestamp has exactly its declared pattern (`DATETIME_PATTERNS`) and is a real calendar value;
  timestamps are UTC;
- a boolean is `true`/`false`/`1`/`0` in any case; a time is `HH:mm:ss`; text is kept as written;
- nothing is trimmed: a value with a space or a line terminator around it does not have its type's shape.

A value is typed by one vectorized cast of its column. Where no byte of the column could make Arrow's cast take a
text outside its type's shape (an `x` of a hexadecimal integer, an `e` of a decimal's exponent; nothing for
`yyyy-MM-dd`), the column is cast whole and its shapes are matched only if that fails (`_cast_shaped`). Arrow's
casts reject the whole column when one value does not convert (an overflow, a decimal with more digits than its
scale, 30 February), so a failed cast is retried on halves until the values that fail are cornered in runs of at
most 64 (`_cast`); in those runs each value is cast alone, and a value the cast still rejects goes through its
type's rule (`_after_cast`: a leading '+' of an integer, a decimal with more digits than its scale). Clean data
costs one cast per column; a column where every value needs the rule (e.g. prices with three decimals for a scale
of two) costs about 20 us a value.

`Problems` gathers what is wrong with each record, in column order, into the `reason` text of a rejected record.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Column, decimal_precision

INTEGER_SHAPE = r"^[+-]?[0-9]+$"
DECIMAL_SHAPE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
DOUBLE_SHAPE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"
TIME_SHAPE = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$"
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}


@dataclass(frozen=True)
class DatetimePattern:
    """A date or timestamp pattern of the source files (Spark's notation, as declared in `schemas`): the shape
    of a valid text, and the (start, length) pieces of the text that make its ISO form, joined by `separators`
    (no pieces: the text already is ISO)."""

    shape: str
    pieces: tuple[tuple[int, int], ...] = ()
    separators: tuple[str, ...] = ()


DATETIME_PATTERNS = {
    "yyyy-MM-dd": DatetimePattern(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
    "yyyy-MM-dd HH:mm:ss": DatetimePattern(r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$"),
    "yyyy-MM-dd'T'HH:mm:ss": DatetimePattern(
        r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}$", ((0, 10), (11, 8)), (" ",)
    ),
    "yyyyMMdd": DatetimePattern(r"^[0-9]{8}$", ((0, 4), (4, 2), (6, 2)), ("-", "-")),
    "yyyyMMdd-HHmmss": DatetimePattern(
        r"^[0-9]{8}-[0-9]{6}$", ((0, 4), (4, 2), (6, 2), (9, 2), (11, 2), (13, 2)), ("-", "-", " ", ":", ":")
    ),
}
DEFAULT_PATTERNS = {"date": "yyyy-MM-dd", "timestamp": "yyyy-MM-dd HH:mm:ss"}


@dataclass(frozen=True)
class Typed:
    """A column's typed values (NULL where absent or invalid) and where a present value is invalid."""

    values: pa.Array
    invalid: pa.Array  # boolean, never NULL


def check_supported(columns: tuple[Column, ...], where: str) -> None:
    """Raises ValueError for a declared column this module cannot type (`where` names the source)."""
    for col in columns:
        if col.type in DEFAULT_PATTERNS and _pattern(col) not in DATETIME_PATTERNS:
            raise ValueError(f"{where}.{col.name}: no parser for {col.type} pattern {col.fmt}")
        if col.type not in ("string", "int", "bigint", "double", "boolean", "time", *DEFAULT_PATTERNS) and not (
            decimal_precision(col.type)
        ):
            raise ValueError(f"{where}.{col.name}: no parser for type {col.type}")


def typed(raw: pa.Array, present: pa.Array, col: Column) -> Typed:
    """Typed values of declared column `col` from a column of raw texts (`present`: not empty)."""
    logical = col.type
    if logical == "string":
        return Typed(pc.if_else(present, raw, pa.scalar(None, raw.type)), pc.and_(present, False))
    if logical == "boolean":
        lowered = pc.utf8_lower(raw)
        value = pc.if_else(
            pc.is_in(lowered, pa.array(["true", "1"])),
            True,
            pc.if_else(pc.is_in(lowered, pa.array(["false", "0"])), False, pa.scalar(None, pa.bool_())),
        )
        return Typed(value, pc.and_(present, pc.is_null(value)))
    if logical == "time":
        shaped = pc.match_substring_regex(raw, TIME_SHAPE)
        return Typed(pc.if_else(shaped, raw, pa.scalar(None, raw.type)), pc.and_(present, pc.invert(shaped)))
    if logical in _INT_RANGE:
        kind = pa.int32() if logical == "int" else pa.int64()
        return _cast_shaped(raw, raw, present, INTEGER_SHAPE, kind, _integer(kind), screen=b"x")
    if logical == "double":
        return _cast_shaped(raw, raw, present, DOUBLE_SHAPE, pa.float64(), _invalid)
    if logical in DEFAULT_PATTERNS:
        pattern = DATETIME_PATTERNS[_pattern(col)]
        iso = _iso(raw, pattern)
        if logical == "date":
            screen = b"" if not pattern.pieces else None  # the cast takes exactly yyyy-MM-dd
            return _cast_shaped(raw, iso, present, pattern.shape, pa.date32(), _invalid, screen=screen)
        value = _cast_shaped(raw, iso, present, pattern.shape, pa.timestamp("us"), _invalid)
        return Typed(value.values.cast(pa.timestamp("us", tz="UTC")), value.invalid)  # the text is UTC
    precision, scale = decimal_precision(logical)
    kind = pa.decimal128(precision, scale)
    return _cast_shaped(raw, raw, present, DECIMAL_SHAPE, kind, _decimal(precision, scale), screen=b"e")


class Problems:
    """What is wrong with each record, in the order found: `reason()` is '' for a good record, else the problems
    joined by '; '. Texts are only built for columns that have a bad value."""

    def __init__(self, length: int):
        self._length = length
        self._kind = pa.large_string()
        self._parts: list[pa.Array] = []

    def add(self, bad: pa.Array, text: str | tuple[pa.Array | str, ...]) -> None:
        """`text` (one text, or the parts of one per record, texts and columns, that `join` concatenates) is a
        problem of the records where `bad` is true. It must not be NULL there: a NULL would make the record's whole
        reason NULL. Parts are joined only when a record is bad: clean data builds no text (on SF 3's Trade.txt the
        texts were about a quarter of the typing)."""
        if not pc.any(bad).as_py():
            return
        text = pa.scalar(text, self._kind) if isinstance(text, str) else join(*text)
        part = pc.binary_join_element_wise(pa.scalar("; ", self._kind), text, pa.scalar("", self._kind))
        self._parts.append(pc.if_else(bad, part, pa.scalar("", self._kind)))

    def add_typed(self, col: Column, raw: pa.Array, present: pa.Array, value: Typed) -> None:
        """The problems of one typed column: '<name>: required value is empty' for an empty required value, else
        "<name>: '<text>' is not a valid <type>" for a present value that does not type."""
        if not col.nullable:
            self.add(pc.invert(present), f"{col.name}: required value is empty")
        self.add(value.invalid, (f"{col.name}: '", raw, f"' is not a valid {col.type}"))

    def reason(self) -> pa.Array:
        if not self._parts:
            return pa.repeat(pa.scalar("", self._kind), self._length)
        # '; a; b' -> 'a; b' (Arrow's join that skips NULLs drops the records whose values are all NULL, so the
        # parts are '' rather than NULL where fine)
        return pc.utf8_slice_codeunits(pc.binary_join_element_wise(*self._parts, pa.scalar("", self._kind)), 2)


def type_column(problems: Problems, raw: pa.Array, present: pa.Array, col: Column) -> pa.Array:
    """The typed values of declared column `col` from its raw texts; its problems go to `problems`."""
    value = typed(raw, present, col)
    problems.add_typed(col, raw, present, value)
    return value.values


def line_reason(
    line: pa.Array, right_width: pa.Array, problems: Problems, wrong_width: tuple[pa.Array | str, ...]
) -> pa.Array:
    """A line's reason: 'empty line', else `wrong_width` (parts `join` concatenates, only when some line has the
    wrong width) for a line of the wrong width, else its problems."""
    reason = problems.reason()
    if not pc.all(right_width).as_py():
        reason = pc.if_else(right_width, reason, join(*wrong_width))
    return pc.if_else(pc.equal(line, ""), pa.scalar("empty line", pa.large_string()), reason)


def checked_lines(lines: pa.Table, line: pa.Array, values: dict[str, pa.Array], reason: pa.Array) -> pa.Table:
    """`line_no`, `line`, the other columns of `lines` (passed through), `values` in their order, `reason`."""
    out = lines.drop_columns(["line"]).add_column(1, "line", line)
    for name, column in values.items():
        out = out.append_column(name, column)
    return out.append_column("reason", reason)


def split_checked(checked: pa.Table, columns: list[str]) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` of `checked_lines` output: staged has `columns`, `line_no` and the passed-through
    columns; rejected has `line_no`, `line`, `reason` and the passed-through columns."""
    passthrough = [c for c in checked.column_names if c not in {"line_no", "line", "reason", *columns}]
    good = pc.equal(checked["reason"], "")
    staged = checked.filter(good).select([*columns, "line_no", *passthrough])
    return staged, checked.filter(pc.invert(good)).select(["line_no", "line", "reason", *passthrough])


def join(*parts: pa.Array | str) -> pa.Array:
    """Texts and columns of text concatenated per record (large strings)."""
    kind = pa.large_string()
    values = [pa.scalar(p, kind) if isinstance(p, str) else p.cast(kind) for p in parts]
    return pc.binary_join_element_wise(*values, pa.scalar("", kind))


def _pattern(col: Column) -> str:
    return col.fmt or DEFAULT_PATTERNS[col.type]


def _iso(raw: pa.Array, pattern: DatetimePattern) -> pa.Array:
    if not pattern.pieces:
        return raw
    pieces = [pc.utf8_slice_codeunits(raw, start, start + length) for start, length in pattern.pieces]
    parts = [pieces[0]]
    for separator, piece in zip(pattern.separators, pieces[1:], strict=True):
        parts += [separator, piece]
    return join(*parts)


def _cast_shaped(
    raw: pa.Array,
    text: pa.Array,
    present: pa.Array,
    shape: str,
    to: pa.DataType,
    rule: Callable[[str], object],
    *,
    screen: bytes | None = None,
) -> Typed:
    """`text` (`raw` or its ISO form) cast to `to` where `raw` has `shape` (`rule` converts a text the cast
    rejects, or gives None); `invalid` where a present text has another shape or does not convert.

    `screen`: the letters (either case) outside `shape` that Arrow's cast takes (an integer in hexadecimal, `0x1F`; a
    decimal with an exponent, `1.5E+2`; nothing for `yyyy-MM-dd`). When no byte of `raw` is one of them, every text
    the cast takes has the shape, so the column is cast whole first, and its shapes are matched (a regular expression
    per value, ~10x the byte scan) only when that cast fails."""
    if screen is not None and not _has_letters(raw, screen):
        whole = _cast_present(text, present, to)
        if whole is not None:
            return Typed(whole, pc.and_(present, False))
    shaped = pc.match_substring_regex(raw, shape)
    values = _cast(text if pc.all(shaped).as_py() else pc.if_else(shaped, text, pa.scalar(None, text.type)), to, rule)
    return Typed(values, pc.and_(present, pc.is_null(values)))


def _has_letters(raw: pa.Array, letters: bytes) -> bool:
    """Whether a byte of `raw`'s data (or of the buffer around it) is one of the ASCII `letters`, in either case."""
    data = raw.buffers()[-1]
    if not letters or data is None:
        return False
    folded = np.frombuffer(data, np.uint8) | 0x20  # 'X' -> 'x'; no other byte folds onto a lower-case letter
    return any(bool(np.any(folded == letter)) for letter in letters.lower())


def _cast_present(text: pa.Array, present: pa.Array, to: pa.DataType) -> pa.Array | None:
    """The present values of `text` cast to `to` in one cast (absent ones NULL), or None when some value does not
    convert."""
    if not pc.all(present).as_py():
        text = pc.if_else(present, text, pa.scalar(None, text.type))
    try:
        return text.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


_ONE_BY_ONE = 64  # a failed cast of at most this many texts casts them one by one instead of halving


def _cast(texts: pa.Array, to: pa.DataType, rule: Callable[[str], object]) -> pa.Array:
    """`texts` cast to `to`; where Arrow rejects the cast, halves are retried until `_ONE_BY_ONE` texts or fewer are
    left, and those are cast one by one, a text the cast rejects going through `rule`."""
    try:
        return texts.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(texts) > _ONE_BY_ONE:
            half = len(texts) // 2
            return pa.concat_arrays([_cast(texts.slice(0, half), to, rule), _cast(texts.slice(half), to, rule)])
        return pa.concat_arrays([_cast_one(texts.slice(i, 1), to, rule) for i in range(len(texts))])


def _cast_one(text: pa.Array, to: pa.DataType, rule: Callable[[str], object]) -> pa.Array:
    try:
        return text.cast(to)  # the same cast as the column's, so a value types alike whatever its neighbours
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([rule(text[0].as_py())], to)


def _invalid(_text: str) -> None:
    return None


def _integer(kind: pa.DataType) -> Callable[[str], int | None]:
    """Arrow's integer cast rejects a leading '+' (Spark's took it) and a value out of range."""

    def rule(text: str) -> int | None:
        if not text.startswith("+"):
            return None  # out of range
        try:
            return pa.array([text[1:]], pa.large_string()).cast(kind)[0].as_py()
        except pa.ArrowInvalid:
            return None

    return rule


def _decimal(precision: int, scale: int) -> Callable[[str], decimal.Decimal | None]:
    """Arrow's decimal cast rejects more digits than the scale; Spark's rounded them half up."""
    step, limit = decimal.Decimal(1).scaleb(-scale), decimal.Decimal(10) ** (precision - scale)

    def rule(text: str) -> decimal.Decimal | None:
        with decimal.localcontext(prec=precision + len(text) + 1):
            value = decimal.Decimal(text).quantize(step, rounding=decimal.ROUND_HALF_UP)
            return value if abs(value) < limit else None

    return rule
