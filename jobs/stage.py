"""Stage: parse a micro-batch's landing files into `staging.<source>` Delta tables.

Each file is matched to its declared source (`schemas.sources`) by name and parsed field by field with the
declared types. Delimited files are split into numbered lines and typed in the driver with Arrow's C++ kernels
(`jobs.delimited`; a round trip through Spark cost five times as long). A line that does not parse (wrong number
of fields, a value that is not of its type, an empty required field) goes to `staging.rejects` with the file, the
line number and the reason; nothing is dropped silently: for every file, lines read = lines staged + lines
rejected.

The two sources that are not delimited (Batch1 only) follow the same rules:
- FINWIRE files: every line is a CMP, SEC or FIN record (characters 16-18), cut into the fields declared in
  `schemas.finwire` with Spark column expressions, one Spark job per record type for all files of the batch,
  into `staging.finwire_cmp`, `staging.finwire_sec` and `staging.finwire_fin`. A line of another record type,
  of a length its type does not have, or with a field that does not fit its type is rejected.
- CustomerMgmt.xml: read with Spark's XML reader (row tag `TPCDI:Action`, every value read as text, surrounding
  spaces kept), numbered in file order (`action_seq`), then typed like a delimited line into
  `staging.customermgmt`, one row per action. An action without C_ID, with a bad ActionTS or ActionType, a
  value not of its type, or XML the reader cannot parse is rejected (`line` holds the action as JSON, or the
  unreadable text).

Pure part: `jobs.delimited.parse_delimited` (lines -> staged rows, rejected rows), `parse_finwire` /
`check_fixed_width`, `check_actions`. Edges: `numbered_lines`, `read_lines`, `read_actions` and `run`.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from jobs import audit_figures, delimited
from jobs.delimited import DECIMAL_SHAPE, INTEGER_SHAPE, TIME_SHAPE
from schemas import finwire as fw
from schemas.model import Column as Declared
from schemas.model import SourceFile, Table, decimal_precision
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.sources import (
    AUDIT_PATTERN,
    CUSTOMER_MGMT_ACTION,
    CUSTOMER_MGMT_ACTIONS,
    CUSTOMER_MGMT_PATTERN,
    CUSTOMER_MGMT_ROW_TAG,
    CUSTOMER_MGMT_XML,
    sources_for_batch,
)
from schemas.staging import CUSTOMER_MGMT, FINWIRE_TABLES, REJECTS
from streamdi import quality
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext

log = logging.getLogger(__name__)
T_ = TypeVar("T_")

_CIK = r"^[0-9]{10}$"

FINWIRE = "FINWIRE"  # source names of the non-delimited files (rejects, reports)
CUSTOMER_MGMT_SOURCE = "CustomerMgmt"


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


def nondelimited_source_for_file(file: str, source_batch: int = 1) -> str | None:
    """`FINWIRE` or `CustomerMgmt` for a Batch1 file of those sources (matched by name), else None."""
    name = PurePosixPath(file).name
    if source_batch != 1 or fnmatch.fnmatchcase(name, AUDIT_PATTERN):
        return None
    if fnmatch.fnmatchcase(name, fw.FINWIRE_PATTERN):
        return FINWIRE
    if fnmatch.fnmatchcase(name, CUSTOMER_MGMT_PATTERN):
        return CUSTOMER_MGMT_SOURCE
    return None


# Datetime patterns of the TPC-DI files, parsed as a shape check (regex) plus Spark's ISO cast, which is several
# times faster than a pattern-driven parser and equally strict for these shapes: (shape, [(start, length) of the
# ISO text's pieces, none when the text already is ISO], separators between them). Other patterns go through
# `to_date` / `to_timestamp`.
_ISO_DATETIME: dict[str, tuple[str, tuple[tuple[int, int], ...], tuple[str, ...]]] = {
    "yyyy-MM-dd": (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", (), ()),
    "yyyy-MM-dd HH:mm:ss": (r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$", (), ()),
    "yyyyMMdd": (r"^[0-9]{8}$", ((1, 4), (5, 2), (7, 2)), ("-", "-")),
    "yyyyMMdd-HHmmss": (
        r"^[0-9]{8}-[0-9]{6}$",
        ((1, 4), (5, 2), (7, 2), (10, 2), (12, 2), (14, 2)),
        ("-", "-", " ", ":", ":"),
    ),
}


def _parse_datetime(raw: Column, logical: str, fmt: str) -> Column:
    """A date or timestamp from text in pattern `fmt`, NULL if the text is not a valid value of that pattern."""
    if fmt not in _ISO_DATETIME:
        return F.to_date(raw, fmt) if logical == "date" else F.to_timestamp(raw, fmt)
    shape, pieces, separators = _ISO_DATETIME[fmt]
    iso = raw
    if pieces:
        parts = [F.substring(raw, start, length) for start, length in pieces]
        pieces_and_separators = [parts[0]]
        for separator, part in zip(separators, parts[1:], strict=True):
            pieces_and_separators += [F.lit(separator), part]
        iso = F.concat(*pieces_and_separators)
    return F.when(raw.rlike(shape), iso.try_cast(logical))


def _parse_value(raw: Column, logical: str, fmt: str | None) -> tuple[Column, Column]:
    """(typed value, is-valid) for one non-empty raw field."""
    if logical == "string":
        return raw, F.lit(True)
    if logical in ("int", "bigint"):
        value = raw.cast("int" if logical == "int" else "bigint")
        return value, raw.rlike(INTEGER_SHAPE) & value.isNotNull()
    if logical == "double":
        value = raw.cast("double")
        return value, value.isNotNull()
    if decimal_precision(logical):
        value = raw.cast(logical)
        return value, raw.rlike(DECIMAL_SHAPE) & value.isNotNull()
    if logical == "boolean":
        lowered = F.lower(raw)
        value = F.when(lowered.isin("true", "1"), F.lit(True)).when(lowered.isin("false", "0"), F.lit(False))
        return value, value.isNotNull()
    if logical in ("date", "timestamp"):
        value = _parse_datetime(raw, logical, fmt or ("yyyy-MM-dd" if logical == "date" else "yyyy-MM-dd HH:mm:ss"))
        return value, value.isNotNull()
    if logical == "time":
        return raw, raw.rlike(TIME_SHAPE)
    raise ValueError(f"no parser for logical type {logical}")


@dataclass
class _Checks:
    """Typed values and per-field checks of a line, evaluated in two projections: first every value and a
    boolean per check (computed once), then the `reason`, whose problem texts are only built for a bad line.
    Building the texts inline made every line evaluate each field twice (measured: FINWIRE FIN records 3x
    slower)."""

    values: list[Column] = field(default_factory=list)
    goods: list[Column] = field(default_factory=list)
    problems: list[Column] = field(default_factory=list)

    def typed(self, raw: Column, present: Column, col: Declared) -> None:
        """One raw text value of declared column `col` (`present` = not empty): its typed value, named after
        `col`, and its check (of its type; for a required column, not empty)."""
        value, valid = _parse_value(raw, col.type, col.fmt)
        self.values.append(F.when(present, value).alias(col.name))
        text = F.format_string(f"{col.name}: '%s' is not a valid {col.type}", raw)
        if col.nullable:
            self.check(~present | valid, text)
        else:
            self.check(present & valid, F.when(~present, F.lit(f"{col.name}: required value is empty")).otherwise(text))

    def check(self, good: Column, problem: Column) -> None:
        """A check of the line: `problem` (text) is reported when `good` is false."""
        flag = f"_good{len(self.goods)}"
        self.goods.append(good.alias(flag))
        self.problems.append(F.when(~F.col(flag), problem))

    def select(self, frame: DataFrame, keep: list[str], extra: list[Column] = ()) -> DataFrame:
        """`keep` columns of `frame`, the values, `extra` columns, and `_problems` ('' when every check holds,
        else the problems joined by '; '). The problem texts may use any column of `keep`."""
        flagged = frame.select(*keep, *self.values, *extra, *self.goods)
        return flagged.select(*flagged.columns[: len(flagged.columns) - len(self.goods)], self._problems)

    @functools.cached_property
    def _problems(self) -> Column:
        all_good = F.col("_good0")
        for i in range(1, len(self.goods)):
            all_good = all_good & F.col(f"_good{i}")
        return F.when(all_good, F.lit("")).otherwise(F.concat_ws("; ", *self.problems)).alias("_problems")


def _unpadded(raw: Column, f: fw.FixedWidthField) -> Column:
    return F.rtrim(raw) if f.type == "string" else F.trim(raw)


def check_fixed_width(lines: DataFrame, record: fw.FixedWidthRecord) -> DataFrame:
    """Cut lines of one FINWIRE record type into its declared columns, plus `reason` ('' for a good line).

    `lines` as for `check_lines` (only lines of this record type). Each field is a `substring` without its
    padding (text loses trailing spaces only, so a leading space of a value stays; numbers and dates lose
    spaces on both sides), then typed like a delimited field (dates `yyyyMMdd`, the posting time
    `yyyyMMdd-HHmmss`). A line is bad when its length is not one of `record.widths`, a value is not of its type,
    a required field is blank, or a short SEC/FIN line's last field is not a 10-digit CIK; for SEC/FIN the last
    field is kept as text (`co_name_or_cik`) and split into `cik` (short line) or `company_name` (full line).
    """
    passthrough = [c for c in lines.columns if c not in ("line_no", "line")]
    line = F.col("line")
    length = F.length(line)
    checks = _Checks()
    for f in record.fields:
        raw = _unpadded(F.substring(line, f.start, f.width), f)
        checks.typed(raw, raw != "", f.column)
    extra = []
    if record.short_last_field is not None:
        last = _unpadded(F.substring(line, record.fields[-1].start, record.fields[-1].width), record.fields[-1])
        short = length == min(record.widths)
        cik, name = fw.CIK_OR_NAME
        extra = [F.when(short, last).alias(cik.name), F.when(~short & (last != ""), last).alias(name.name)]
        checks.check(
            ~short | last.rlike(_CIK),
            F.format_string(f"{record.fields[-1].name}: '%s' is not a 10-digit CIK", last),
        )
    checked = checks.select(lines, ["line_no", "line", *passthrough], extra)
    widths = " or ".join(str(w) for w in record.widths)
    reason = (
        F.when(line == "", F.lit("empty line"))
        .when(
            ~length.isin(*record.widths),
            F.format_string(f"{record.rec_type} record: expected {widths} characters, found %d", length),
        )
        .otherwise(F.col("_problems"))
    )
    return checked.select(*[c for c in checked.columns if c != "_problems"], reason.alias("reason"))


def check_finwire(lines: DataFrame) -> tuple[dict[str, DataFrame], DataFrame]:
    """Lines of FINWIRE files by record type: ({CMP/SEC/FIN: `check_fixed_width` of its lines}, the other lines
    with `line_no`, `line`, lineage and `reason`: an empty line or an unknown record type)."""
    rec_type = F.substring(F.col("line"), 16, 3)
    checked = {code: check_fixed_width(lines.where(rec_type == code), r) for code, r in fw.RECORDS.items()}
    other = lines.where(~rec_type.isin(*fw.RECORDS)).withColumn(
        "reason",
        F.when(F.col("line") == "", F.lit("empty line")).otherwise(
            F.format_string("unknown record type '%s' (characters 16-18)", rec_type)
        ),
    )
    return checked, other


def parse_finwire(lines: DataFrame) -> tuple[dict[str, DataFrame], DataFrame]:
    """`({CMP/SEC/FIN: staged rows}, rejected)`: staged rows have the record's declared columns plus `line_no`;
    `rejected` has `line_no`, `line` and `reason`. Every input line is in exactly one of the four."""
    checked, other = check_finwire(lines)
    good = F.col("reason") == ""
    staged = {
        code: df.where(good).select(*[c.name for c in fw.RECORDS[code].columns], "line_no")
        for code, df in checked.items()
    }
    rejected = other.select("line_no", "line", "reason")
    for df in checked.values():
        rejected = rejected.unionByName(df.where(~good).select("line_no", "line", "reason"))
    return staged, rejected


_ACCOUNT = "Account"  # read as an array, so that an action with several accounts is seen (and rejected)


def _xml_value(path: str) -> Column:
    """The column Spark's XML reader gives an element path (`@NAME` = attribute, read as `_NAME`)."""
    value = F.col("action")
    for part in path.split("/"):
        value = value.getField(part.replace("@", "_", 1))
        if part == _ACCOUNT:
            value = F.get(value, 0)
    return value


