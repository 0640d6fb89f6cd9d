"""Stage: parse a micro-batch's landing files into `staging.<source>` Delta tables.

Each file is matched to its declared source (`schemas.sources`) by name and parsed field by field with the
declared types. A line that does not parse (wrong number of fields, a value that is not of its type, an
empty required field) goes to `staging.rejects` with the file, the line number and the reason; nothing is
dropped silently: for every file, lines read = lines staged + lines rejected.

Pure part: `parse_delimited` (lines -> staged rows, rejected rows). Edges: `read_lines` and `run`.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.model import SourceFile, decimal_precision
from schemas.sources import AUDIT_PATTERN, sources_for_batch
from schemas.staging import REJECTS
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext

log = logging.getLogger(__name__)

_INTEGER = r"^[+-]?[0-9]+$"
_DECIMAL = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$"


def source_for_file(
    file: str, source_batch: int = 1, sources: tuple[SourceFile, ...] | None = None
) -> SourceFile | None:
    """The declared source whose pattern matches the file's name (None if no source matches).

    `source_batch` (the file's TPC-DI batch) picks the Batch1 or the incremental (CDC) variant of a source
    that has both, e.g. `Trade.txt`; `*_audit.csv` files are expected counts, never data (None).
    """
    name = PurePosixPath(file).name
    if fnmatch.fnmatchcase(name, AUDIT_PATTERN):
        return None
    sources = sources_for_batch(source_batch) if sources is None else sources
    matches = [s for s in sources if fnmatch.fnmatchcase(name, s.pattern)]
    if len(matches) > 1:
        raise ValueError(f"{file} matches several sources: {[s.name for s in matches]}")
    return matches[0] if matches else None


def _parse_value(raw: Column, logical: str, fmt: str | None) -> tuple[Column, Column]:
    """(typed value, is-valid) for one non-empty raw field."""
    if logical == "string":
        return raw, F.lit(True)
    if logical in ("int", "bigint"):
        value = raw.cast("int" if logical == "int" else "bigint")
        return value, raw.rlike(_INTEGER) & value.isNotNull()
    if logical == "double":
        value = raw.cast("double")
        return value, value.isNotNull()
    if decimal_precision(logical):
        value = raw.cast(logical)
        return value, raw.rlike(_DECIMAL) & value.isNotNull()
    if logical == "boolean":
        lowered = F.lower(raw)
        value = F.when(lowered.isin("true", "1"), F.lit(True)).when(lowered.isin("false", "0"), F.lit(False))
        return value, value.isNotNull()
    if logical == "date":
        value = F.to_date(raw, fmt or "yyyy-MM-dd")
        return value, value.isNotNull()
    if logical == "timestamp":
        value = F.to_timestamp(raw, fmt or "yyyy-MM-dd HH:mm:ss")
        return value, value.isNotNull()
    if logical == "time":
        return raw, raw.rlike(_TIME)
    raise ValueError(f"no parser for logical type {logical}")


def check_lines(lines: DataFrame, source: SourceFile) -> DataFrame:
    """Split and type lines of `source`: the declared columns plus `reason` ('' for a good line).

    `lines` has `line_no`, `line` (the raw text, line ending removed) and any lineage columns, which are
    passed through. A line is bad when it is empty, has the wrong number of fields, has a value that is not
    of its declared type, or leaves a required field empty; `reason` then names every problem.
    """
    expected = len(source.columns)
    passthrough = [c for c in lines.columns if c not in ("line_no", "line")]
    fields = F.split(F.col("line"), re.escape(source.delimiter), -1)
    parsed = lines.select("line_no", "line", *passthrough, fields.alias("_fields"))
    typed, problems = [], []
    for i, col in enumerate(source.columns):
        raw = F.get(F.col("_fields"), i)
        present = raw.isNotNull() & (raw != "")
        value, valid = _parse_value(raw, col.type, col.fmt)
        typed.append(F.when(present, value).alias(col.name))
        problem = F.when(present & ~valid, F.format_string(f"{col.name}: '%s' is not a valid {col.type}", raw))
        if not col.nullable:
            problem = F.when(~present, F.lit(f"{col.name}: required value is empty")).otherwise(problem)
        problems.append(problem)
    count = F.size(F.col("_fields"))
    reason = (
        F.when(F.col("line") == "", F.lit("empty line"))
        .when(count != expected, F.format_string(f"expected {expected} fields, found %d", count))
        .otherwise(F.concat_ws("; ", *problems))
    )
    return parsed.select("line_no", "line", *passthrough, *typed, reason.alias("reason"))


def parse_delimited(lines: DataFrame, source: SourceFile) -> tuple[DataFrame, DataFrame]:
    """`(staged, rejected)` lines of one source: `staged` has the declared columns plus `line_no`;
    `rejected` has `line_no`, `line` and `reason`. Every input line is in exactly one of the two."""
    checked = check_lines(lines, source)
    good = F.col("reason") == ""
    staged = checked.where(good).select(*[c.name for c in source.columns], "line_no")
    rejected = checked.where(~good).select("line_no", "line", "reason")
    return staged, rejected


def read_lines(spark: SparkSession, path: str) -> DataFrame:
    """The file's lines with 1-based line numbers, line endings (LF or CRLF) removed, empty lines kept.

    Lines are split by Arrow's C++ reader in the driver and numbered in file order, so numbers never depend
    on Spark partitioning; Spark parses them in parallel. Bytes that are not UTF-8 become U+FFFD (the line
    is kept, and rejected by the parser if a field no longer fits its type).
    """
    return spark.createDataFrame(numbered_lines(path))


def numbered_lines(path: str) -> pa.Table:
    """`line_no`, `line` of a text file, split in Arrow's C++ kernels (any byte may occur inside a line)."""
    with open(path, "rb") as handle:
        data = handle.read()
    parts = pc.split_pattern(pa.array([data], pa.large_binary()), pattern=b"\n")[0].values
    if len(parts) and parts[-1].as_py() == b"":  # the newline that ends the last line opens no new line
        parts = parts.slice(0, len(parts) - 1)
    try:
        lines = parts.cast(pa.large_string())
    except pa.ArrowInvalid:
        lines = pa.array([b.decode("utf-8", errors="replace") for b in parts.to_pylist()], pa.large_string())
    lines = pc.replace_substring_regex(lines, pattern="\r$", replacement="")
    return pa.table({"line_no": pa.array(range(1, len(lines) + 1), pa.int64()), "line": lines})


@dataclass
class FileReport:
    file: str
    source: str | None
    read: int
    staged: int
    rejected: int


@dataclass
class StageReport:
    batch_id: int
    files: list[FileReport] = field(default_factory=list)

    @property
    def read(self) -> int:
        return sum(f.read for f in self.files)

    @property
    def staged(self) -> int:
        return sum(f.staged for f in self.files)

    @property
    def rejected(self) -> int:
        return sum(f.rejected for f in self.files)

    @property
    def audit_files(self) -> list[str]:
        """`*_audit.csv` files: expected counts for the audit, not data."""
        return [f.file for f in self.files if f.source is None and _is_audit(f.file)]

    @property
    def unknown_files(self) -> list[str]:
        """Files that match no declared source (registered in the batch log, not staged)."""
        return [f.file for f in self.files if f.source is None and not _is_audit(f.file)]


def _is_audit(file: str) -> bool:
    return fnmatch.fnmatchcase(PurePosixPath(file).name, AUDIT_PATTERN)


def run(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> StageReport:
    """Stage every file of micro-batch `batch_id`: one app-transaction commit per staging table.

    The files of one source are parsed together in one Spark job. Raises if the counts of a file do not
    reconcile (lines read != staged + rejected), which would be a bug, not bad data.
    """
    report = StageReport(batch_id)
    by_source: dict[str, tuple[SourceFile, list[BatchFile]]] = {}
    for bf in files:
        source = source_for_file(bf.file, bf.source_batch)
        if source is None:
            if not _is_audit(bf.file):
                log.warning("batch %s: %s matches no declared source; registered but not staged", batch_id, bf.file)
            report.files.append(FileReport(bf.file, None, 0, 0, 0))
            continue
        by_source.setdefault(source.name, (source, []))[1].append(bf)
    rejects: list[pa.Table] = []
    for name in sorted(by_source):
        source, group = by_source[name]
        staged, rejected, counts = stage_source(ctx, batch_id, source, group)
        report.files.extend(counts)
        ctx.lake.append(source.staging, staged, app_id=f"stage/{source.staging.name}", version=batch_id)
        rejects.append(rejected)
    if rejects:
        ctx.lake.append(REJECTS, pa.concat_tables(rejects), app_id="stage/rejects", version=batch_id)
    arrival = {bf.file: i for i, bf in enumerate(files)}
    report.files.sort(key=lambda f: arrival[f.file])
    return report


def stage_source(
    ctx: JobContext, batch_id: int, source: SourceFile, files: list[BatchFile]
) -> tuple[pa.Table, pa.Table, list[FileReport]]:
    """Parse all `files` of one source: (staged rows, rejected rows, per-file counts)."""
    parts = []
    for bf in files:
        lines = numbered_lines(str(ctx.settings.landing_dir / bf.file))
        n = lines.num_rows
        parts.append(
            lines.append_column("source_file", pa.array([bf.file] * n, pa.large_string())).append_column(
                "source_batch", pa.array([bf.source_batch] * n, pa.int32())
            )
        )
    lines = pa.concat_tables(parts)
    checked = check_lines(ctx.spark.createDataFrame(lines), source).toArrow()
    good = pc.equal(checked["reason"], "")
    batch = pa.array([batch_id] * checked.num_rows, pa.int64())
    checked = checked.append_column("batch_id", batch).append_column(
        "source", pa.array([source.name] * checked.num_rows, pa.large_string())
    )
    staged = checked.filter(good).select(source.staging.column_names)
    rejected = checked.filter(pc.invert(good)).select(REJECTS.column_names)
    counts = []
    for bf, part in zip(files, parts, strict=True):
        in_file = pc.equal(checked["source_file"], bf.file)
        n_staged = pc.sum(pc.and_(in_file, good)).as_py() or 0
        n_rejected = pc.sum(pc.and_(in_file, pc.invert(good))).as_py() or 0
        if part.num_rows != n_staged + n_rejected:
            raise AssertionError(f"{bf.file}: read {part.num_rows} != staged {n_staged} + rejected {n_rejected}")
        if n_rejected:
            log.warning("batch %s: %s: %d of %d lines rejected", batch_id, bf.file, n_rejected, part.num_rows)
        counts.append(FileReport(bf.file, source.name, part.num_rows, n_staged, n_rejected))
    return staged, rejected, counts
