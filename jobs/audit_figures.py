"""Audit figures: parse the generator's `*_audit.csv` files and stage them into `staging.audit_figures`.

The TPC-DI generator writes, next to every source file, the counts the automated audit (TPC-DI 1.1.0 audit script
`tpcdi_audit.sql`) compares the warehouse with: `BatchK/<Source>_audit.csv`, plus `BatchK_audit.csv`
(the batch's FirstDay/LastDay) and `Generator_audit.csv` at the data set root. Files are tiny (a few lines), so
they are parsed in Python, not Spark.

Format (`schemas.audit`): a header `DataSet, BatchID ,Date , Attribute , Value, DValue` -- the official files
put spaces around the names, so names are compared without surrounding spaces and case -- then one figure per
line; fields are trimmed, an empty field is NULL; CRLF or LF line endings; a UTF-8 byte order mark is ignored.
The fields are typed by the one field implementation (`jobs.fields`) from their declarations
(`schemas.audit.FIGURE_FIELDS`), as the staging parsers type theirs: BatchID (int) and Value (bigint) are
integers within their type's range, Date a real `yyyy-MM-dd` day, DValue a decimal number, maybe with an exponent.
Decisions where the format is silent:
- a blank line is skipped (not a figure, not an error);
- a line that does not parse (wrong number of fields, BatchID or Value not an integer, Date not `YYYY-MM-DD`,
  DValue not a number, empty DataSet/Attribute) is a reject with the reason; a file whose header is not the
  audit header rejects all its lines. `stage` sends rejects to `staging.rejects` (source `Audit`), so lines
  read = figures staged + lines rejected; `read_dir` raises on them (it reads a data set for the audit, where
  a bad figure must not pass silently).
- The same audit file delivered again (same TPC-DI batch and file name, e.g. a redelivery under another folder)
  must not count twice: `staged_figures` keeps, per (TPC-DI batch, file name), the delivery staged last.

Entries: `stage(ctx, batch_id, files)` (called by the stage job for a micro-batch's audit files; one append
with app transaction `stage/audit_figures`), `staged_figures(ctx)` and `read_dir(data_dir)`; the audit
(`jobs.audit.figures`) reads data set directories with `split_text`, `is_header` and `type_lines`.
"""

from __future__ import annotations

import csv
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc

from jobs import fields
from schemas.audit import AUDIT_FIGURES, FIELD_NAMES, FIGURE_FIELDS, PARSED_FIGURE_COLUMNS
from schemas.model import arrow_type
from schemas.sources import AUDIT_PATTERN
from schemas.staging import REJECTS
from streamdi.batchlog import BatchFile
from streamdi.collector import read_landed
from streamdi.context import JobContext

AUDIT_SOURCE = "Audit"  # source name of audit lines in staging.rejects
HEADER = tuple(name.lower() for name in FIELD_NAMES)
LABELS = dict(zip((c.name for c in FIGURE_FIELDS), FIELD_NAMES, strict=True))  # a field as reasons name it
# What a value of each type that does not type is not, in the reasons of rejected lines.
NOT_A = {"int": "an integer", "bigint": "an integer", "date": "a YYYY-MM-DD date", "double": "a number"}


@dataclass(frozen=True)
class Rejected:
    source_file: str
    line_no: int
    line: str
    reason: str


def parsed_schema() -> pa.Schema:
    """Arrow schema of a parsed audit table: the six fields, `source_file` and `line_no`."""
    return pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable) for c in PARSED_FIGURE_COLUMNS])


def is_audit_file(path: str) -> bool:
    return fnmatch.fnmatchcase(PurePosixPath(path).name, AUDIT_PATTERN)


@dataclass(frozen=True)
class FigureLines:
    """The lines of one audit file after its header, blank lines left out, split and typed field by field.

    Per field (`schemas.audit.FIGURE_FIELDS` name): `texts` the trimmed texts ('' on a line of the wrong width),
    `values` the typed values (NULL where empty or not of the field's type), `bad` where a field is empty though
    required or not of its type. `width` is the number of fields found on each line.
    """

    line_no: list[int]
    line: list[str]
    width: list[int]
    texts: dict[str, pa.Array]
    values: dict[str, pa.Array]
    bad: dict[str, pa.Array]

    def right_width(self, i: int) -> bool:
        return self.width[i] == len(FIGURE_FIELDS)


def split_text(text: str) -> tuple[str | None, list[tuple[int, str]]]:
    """An audit file's header line (None for an empty text) and its other lines that are not blank, numbered
    (1-based, the header being line 1); a UTF-8 byte order mark is ignored."""
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines:
        return None, []
    return lines[0], [(n, line) for n, line in enumerate(lines[1:], start=2) if line.strip()]