def customer_mgmt_read_schema() -> T.StructType:
    """The schema the XML reader is given (no inference): every declared path as text, nested as in the file,
    plus `_corrupt_record` for an action the reader cannot parse."""
    tree: dict = {}
    for f in (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML):
        node = tree
        *parents, leaf = [p.replace("@", "_", 1) for p in f.path.split("/")]
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = None

    def struct(node: dict) -> T.StructType:
        fields = []
        for k, v in node.items():
            kind = T.StringType() if v is None else struct(v)
            fields.append(T.StructField(k, T.ArrayType(kind) if k == _ACCOUNT else kind, True))
        return T.StructType(fields)

    schema = struct(tree)
    return schema.add(T.StructField("_corrupt_record", T.StringType(), True))


def check_actions(actions: DataFrame) -> DataFrame:
    """Flatten and type CustomerMgmt.xml actions: the columns of `staging.customermgmt` (without lineage),
    `line` (for a rejected action, the action as read, as JSON; NULL for a good one) and `reason` ('' for a
    good action).

    `actions` has `action_seq`, `action` (a row as read with `customer_mgmt_read_schema`) and lineage columns,
    passed through. An element or attribute that is present but empty gives NULL, like an absent one;
    `present_fields` lists the fields present, so UPDCUST/UPDACCT can tell "unchanged" from "set to NULL".
    """
    passthrough = [c for c in actions.columns if c not in ("action_seq", "action")]
    checks, present_names = _Checks(), []
    action_type = _xml_value(CUSTOMER_MGMT_ACTION[0].path)
    known = ", ".join(CUSTOMER_MGMT_ACTIONS)
    for i, f in enumerate((*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)):
        raw = _xml_value(f.path)
        checks.typed(raw, raw.isNotNull() & (F.trim(raw) != ""), CUSTOMER_MGMT.column(f.name))
        if i == 0:  # the action type's own check: one of the known types
            checks.check(
                action_type.isNull() | action_type.isin(*CUSTOMER_MGMT_ACTIONS),
                F.format_string(f"action_type: '%s' is not one of {known}", action_type),
            )
        if f in CUSTOMER_MGMT_XML:
            present_names.append(F.when(raw.isNotNull(), F.lit(f.name)))
    accounts = F.size(F.col("action.Customer.Account"))  # -1 when there is no Account
    checks.check(accounts <= 1, F.format_string("%d Account elements, at most one expected", accounts))
    checked = checks.select(
        actions, ["action_seq", *passthrough, "action"], [F.concat_ws(",", *present_names).alias("present_fields")]
    )
    corrupt = F.col("action._corrupt_record")
    reason = F.when(corrupt.isNotNull(), F.lit("malformed XML: the reader could not parse this action")).otherwise(
        F.col("_problems")
    )
    checked = checked.select(*checked.columns, reason.alias("reason"))
    as_read = F.coalesce(corrupt, F.to_json(F.col("action").dropFields("_corrupt_record")))
    return checked.select(
        *[f.name for f in (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)],
        "present_fields",
        "action_seq",
        *passthrough,
        F.when(F.col("reason") != "", as_read).alias("line"),  # the JSON is only needed for a rejected action
        "reason",
    )


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


