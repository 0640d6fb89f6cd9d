"""A large delimited source parsed, checked and written where Spark's executors run, not in the driver.

The stage (`jobs.stage`) hands a source here when its files of a micro-batch hold at least
`STREAMDI_EXECUTOR_PARSE_BYTES` (`parse_here`). The driver cuts the files into pieces of whole lines
(`jobs.landing_chunks`: one pass that also checks each file's SHA-256, in constant memory). One Spark task per piece
(`mapInArrow` over the pieces' numbers) then does, with the same functions as the driver's parse:
- reads its piece (checking its CRC) and numbers its lines from the piece's first line (`jobs.landing.file_lines`);
- splits and types them (`jobs.stage_parse.parse_lines`, `jobs.delimited`): the same rows and reasons;
- runs the source's row-wise checks on its rows (`streamdi.quality`, the same suite, Great Expectations' pandas engine
  in the executor's Python);
- writes the rows it keeps as one Parquet file, named after its piece, into the staging table's scratch directory
  (`Lake.scratch_dir`);
- returns only what is small: its counts, its rejected and quarantined rows, and its checks' outcomes.

The driver merges the outcomes as a whole-table validation would give them (`quality.merged_outcome`), runs the
checks that need the whole column (`expect_column_values_to_be_unique`) as Spark aggregations over a side file of
each piece's checked columns, and the stage commits the pieces' files in piece order (`Lake.append_written`). So the
staged rows, rejects, quarantined rows and quality results equal the driver's parse of the same files (the tests
compare them), and no row of the source passes through the driver.

A suite with a check this cannot split (one that compares rows, other than uniqueness without a row condition;
`mostly`; a uniqueness check that quarantines), or a totally ordered source (its contract check reads the keys in
order), is parsed in the driver (`parse_here` says why).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.landing import file_lines
from jobs.landing_chunks import Chunk, plan_chunks, read_chunk
from jobs.stage_parse import FileReport, concat_as, parse_lines
from schemas.model import SourceFile, Table
from schemas.ordering import contract_for
from schemas.quality import QUARANTINE
from schemas.staging import REJECTS
from streamdi import quality
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext
from streamdi.suites import MAX_DETAIL_VALUES, Check, Suite

log = logging.getLogger(__name__)

# Checks that judge a row by other rows: a piece alone cannot tell.
CROSS_ROW = frozenset(
    {
        "expect_column_values_to_be_unique",
        "expect_compound_columns_to_be_unique",
        "expect_multicolumn_values_to_be_unique",
        "expect_select_column_values_to_be_unique_within_record",
        "expect_column_values_to_be_increasing",
        "expect_column_values_to_be_decreasing",
    }
)
WHOLE_COLUMN = "expect_column_values_to_be_unique"  # the one cross-row check run here, as a Spark aggregation
UNIQUE_SUFFIX = "-unique"  # the side files of the checked columns, beside the scratch directory
ORDER_COLUMNS = ("_piece", "_row")  # in the side files: where each value stands in the source's rows


@dataclass
class Written:
    """A source's rows staged by the executors: waiting in `Lake.scratch_dir` for `Lake.append_written`."""

    table: Table
    kept: int  # rows written (after quarantine)
    files_with_rows: set[str]  # the source files with staged rows (before the checks), for the ordering contract
    validated: quality.Validated | None  # the suite's merged outcomes and quarantined rows (kept: no rows)


def parse_here(ctx: JobContext, source: SourceFile, files: list[BatchFile], suite: Suite | None) -> str | None:
    """Why `source`'s `files` are parsed in the driver (None: on the executors): they are smaller than
    `STREAMDI_EXECUTOR_PARSE_BYTES`, or the source or its suite needs the whole table at once."""
    size = sum(bf.size_bytes for bf in files)
    if size < ctx.settings.executor_parse_bytes:
        return f"{size} bytes, under STREAMDI_EXECUTOR_PARSE_BYTES"
    if contract_for(source.name).kind != "bag":
        return "its ordering contract compares keys across the whole table"
    for check in suite.checks if suite else ():
        if "mostly" in check.kwargs or "row_condition" in check.kwargs:
            return f"check {check.id} counts over the whole table (mostly, row_condition)"
        if check.expectation in CROSS_ROW and (check.expectation != WHOLE_COLUMN or check.policy == "quarantine"):
            return f"check {check.id} ({check.expectation}, {check.policy}) needs the whole table in one place"
    return None


