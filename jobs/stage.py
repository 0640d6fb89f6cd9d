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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.model import SourceFile, decimal_precision
from schemas.sources import ALL_SOURCES
from schemas.staging import REJECTS
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext

log = logging.getLogger(__name__)

_INTEGER = r"^[+-]?[0-9]+$"
_DECIMAL = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$"
_BOOLEAN_TEXT = {"true": True, "false": False, "1": True, "0": False}


def source_for_file(file: str, sources: tuple[SourceFile, ...] = ALL_SOURCES) -> SourceFile | None:
    """The declared source whose pattern matches the file's name (None if no source matches)."""
    name = PurePosixPath(file).name
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


def parse_delimited(lines: DataFrame, source: SourceFile) -> tuple[DataFrame, DataFrame]:
    """Split and type the lines of one source file.

    `lines` has columns `line_no` (1-based) and `line` (the raw text, line ending removed). Returns
    `(staged, rejected)`: `staged` has the source's declared columns plus `line_no`; `rejected` has
    `line_no`, `line` and `reason`. Every input line is in exactly one of the two.
    """
    expected = len(source.columns)
    fields = F.split(F.col("line"), re.escape(source.delimiter), -1)
    parsed = lines.select("line_no", "line", fields.alias("_fields"))
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
    checked = parsed.select("line_no", "line", *typed, reason.alias("reason"))
    good = F.col("reason") == ""
    staged = checked.where(good).select(*[c.name for c in source.columns], "line_no")
    rejected = checked.where(~good).select("line_no", "line", "reason")
    return staged, rejected


def read_lines(spark: SparkSession, path: str) -> DataFrame:
    """The file's lines with 1-based line numbers (CR of CRLF endings removed). Line numbers come from the
    file's own order (zipWithIndex over the ordered splits), never from partition ids."""
    rdd = spark.sparkContext.textFile(path).zipWithIndex().map(lambda pair: (pair[1] + 1, pair[0]))
    return spark.createDataFrame(rdd, "line_no bigint, line string").withColumn(
        "line", F.regexp_replace("line", "\r$", "")
    )


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
    def unknown_files(self) -> list[str]:
        return [f.file for f in self.files if f.source is None]


def run(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> StageReport:
    """Stage every file of micro-batch `batch_id`: one app-transaction commit per staging table.

    Raises if the counts of a file do not reconcile (read != staged + rejected), which would be a bug.
    """
    spark, lake = ctx.spark, ctx.lake
    report = StageReport(batch_id)
    staged_by_source: dict[str, list[DataFrame]] = {}
    rejects: list[DataFrame] = []
    for bf in files:
        source = source_for_file(bf.file)
        if source is None:
            log.warning("batch %s: %s matches no declared source; registered but not staged", batch_id, bf.file)
            report.files.append(FileReport(bf.file, None, 0, 0, 0))
            continue
        lines = read_lines(spark, str(ctx.settings.landing_dir / bf.file)).cache()
        staged, rejected = parse_delimited(lines, source)
        lineage = [
            F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.lit(bf.source_batch).cast("int").alias("source_batch"),
            F.lit(bf.file).alias("source_file"),
        ]
        staged = staged.select(*[c.name for c in source.columns], *lineage, "line_no").cache()
        rejected = rejected.select(
            *lineage[:2], F.lit(source.name).alias("source"), lineage[2], "line_no", "line", "reason"
        ).cache()
        counts = FileReport(bf.file, source.name, lines.count(), staged.count(), rejected.count())
        if counts.read != counts.staged + counts.rejected:
            raise AssertionError(
                f"{bf.file}: read {counts.read} != staged {counts.staged} + rejected {counts.rejected}"
            )
        if counts.rejected:
            log.warning("batch %s: %s: %d of %d lines rejected", batch_id, bf.file, counts.rejected, counts.read)
        report.files.append(counts)
        staged_by_source.setdefault(source.name, []).append(staged)
        rejects.append(rejected)
    for name, frames in sorted(staged_by_source.items()):
        source = next(s for s in ALL_SOURCES if s.name == name)
        lake.append(source.staging, _union(frames), app_id=f"stage/{source.staging.name}", version=batch_id)
    if rejects:
        lake.append(REJECTS, _union(rejects), app_id="stage/rejects", version=batch_id)
    return report


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out