def read_actions(spark: SparkSession, path: str) -> DataFrame:
    """The `TPCDI:Action` elements of one CustomerMgmt.xml file: `action_seq` (1-based position in the file),
    `action` (the raw values, see `customer_mgmt_read_schema`).

    Spark's XML reader keeps the namespace prefix in tag names, so the row tag is matched as written. The
    position is counted in the JVM (no Python round trip): the reader returns a split's actions in file order (it
    reads an XML file as one split), so (split start offset, row counter within the task) orders them as in the
    file whatever the partitioning, and `row_number` over that order numbers them. The counter
    (`monotonically_increasing_id`) only orders the rows of one read here; it is never stored or used as a key.
    """
    schema = customer_mgmt_read_schema()
    raw = (
        spark.read.format("xml")
        .option("rowTag", CUSTOMER_MGMT_ROW_TAG)
        .option("ignoreSurroundingSpaces", "false")  # keep text exactly as written (e.g. a leading space)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .schema(schema)
        .load(path)
    )
    located = raw.select(
        F.input_file_block_start().alias("_split"),
        F.monotonically_increasing_id().alias("_in_task"),
        F.struct(*[F.col(f.name) for f in schema.fields]).alias("action"),
    )
    in_file_order = Window.orderBy("_split", "_in_task")
    return located.select(F.row_number().over(in_file_order).cast("long").alias("action_seq"), "action")