def is_header(line: str) -> bool:
    """True for the audit header: the field names, compared without surrounding spaces and case."""
    return tuple(h.strip().lower() for h in next(csv.reader([line]))) == HEADER


def type_lines(numbered: Sequence[tuple[int, str]]) -> FigureLines:
    """Split `numbered` lines (as from `split_text`) into trimmed fields and type them with `jobs.fields`, as the
    staging parsers type theirs. A line of the wrong width is typed as a line of empty fields."""
    rows = [[f.strip() for f in next(csv.reader([line]))] for _, line in numbered]
    width = [len(r) for r in rows]
    empty = [""] * len(FIGURE_FIELDS)
    rows = [r if len(r) == len(FIGURE_FIELDS) else empty for r in rows]
    texts, values, bad = {}, {}, {}
    for i, col in enumerate(FIGURE_FIELDS):
        raw = pa.array([r[i] for r in rows], pa.large_string())
        present = pc.not_equal(raw, "")
        typed = fields.typed(raw, present, col)
        texts[col.name], values[col.name] = raw, typed.values
        bad[col.name] = typed.invalid if col.nullable else pc.or_(typed.invalid, pc.invert(present))
    return FigureLines([n for n, _ in numbered], [line for _, line in numbered], width, texts, values, bad)


def _reasons(typed: FigureLines) -> list[str]:
    """Per line, what is wrong with it ('' when nothing): its width, else its required fields that are empty,
    then its values that are not of their type."""
    problems = fields.Problems(len(typed.line))
    for col in FIGURE_FIELDS:
        if col.type == "string":
            problems.add(typed.bad[col.name], f"{LABELS[col.name]}: required value is empty")
    for col in FIGURE_FIELDS:
        if col.type != "string":
            what = f"' is not {NOT_A[col.type]}"
            problems.add(typed.bad[col.name], (f"{LABELS[col.name]}: '", typed.texts[col.name], what))
    reasons = problems.reason().to_pylist()
    return [
        reason if typed.right_width(i) else f"expected {len(FIGURE_FIELDS)} fields, found {typed.width[i]}"
        for i, reason in enumerate(reasons)
    ]


def parse_audit_text(text: str, source_file: str) -> tuple[list[dict], list[Rejected]]:
    """Figures of one audit file's text, in file order, and its rejected lines.

    Every figure carries `source_file` and `line_no` (1-based, the header being line 1).
    """
    header, numbered = split_text(text)
    if header is None or not numbered:
        return [], []
    if not is_header(header):
        reason = f"not an audit file: header is {header!r}"
        return [], [Rejected(source_file, n, line, reason) for n, line in numbered]
    typed = type_lines(numbered)
    columns = {name: values.to_pylist() for name, values in typed.values.items()}
    figures: list[dict] = []
    rejected: list[Rejected] = []
    for i, reason in enumerate(_reasons(typed)):
        if reason:
            rejected.append(Rejected(source_file, typed.line_no[i], typed.line[i], reason))
        else:
            row = {name: values[i] for name, values in columns.items()}
            figures.append({**row, "source_file": source_file, "line_no": typed.line_no[i]})
    return figures, rejected


def figures_table(figures: Iterable[dict]) -> pa.Table:
    """Parsed figures as an Arrow table with `parsed_schema()`."""
    schema = parsed_schema()
    rows = list(figures)
    return pa.table({f.name: pa.array([r[f.name] for r in rows], f.type) for f in schema}, schema=schema)


def parse_audit_files(paths: Sequence[Path], root: Path | None = None) -> tuple[pa.Table, list[Rejected]]:
    """Parse audit files: (figures of all files in the given order, rejected lines).

    `source_file` is the path relative to `root` when given (POSIX separators), else the path as given.
    """
    figures: list[dict] = []
    rejected: list[Rejected] = []
    for path in paths:
        name = Path(path).relative_to(root).as_posix() if root is not None else str(path)
        rows, bad = parse_audit_text(Path(path).read_bytes().decode("utf-8"), name)
        figures.extend(rows)
        rejected.extend(bad)
    return figures_table(figures), rejected


def audit_files_in(data_dir: Path) -> list[Path]:
    """The audit files of a TPC-DI data set directory: `DIR/*_audit.csv` (BatchK_audit.csv, Generator_audit.csv)
    and `DIR/BatchK/*_audit.csv`, sorted by relative path."""
    data_dir = Path(data_dir)
    found = [p for p in data_dir.glob(AUDIT_PATTERN) if p.is_file()]
    for batch_dir in data_dir.glob("Batch*"):
        if batch_dir.is_dir():
            found.extend(p for p in batch_dir.glob(AUDIT_PATTERN) if p.is_file())
    return sorted(found, key=lambda p: p.relative_to(data_dir).as_posix())


