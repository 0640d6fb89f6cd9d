"""FINWIRE record layouts (TPC-DI 1.1.0, clause 2.2.2.8), declared once for the generator and the parser.

A FINWIRE file (`FINWIRE<YYYY>Q<q>`, Batch1 only) holds fixed-width lines of three record types, told apart by
characters 16-18: CMP (company), SEC (security) and FIN (quarterly financials). Positions are 1-based and
inclusive, as in the specification. Text is left-aligned and right-padded with spaces; numbers are
right-aligned and left-padded with spaces. The last field of SEC and FIN is a company name (60 characters,
padded) or a 10-digit CIK, so those lines are 60 or 10 characters longer or shorter: the official files do
not pad a CIK to 60 (SEC lines are 220 or 170 characters, FIN lines 246 or 196, CMP lines always 543).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.model import Column, check_logical_type

POSTED_FORMAT = "%Y%m%d-%H%M%S"  # characters 1-15 of every record
DATE_FORMAT = "%Y%m%d"  # every date field inside a record
POSTED_PATTERN = "yyyyMMdd-HHmmss"  # POSTED_FORMAT as a Spark datetime pattern (the parser)
DATE_PATTERN = "yyyyMMdd"  # DATE_FORMAT as a Spark datetime pattern

# What the parser derives from the last field of SEC and FIN ("company name or CIK"): a short line (see
# `FixedWidthRecord.widths`) holds a 10-digit CIK, a full-width line a company name. The raw field stays too.
CIK_OR_NAME: tuple[Column, ...] = (
    Column("cik", "string", doc="the issuing company's 10-digit CIK, when the record refers to it by CIK"),
    Column("company_name", "string", doc="the issuing company's name, when the record refers to it by name"),
)


@dataclass(frozen=True)
class FixedWidthField:
    """One field: 1-based inclusive `start`..`end`; `align` is `left` for text, `right` for numbers.

    `nullable=False` marks a field the parser requires (an all-blank value rejects the line)."""

    name: str
    start: int
    end: int
    type: str = "string"
    nullable: bool = True

    def __post_init__(self) -> None:
        check_logical_type(self.type)
        if not 1 <= self.start <= self.end:
            raise ValueError(f"{self.name}: bad positions {self.start}-{self.end}")

    @property
    def width(self) -> int:
        return self.end - self.start + 1

    @property
    def align(self) -> str:
        return "left" if self.type in ("string", "date") else "right"

    @property
    def slice(self) -> slice:
        """The Python slice of a line that holds this field."""
        return slice(self.start - 1, self.end)

    @property
    def column(self) -> Column:
        """The field as a staging column (dates and timestamps carry their Spark text pattern)."""
        fmt = {"timestamp": POSTED_PATTERN, "date": DATE_PATTERN}.get(self.type)
        return Column(self.name, self.type, self.nullable, fmt=fmt)


@dataclass(frozen=True)
class FixedWidthRecord:
    """A record type: its code (characters 16-18) and its fields in line order, contiguous from position 1."""

    rec_type: str
    fields: tuple[FixedWidthField, ...]
    short_last_field: int | None = None  # width of the last field when it holds a CIK instead of a name

    def __post_init__(self) -> None:
        position = 1
        for f in self.fields:
            if f.start != position:
                raise ValueError(f"{self.rec_type}.{f.name} starts at {f.start}, expected {position}")
            position = f.end + 1

    @property
    def width(self) -> int:
        """Characters in a full line (without the line ending)."""
        return self.fields[-1].end

    @property
    def widths(self) -> tuple[int, ...]:
        """Line widths that occur: the full width and, for SEC/FIN, the width with a CIK as the last field."""
        if self.short_last_field is None:
            return (self.width,)
        return (self.width - self.fields[-1].width + self.short_last_field, self.width)

    @property
    def columns(self) -> tuple[Column, ...]:
        """The staged columns: every field, plus `CIK_OR_NAME` for records whose last field may be a CIK."""
        derived = CIK_OR_NAME if self.short_last_field is not None else ()
        return (*(f.column for f in self.fields), *derived)

    def field(self, name: str) -> FixedWidthField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.rec_type} has no field {name!r}")

    def split(self, line: str) -> dict[str, str]:
        """The raw text of every field of one line, surrounding spaces removed (empty = NULL)."""
        return {f.name: line[f.slice].strip() for f in self.fields}


_HEAD = (
    FixedWidthField("pts", 1, 15, "timestamp", nullable=False),
    FixedWidthField("rec_type", 16, 18, nullable=False),
)

CMP = FixedWidthRecord(
    "CMP",
    (
        *_HEAD,
        FixedWidthField("company_name", 19, 78, nullable=False),
        FixedWidthField("cik", 79, 88, nullable=False),
        FixedWidthField("status", 89, 92, nullable=False),
        FixedWidthField("industry_id", 93, 94),
        FixedWidthField("sp_rating", 95, 98),
        FixedWidthField("founding_date", 99, 106, "date"),
        FixedWidthField("addr_line1", 107, 186),
        FixedWidthField("addr_line2", 187, 266),
        FixedWidthField("postal_code", 267, 278),
        FixedWidthField("city", 279, 303),
        FixedWidthField("state_province", 304, 323),
        FixedWidthField("country", 324, 347),
        FixedWidthField("ceo_name", 348, 393),
        FixedWidthField("description", 394, 543),
    ),
)

SEC = FixedWidthRecord(
    "SEC",
    (
        *_HEAD,
        FixedWidthField("symbol", 19, 33, nullable=False),
        FixedWidthField("issue_type", 34, 39),
        FixedWidthField("status", 40, 43, nullable=False),
        FixedWidthField("name", 44, 113),
        FixedWidthField("ex_id", 114, 119),
        FixedWidthField("sh_out", 120, 132, "bigint"),
        FixedWidthField("first_trade_date", 133, 140, "date"),
        FixedWidthField("first_trade_exchg", 141, 148, "date"),
        FixedWidthField("dividend", 149, 160, "decimal(10,2)"),
        FixedWidthField("co_name_or_cik", 161, 220, nullable=False),
    ),
    short_last_field=10,
)

FIN = FixedWidthRecord(
    "FIN",
    (
        *_HEAD,
        FixedWidthField("year", 19, 22, "int", nullable=False),
        FixedWidthField("quarter", 23, 23, "int", nullable=False),
        FixedWidthField("qtr_start_date", 24, 31, "date"),
        FixedWidthField("posting_date", 32, 39, "date"),
        FixedWidthField("revenue", 40, 56, "decimal(15,2)"),
        FixedWidthField("earnings", 57, 73, "decimal(15,2)"),
        FixedWidthField("eps", 74, 85, "decimal(10,2)"),
        FixedWidthField("diluted_eps", 86, 97, "decimal(10,2)"),
        FixedWidthField("margin", 98, 109, "decimal(10,2)"),
        FixedWidthField("inventory", 110, 126, "decimal(15,2)"),
        FixedWidthField("assets", 127, 143, "decimal(15,2)"),
        FixedWidthField("liabilities", 144, 160, "decimal(15,2)"),
        FixedWidthField("sh_out", 161, 173, "bigint"),
        FixedWidthField("diluted_sh_out", 174, 186, "bigint"),
        FixedWidthField("co_name_or_cik", 187, 246, nullable=False),
    ),
    short_last_field=10,
)

RECORDS: dict[str, FixedWidthRecord] = {r.rec_type: r for r in (CMP, SEC, FIN)}
FINWIRE_PATTERN = "FINWIRE[0-9][0-9][0-9][0-9]Q[1-4]*"


def record_type(line: str) -> str:
    """The record type code of a FINWIRE line (characters 16-18)."""
    return line[15:18]