@dataclass
class FileReport:
    file: str
    source: str | None
    read: int
    staged: int
    rejected: int
    quarantined: int = 0  # moved to quality.quarantine by a quarantine check
    held: int = 0  # kept out because a halt check failed on its table (staged when the batch is resumed)


@dataclass
class StageReport:
    batch_id: int
    files: list[FileReport] = field(default_factory=list)
    checks: list[quality.CheckOutcome] = field(default_factory=list)
    halts: list[str] = field(default_factory=list)  # what halted the batch (empty: it goes on)

    @property
    def quarantined(self) -> int:
        return sum(f.quarantined for f in self.files)

    @property
    def held(self) -> int:
        return sum(f.held for f in self.files)

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


Parsed = tuple[list[tuple[Table, pa.Table]], pa.Table, list[FileReport]]  # ([(staging table, rows)], rejects, counts)


def run(ctx: JobContext, batch_id: int, files: list[BatchFile], *, attempt: int = 0) -> StageReport:
    """Stage every file of micro-batch `batch_id`: one app-transaction commit per staging table.

    Each staging table's rows are validated with its suite (`expectations/staging/`, `streamdi.quality`) before
    the commit: quarantined rows go to `quality.quarantine` instead, and a failed halt check keeps the table's
    rows out and is listed in `StageReport.halts` (the caller halts the batch). `attempt` is the number of
    times an operator resumed this stage: from 1 on, halt checks only warn (`overridden`).

    The files of one source are parsed together: a delimited source in Arrow (`jobs.delimited`), FINWIRE in one
    Spark job per record type for all quarters, CustomerMgmt.xml in one Spark read per file. Two sources are
    parsed at a time while the previous one is committed (`_overlapped`), and the commits follow a fixed order
    (delimited sources by name, FINWIRE, CustomerMgmt, rejects). Raises if the counts of a file do not reconcile
    (lines or actions read != staged + rejected), which would be a bug, not bad data.
    """
    report = StageReport(batch_id)
    by_source: dict[str, tuple[SourceFile, list[BatchFile]]] = {}
    finwire: list[BatchFile] = []
    customer_mgmt: list[BatchFile] = []
    for bf in files:
        kind = nondelimited_source_for_file(bf.file, bf.source_batch)
        if kind is not None:
            (finwire if kind == FINWIRE else customer_mgmt).append(bf)
            continue
        source = source_for_file(bf.file, bf.source_batch)
        if source is None:
            if not _is_audit(bf.file):
                log.warning("batch %s: %s matches no declared source; registered but not staged", batch_id, bf.file)
            report.files.append(FileReport(bf.file, None, 0, 0, 0))
            continue
        by_source.setdefault(source.name, (source, []))[1].append(bf)
    # One parse per source, in a fixed order; each returns ([(staging table, rows)], rejected rows, counts).
    parses: list[Callable[[], Parsed]] = []
    for name in sorted(by_source):
        source, group = by_source[name]
        parses.append(functools.partial(stage_source, ctx, batch_id, source, group))
    if finwire:
        parses.append(functools.partial(stage_finwire, ctx, batch_id, finwire))
    if customer_mgmt:
        parses.append(functools.partial(stage_customer_mgmt, ctx, batch_id, customer_mgmt))
    rejects: list[pa.Table] = []
    quarantined: list[pa.Table] = []
    results: list[pa.Table] = []
    validator = quality.validator()
    for tables, rejected, counts in _overlapped(parses):
        for table, rows in tables:
            suite = validator.suite_for(table)
            if suite is not None:
                checked = validator.validate(suite, rows, batch_id, resumed=attempt > 0)
                report.checks.extend(checked.outcomes)
                report.halts.extend(o.describe(suite.name) for o in checked.halts)
                results.append(checked.result_rows(batch_id, attempt))
                quarantined.append(checked.quarantined)
                kept = checked.kept.slice(0, 0) if checked.halts else checked.kept
                _count_removed(counts, rows, kept, held=bool(checked.halts))
                rows = kept
                if checked.halts:
                    continue  # the batch halts: these rows wait for the operator (resume re-stages them)
            ctx.lake.append(table, rows, app_id=f"stage/{table.name}", version=batch_id)
        report.files.extend(counts)
        rejects.append(rejected)
    if rejects:
        ctx.lake.append(REJECTS, _concat(rejects, REJECTS), app_id="stage/rejects", version=batch_id)
    _commit_quality(ctx, batch_id, attempt, results, quarantined)
    audit_figures.stage(ctx, batch_id, files)  # expected counts of *_audit.csv files, for `streamdi audit`
    arrival = {bf.file: i for i, bf in enumerate(files)}
    report.files.sort(key=lambda f: arrival[f.file])
    return report