def read_dir(data_dir: Path) -> pa.Table:
    """Every figure of a data set directory (see `audit_files_in`); `source_file` relative to `data_dir`.

    Raises ValueError listing the lines that do not parse.
    """
    table, rejected = parse_audit_files(audit_files_in(data_dir), root=Path(data_dir))
    if rejected:
        listing = "; ".join(f"{r.source_file}:{r.line_no}: {r.reason}" for r in rejected[:10])
        raise ValueError(f"{len(rejected)} audit line(s) do not parse: {listing}")
    return table


def _lineage(table: pa.Table, batch_id: int, source_batch: dict[str, int]) -> pa.Table:
    n = table.num_rows
    batches = [source_batch[f] for f in table["source_file"].to_pylist()]
    return (
        table.append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
        .append_column("source_batch", pa.array(batches, pa.int32()))
        .select(AUDIT_FIGURES.column_names)
        .cast(AUDIT_FIGURES.arrow_schema())
    )


def _rejects_table(rejected: list[Rejected], batch_id: int, source_batch: dict[str, int]) -> pa.Table:
    columns = {
        "batch_id": [batch_id] * len(rejected),
        "source_batch": [source_batch[r.source_file] for r in rejected],
        "source": [AUDIT_SOURCE] * len(rejected),
        "source_file": [r.source_file for r in rejected],
        "line_no": [r.line_no for r in rejected],
        "line": [r.line for r in rejected],
        "reason": [r.reason for r in rejected],
    }
    schema = REJECTS.arrow_schema()
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)


def stage(ctx: JobContext, batch_id: int, files: Sequence[BatchFile]) -> dict[str, int]:
    """Stage the audit files among `files` (landing files of micro-batch `batch_id`) into
    `staging.audit_figures`, rejected lines into `staging.rejects`; returns rows written per table.

    One append per table with the app transaction `stage/audit_figures` (`stage/audit_rejects`), version
    `batch_id`, so a rerun of the micro-batch stages nothing twice. Files that are not audit files are ignored.
    """
    audit = [bf for bf in files if is_audit_file(bf.file)]
    if not audit:
        return {}
    source_batch = {bf.file: bf.source_batch for bf in audit}
    figures: list[dict] = []
    rejected: list[Rejected] = []
    for bf in audit:
        # an invalid byte shows as \xNN: a figure or date holding one is rejected by the parse, never read as another
        text = read_landed(ctx.settings.landing_dir / bf.file).decode("utf-8", errors="backslashreplace")
        rows, bad = parse_audit_text(text, bf.file)
        figures.extend(rows)
        rejected.extend(bad)
    staged = _lineage(figures_table(figures), batch_id, source_batch)
    ctx.lake.append(AUDIT_FIGURES, staged, app_id=f"stage/{AUDIT_FIGURES.name}", version=batch_id)
    written = {AUDIT_FIGURES.name: staged.num_rows}
    if rejected:
        ctx.lake.append(
            REJECTS, _rejects_table(rejected, batch_id, source_batch), app_id="stage/audit_rejects", version=batch_id
        )
        written[REJECTS.name] = len(rejected)
    return written


def latest_deliveries(staged: pa.Table) -> pa.Table:
    """Staged figures without repeated deliveries: per (TPC-DI batch, file name) only the file staged last
    (highest micro-batch, then the greatest landing path), in the parsed schema."""
    rows = staged.to_pylist()
    chosen: dict[tuple[int, str], tuple[int, str]] = {}
    for r in rows:
        ident = (r["source_batch"], PurePosixPath(r["source_file"]).name)
        delivery = (r["batch_id"], r["source_file"])
        chosen[ident] = max(chosen.get(ident, delivery), delivery)
    keep = [
        r
        for r in rows
        if chosen[(r["source_batch"], PurePosixPath(r["source_file"]).name)] == (r["batch_id"], r["source_file"])
    ]
    keep.sort(key=lambda r: (r["source_file"], r["line_no"]))
    return figures_table(keep)


def staged_figures(ctx: JobContext) -> pa.Table:
    """The staged figures (see `latest_deliveries`); an empty table when none was staged."""
    if not ctx.lake.exists(AUDIT_FIGURES):
        return figures_table([])
    return latest_deliveries(ctx.lake.read_arrow(AUDIT_FIGURES))