def stage_on_executors(
    ctx: JobContext,
    batch_id: int,
    source: SourceFile,
    files: list[BatchFile],
    suite: Suite | None,
    *,
    resumed: bool,
) -> tuple[Written, pa.Table, list[FileReport]]:
    """Parse, check and write `source`'s `files` on Spark's executors (the module's doc): (the written rows, the
    rejected rows, per-file counts). Raises `LandingFileError` for a file gone or changed since it was registered,
    and an AssertionError when a file's counts do not reconcile (a bug)."""
    table = source.staging
    app_id = f"stage/{table.name}"
    chunks = plan_chunks(ctx.settings.landing_dir, batch_id, files, ctx.settings.executor_parse_chunk_bytes)
    scratch = ctx.lake.scratch_dir(table, app_id, batch_id)
    side = scratch.with_name(scratch.name + UNIQUE_SUFFIX)
    for directory in (scratch, side):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    checks = suite.checks if suite is not None else ()
    job = _PieceJob(
        landing_dir=str(ctx.settings.landing_dir),
        batch_id=batch_id,
        source=source,
        suite=replace(suite, checks=tuple(c for c in checks if c.expectation not in CROSS_ROW)) if checks else None,
        resumed=resumed,
        scratch=str(scratch),
        side=str(side),
        unique_columns=[c.column for c in checks if c.expectation == WHOLE_COLUMN],
    )
    pieces = _run_pieces(ctx, chunks, job)
    log.info("batch %s: %s parsed by Spark's executors in %d pieces", batch_id, source.name, len(chunks))
    rejects = concat_as([p.rejects for p in pieces], REJECTS) if pieces else REJECTS.arrow_schema().empty_table()
    counts = _counts(batch_id, source, files, chunks, pieces)
    validated = None
    if suite is not None:
        outcomes = {}
        for check in suite.checks:
            if check.expectation == WHOLE_COLUMN:
                outcomes[check.id] = _unique_outcome(ctx, check, side, sum(p.staged for p in pieces), resumed)
            else:
                outcomes[check.id] = quality.merged_outcome(
                    check, [p.outcomes[check.id] for p in pieces], resumed=resumed
                )
        quarantined = (
            concat_as([p.quarantined for p in pieces], QUARANTINE)
            if pieces
            else QUARANTINE.arrow_schema().empty_table()
        )
        validated = quality.Validated(
            suite, table.arrow_schema().empty_table(), quarantined, [outcomes[c.id] for c in suite.checks]
        )
    shutil.rmtree(side, ignore_errors=True)
    staged_files = {chunk.file.file for chunk, piece in zip(chunks, pieces, strict=True) if piece.staged}
    return Written(table, sum(p.kept for p in pieces), staged_files, validated), rejects, counts


@dataclass
class _Piece:
    """What one piece's task returns to the driver."""

    read: int
    staged: int  # parsed rows (before the checks)
    kept: int  # rows written (after quarantine)
    rejects: pa.Table
    quarantined: pa.Table
    outcomes: dict[str, quality.CheckOutcome]


_RESULT = pa.schema(
    [
        ("piece", pa.int64()),
        ("read", pa.int64()),
        ("staged", pa.int64()),
        ("kept", pa.int64()),
        ("rejects", pa.binary()),
        ("quarantined", pa.binary()),
        ("outcomes", pa.string()),
    ]
)


_RESULT_DDL = "piece long, read long, staged long, kept long, rejects binary, quarantined binary, outcomes string"


@dataclass(frozen=True)
class _PieceJob:
    """Everything a task needs besides its piece (sent to the executors with the function)."""

    landing_dir: str
    batch_id: int
    source: SourceFile
    suite: Suite | None  # the row-wise checks
    resumed: bool
    scratch: str
    side: str
    unique_columns: list[str]

    def run(self, chunk: Chunk) -> dict:
        data = read_chunk(Path(self.landing_dir), self.batch_id, chunk)
        lines, bad = file_lines(data, chunk.file, first_line=chunk.first_line, ends_file=chunk.ends_file)
        del data
        staged, rejected = parse_lines(lines, bad, self.source, self.batch_id)
        read = lines.num_rows + bad.num_rows
        del lines, bad
        if self.unique_columns and staged.num_rows:  # the checked columns, and where each row stands
            side = staged.select(self.unique_columns)
            side = side.append_column("_piece", pa.array([chunk.position] * staged.num_rows, pa.int64()))
            side = side.append_column("_row", pa.array(range(staged.num_rows), pa.int64()))
            pq.write_table(side, Path(self.side) / f"part-{chunk.position:05d}.parquet")
        kept, quarantined, outcomes = staged, QUARANTINE.arrow_schema().empty_table(), []
        if self.suite is not None and self.suite.checks:
            checked = quality.validator().validate(self.suite, staged, self.batch_id, resumed=self.resumed)
            kept, quarantined, outcomes = checked.kept, checked.quarantined, checked.outcomes
        if kept.num_rows:
            pq.write_table(
                concat_as([kept], self.source.staging),
                Path(self.scratch) / f"part-{chunk.position:05d}.parquet",
                compression="snappy",
            )
        return {
            "piece": chunk.position,
            "read": read,
            "staged": staged.num_rows,
            "kept": kept.num_rows,
            "rejects": _ipc(concat_as([rejected], REJECTS)),
            "quarantined": _ipc(concat_as([quarantined], QUARANTINE)),
            "outcomes": json.dumps([_outcome_json(o) for o in outcomes]),
        }