def _count_removed(counts: list[FileReport], rows: pa.Table, kept: pa.Table, *, held: bool) -> None:
    """Move the rows validation took out of `rows` from each file's staged count to quarantined (or held)."""
    before = _per_file(rows)
    after = _per_file(kept)
    for report in counts:
        removed = before.get(report.file, 0) - after.get(report.file, 0)
        if removed:
            report.staged -= removed
            if held:
                report.held += removed
            else:
                report.quarantined += removed


def _per_file(rows: pa.Table) -> dict[str, int]:
    if rows.num_rows == 0:
        return {}
    return {r["values"]: r["counts"] for r in rows["source_file"].value_counts().to_pylist()}


def _commit_quality(
    ctx: JobContext, batch_id: int, attempt: int, results: list[pa.Table], quarantined: list[pa.Table]
) -> None:
    """The suites' results and the quarantined rows of this micro-batch, once per attempt (a rerun of the same
    attempt is skipped; quarantined rows are keyed, so a resumed attempt upserts the same rows again)."""
    if results:
        ctx.lake.append(
            QUALITY_RESULTS, _concat(results, QUALITY_RESULTS), app_id=f"stage/quality/{attempt}", version=batch_id
        )
    rows = _concat(quarantined, QUARANTINE) if quarantined else None
    if rows is not None and rows.num_rows:
        ctx.lake.upsert(QUARANTINE, rows, app_id=f"stage/quarantine/{attempt}", version=batch_id)


PARSES_IN_FLIGHT = 2


def _overlapped(parses: list[Callable[[], T_]]) -> Iterator[T_]:
    """The results of `parses`, in order, computed up to `PARSES_IN_FLIGHT` at a time in threads, so that one
    source's driver work (splitting lines, Arrow transfers) and the caller's Delta commit of the previous source
    overlap another source's Spark job. Commits stay in the caller's thread, in the fixed order; at most
    `PARSES_IN_FLIGHT` + 1 parsed sources are held in memory."""
    if len(parses) <= 1:
        yield from (parse() for parse in parses)
        return
    with ThreadPoolExecutor(max_workers=PARSES_IN_FLIGHT, thread_name_prefix="stage") as pool:
        todo = iter(parses)
        running = deque(pool.submit(parse) for parse in itertools.islice(todo, PARSES_IN_FLIGHT))
        while running:
            result = running.popleft().result()
            following = next(todo, None)
            if following is not None:
                running.append(pool.submit(following))
            yield result


def stage_source(ctx: JobContext, batch_id: int, source: SourceFile, files: list[BatchFile]) -> Parsed:
    """Parse all `files` of one source: ([(its staging table, staged rows)], rejected rows, per-file counts)."""
    lines, read = _landing_lines(ctx, files)
    checked = _with_batch(delimited.check_lines(lines, source), batch_id, source.name)
    good = pc.equal(checked["reason"], "")
    staged = checked.filter(good).select(source.staging.column_names)
    rejected = checked.filter(pc.invert(good)).select(REJECTS.column_names)
    return [(source.staging, staged)], rejected, _reconcile(batch_id, source.name, files, read, [staged], rejected)


def _collect(checked: DataFrame) -> pa.Table:
    """Checked lines as Arrow, with the raw `line` kept for rejected lines only (staged rows do not store it, and
    it is the widest column)."""
    return checked.withColumn("line", F.when(F.col("reason") != "", F.col("line"))).toArrow()