def _run_pieces(ctx: JobContext, chunks: list[Chunk], job: _PieceJob) -> list[_Piece]:
    """One Spark task per piece; their results in piece order."""
    if not chunks:
        return []
    by_position = {c.position: c for c in chunks}
    frame = ctx.spark.range(len(chunks), numPartitions=len(chunks)).mapInArrow(_tasks(job, by_position), _RESULT_DDL)
    results = sorted((r.asDict() for r in frame.collect()), key=lambda r: r["piece"])
    checks = {c.id: c for c in job.suite.checks} if job.suite is not None else {}
    return [
        _Piece(
            r["read"],
            r["staged"],
            r["kept"],
            _table(r["rejects"]),
            _table(r["quarantined"]),
            {o["id"]: _outcome_from(checks[o["id"]], o) for o in json.loads(r["outcomes"])},
        )
        for r in results
    ]


def _tasks(job: _PieceJob, chunks: dict[int, Chunk]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for position in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([job.run(chunks[position])], schema=_RESULT)

    return run


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _outcome_json(outcome: quality.CheckOutcome) -> dict:
    return {
        "id": outcome.check.id,
        "success": outcome.success,
        "elements": outcome.element_count,
        "unexpected": outcome.unexpected_count,
        "action": outcome.action,
        "values": list(outcome.failing_values),
        "error": outcome.error,
    }


def _outcome_from(check: Check, data: dict) -> quality.CheckOutcome:
    return quality.CheckOutcome(
        check,
        data["success"],
        data["elements"],
        data["unexpected"],
        data["action"],
        tuple(data["values"]),
        data["error"],
    )


def _unique_outcome(ctx: JobContext, check: Check, side: Path, rows: int, resumed: bool) -> quality.CheckOutcome:
    """`expect_column_values_to_be_unique` on the whole column, as Great Expectations counts it: every row whose
    (non-null) value occurs more than once fails; the failing values are the first of them in the rows' order."""
    column = check.column
    failing: list = []
    unexpected = 0
    if any(side.glob("part-*.parquet")):
        from pyspark.sql import functions as F

        values = ctx.spark.read.parquet(side.as_uri()).where(F.col(column).isNotNull())
        repeated = values.groupBy(column).count().where(F.col("count") > 1)
        unexpected = int(repeated.agg(F.sum("count")).first()[0] or 0)
        if unexpected:
            first = values.join(repeated.select(column), column).orderBy(*ORDER_COLUMNS).limit(MAX_DETAIL_VALUES)
            failing = [quality.plain(r[0]) for r in first.select(column).collect()]
    success = unexpected == 0
    return quality.CheckOutcome(
        check, success, rows, unexpected, quality.action_of(check, success, resumed=resumed), tuple(failing)
    )


def _counts(
    batch_id: int, source: SourceFile, files: list[BatchFile], chunks: list[Chunk], pieces: list[_Piece]
) -> list[FileReport]:
    """Per-file counts (quarantined rows moved out of `staged`); raises unless read = staged + rejected per file."""
    by_file = {bf.file: FileReport(bf.file, source.name, 0, 0, 0) for bf in files}
    for chunk, piece in zip(chunks, pieces, strict=True):
        report = by_file[chunk.file.file]
        report.read += piece.read
        report.staged += piece.kept
        report.quarantined += piece.staged - piece.kept
        report.rejected += piece.rejects.num_rows
    for report in by_file.values():
        if report.read != report.staged + report.quarantined + report.rejected:
            raise AssertionError(
                f"{report.file}: read {report.read} != staged {report.staged + report.quarantined} + rejected "
                f"{report.rejected}"
            )
        if report.rejected:
            log.warning("batch %s: %s: %d of %d rejected", batch_id, report.file, report.rejected, report.read)
    return list(by_file.values())