def _landing_lines(ctx: JobContext, files: list[BatchFile]) -> tuple[pa.Table, list[int]]:
    """Numbered lines of all `files` with `source_file` and `source_batch`, and the line count of each file."""
    parts = []
    for bf in files:
        lines = numbered_lines(str(ctx.settings.landing_dir / bf.file))
        n = lines.num_rows
        parts.append(
            lines.append_column("source_file", pa.array([bf.file] * n, pa.large_string())).append_column(
                "source_batch", pa.array([bf.source_batch] * n, pa.int32())
            )
        )
    return pa.concat_tables(parts), [p.num_rows for p in parts]


def _with_batch(checked: pa.Table, batch_id: int, source: str) -> pa.Table:
    n = checked.num_rows
    return checked.append_column("batch_id", pa.array([batch_id] * n, pa.int64())).append_column(
        "source", pa.array([source] * n, pa.large_string())
    )


def _reconcile(
    batch_id: int, source: str, files: list[BatchFile], read: list[int], staged: list[pa.Table], rejected: pa.Table
) -> list[FileReport]:
    """Per-file counts; raises unless read = staged + rejected for every file (a bug, not bad data)."""
    counts = []
    for bf, n_read in zip(files, read, strict=True):
        n_staged = sum(pc.sum(pc.equal(t["source_file"], bf.file)).as_py() or 0 for t in staged)
        n_rejected = pc.sum(pc.equal(rejected["source_file"], bf.file)).as_py() or 0
        if n_read != n_staged + n_rejected:
            raise AssertionError(f"{bf.file}: read {n_read} != staged {n_staged} + rejected {n_rejected}")
        if n_rejected:
            log.warning("batch %s: %s: %d of %d rejected", batch_id, bf.file, n_rejected, n_read)
        counts.append(FileReport(bf.file, source, n_read, n_staged, n_rejected))
    return counts


def stage_finwire(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> Parsed:
    """Parse all FINWIRE `files` of a batch: ([(CMP/SEC/FIN staging table, staged rows)], rejected rows, per-file
    counts)."""
    lines, read = _landing_lines(ctx, files)
    checked, other = check_finwire(ctx.spark.createDataFrame(lines))
    staged, rejected = {}, [_with_batch(other.toArrow(), batch_id, FINWIRE).select(REJECTS.column_names)]
    for code, df in checked.items():
        rows = _with_batch(_collect(df), batch_id, FINWIRE)
        good = pc.equal(rows["reason"], "")
        staged[code] = rows.filter(good).select(FINWIRE_TABLES[code].column_names)
        rejected.append(rows.filter(pc.invert(good)).select(REJECTS.column_names))
    rejects = _concat(rejected, REJECTS)
    counts = _reconcile(batch_id, FINWIRE, files, read, list(staged.values()), rejects)
    return [(table, staged[code]) for code, table in FINWIRE_TABLES.items()], rejects, counts


def stage_customer_mgmt(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> Parsed:
    """Parse CustomerMgmt.xml `files`: ([(its staging table, staged actions)], rejected actions, per-file counts);
    `read` counts the
    actions the XML reader returned (an unparseable stretch of XML counts as one rejected action)."""
    staged, rejected, read = [], [], []
    for bf in files:
        actions = read_actions(ctx.spark, str(ctx.settings.landing_dir / bf.file)).select(
            "action_seq",
            "action",
            F.lit(bf.file).alias("source_file"),
            F.lit(bf.source_batch).cast("int").alias("source_batch"),
        )
        rows = _with_batch(check_actions(actions).toArrow(), batch_id, CUSTOMER_MGMT_SOURCE)
        read.append(rows.num_rows)
        good = pc.equal(rows["reason"], "")
        staged.append(rows.filter(good).select(CUSTOMER_MGMT.column_names))
        bad = rows.filter(pc.invert(good)).rename_columns(
            ["line_no" if c == "action_seq" else c for c in rows.column_names]
        )
        rejected.append(bad.select(REJECTS.column_names))
    staged_rows, rejects = _concat(staged, CUSTOMER_MGMT), _concat(rejected, REJECTS)
    counts = _reconcile(batch_id, CUSTOMER_MGMT_SOURCE, files, read, [staged_rows], rejects)
    return [(CUSTOMER_MGMT, staged_rows)], rejects, counts


def _concat(parts: list[pa.Table], table: Table) -> pa.Table:
    """One Arrow table of `parts` in the declared schema (parts from different Spark plans differ in nullability)."""
    return pa.concat_tables([p.cast(table.arrow_schema()) for p in parts])
