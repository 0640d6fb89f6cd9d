"""A large source of lines parsed, checked and written where Spark's executors run, not in the driver.

The stage (`jobs.stage`) hands a delimited source or FINWIRE here when its files of a micro-batch hold at least
`STREAMDI_EXECUTOR_PARSE_BYTES` and `parse_here` finds nothing that keeps it in the driver. The driver cuts the files
into pieces of whole lines (`jobs.landing_chunks`: one pass that also checks each file's SHA-256, in constant memory).
One Spark task per piece, or per run of consecutive small pieces up to the same size (FINWIRE's quarters are small
files; `mapInArrow` over the tasks' numbers) then does, with the same functions as the driver's parse:
- reads its pieces (checking their CRCs), splits them into lines numbered from each piece's first line, and the lines
  into typed fields (`jobs.stage_parse.parse_delimited_piece`, `parse_finwire_piece`): the same rows and reasons,
  for each staging table of the source (FINWIRE has three: CMP, SEC and FIN records);
- runs each table's row-wise checks on its rows (`streamdi.quality`, the same suites, Great Expectations' pandas
  engine in the executor's Python);
- writes the rows it keeps of each table as one Parquet file, named after the task, into that table's scratch
  directory (`Lake.scratch_dir`);
- returns only what is small: its counts, its rejected and quarantined rows, and its checks' outcomes.

The driver merges the outcomes as a whole-table validation would give them (`quality.merged_outcome`), runs the
checks that need the whole column (`expect_column_values_to_be_unique`) as Spark aggregations over a side file of
each task's checked columns, and the stage commits the tasks' files in order (`Lake.append_written`). So the
staged rows, rejects, quarantined rows and quality results equal the driver's parse of the same files (the tests
compare them), and no row of the source passes through the driver.

A source with a check this cannot split (one that compares rows, other than uniqueness without a row condition;
`mostly`; a uniqueness check that quarantines), or a totally ordered source (its contract check reads the keys in
order), is parsed in the driver (`parse_here` says why), as is CustomerMgmt.xml (XML, not lines).
"""

from __future__ import annotations

import logging
import pickle
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.landing_chunks import Chunk, plan_chunks, read_chunk
from jobs.stage_parse import FileReport, concat_as, empty_rows, rows_per_file
from schemas.model import Table
from schemas.ordering import Ordering
from schemas.quality import QUARANTINE
from schemas.staging import REJECTS
from streamdi import quality
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext
from streamdi.errors import LandingFileError
from streamdi.suites import MAX_DETAIL_VALUES, Check, Suite

log = logging.getLogger(__name__)

WHOLE_COLUMN = "expect_column_values_to_be_unique"  # the one cross-row check run here, as a Spark aggregation
UNIQUE_SUFFIX = "-unique"  # the side files of the checked columns, beside the scratch directory
ORDER_COLUMNS = ("_task", "_row")  # in the side files: where each value stands (task, row in it)


@dataclass
class Written:
    """A staging table's rows staged by the executors: waiting in `Lake.scratch_dir` for `Lake.append_written`."""

    table: Table
    per_file: dict[str, tuple[int, int]]  # source file -> (rows parsed, rows kept after quarantine)
    validated: quality.Validated | None  # the suite's merged outcomes and quarantined rows (kept: no rows)

    @property
    def files_with_rows(self) -> set[str]:
        """The source files with parsed rows in this table (before the checks), for the ordering contract."""
        return {file for file, (parsed, _) in self.per_file.items() if parsed}


# (a piece's bytes, its file, its first line's number, whether it ends its file, batch id) -> ({staging table's name:
# staged rows}, rejected rows, lines read): a module-level function (or a partial of one), which Spark sends to the
# executors by name
PieceParser = Callable[[bytes, BatchFile, int, bool, int], tuple[dict[str, pa.Table], pa.Table, int]]


def parse_here(suites: list[Suite | None], contract: Ordering | None = None) -> str | None:
    """Why a large source is parsed in the driver all the same (None: on the executors): its ordering `contract` or
    a check of its tables' `suites` needs the whole table at once. (The caller compares the files' size with
    `STREAMDI_EXECUTOR_PARSE_BYTES`.)"""
    if contract is not None and contract.kind != "bag":
        return "its ordering contract compares keys across the whole table"
    for check in (c for suite in suites if suite is not None for c in suite.checks):
        if "mostly" in check.kwargs or "row_condition" in check.kwargs:
            return f"check {check.id} counts over the whole table (mostly, row_condition)"
        cross_row = check.expectation in quality.CROSS_ROW
        if cross_row and (check.expectation != WHOLE_COLUMN or check.policy == "quarantine"):
            return f"check {check.id} ({check.expectation}, {check.policy}) needs the whole table in one place"
    return None


def stage_on_executors(
    ctx: JobContext,
    batch_id: int,
    source: str,
    parse: PieceParser,
    suites: dict[str, tuple[Table, Suite | None]],
    files: list[BatchFile],
    *,
    resumed: bool,
) -> tuple[list[tuple[Table, Written]], pa.Table, list[FileReport]]:
    """Parse, check and write the `files` of `source` on Spark's executors (the module's doc): ([(each staging table,
    its written rows)], the rejected rows, per-file counts). `suites`: each staging table's name -> (the table, its
    suite). Raises `LandingFileError` for a file gone or changed since it was registered, and an AssertionError when
    a file's counts do not reconcile (a bug)."""
    chunks = plan_chunks(ctx.settings.landing_dir, batch_id, files, ctx.settings.executor_parse_chunk_bytes)
    outputs = []
    for name, (table, suite) in suites.items():
        scratch = ctx.lake.scratch_dir(table, f"stage/{table.name}", batch_id)
        side = scratch.with_name(scratch.name + UNIQUE_SUFFIX)
        for directory in (scratch, side):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        checks = suite.checks if suite is not None else ()
        row_wise = tuple(c for c in checks if c.expectation not in quality.CROSS_ROW)
        outputs.append(
            _Output(
                name,
                table,
                replace(suite, checks=row_wise) if suite is not None and row_wise else None,
                str(scratch),
                str(side),
                [c.column for c in checks if c.expectation == WHOLE_COLUMN],
            )
        )
    job = _TaskJob(str(ctx.settings.landing_dir), batch_id, parse, tuple(outputs), resumed)
    tasks = _tasks_of(chunks, ctx.settings.executor_parse_chunk_bytes)
    results = _run_tasks(ctx, tasks, job)
    log.info(
        "batch %s: %s parsed by Spark's executors: %d pieces in %d tasks", batch_id, source, len(chunks), len(tasks)
    )
    written = []
    for output in outputs:
        table, suite = suites[output.name]
        mine = [r.tables[output.name] for r in results]
        per_file: dict[str, tuple[int, int]] = {}
        for part in mine:
            for file, (parsed, kept) in part.per_file.items():
                before = per_file.get(file, (0, 0))
                per_file[file] = (before[0] + parsed, before[1] + kept)
        validated = None
        if suite is not None:
            outcomes = [
                _unique_outcome(ctx, check, Path(output.side), sum(p.staged for p in mine), resumed)
                if check.expectation == WHOLE_COLUMN
                else quality.merged_outcome(check, [p.outcomes[check.id] for p in mine], resumed=resumed)
                for check in suite.checks
            ]
            quarantined = concat_as([p.quarantined for p in mine], QUARANTINE) if mine else empty_rows(QUARANTINE)
            validated = quality.Validated(suite, empty_rows(table), quarantined, outcomes)
        shutil.rmtree(output.side, ignore_errors=True)
        written.append((table, Written(table, per_file, validated)))
    rejects = concat_as([r.rejects for r in results], REJECTS) if results else empty_rows(REJECTS)
    return written, rejects, _counts(batch_id, source, files, results)


def _tasks_of(chunks: list[Chunk], task_bytes: int) -> list[list[Chunk]]:
    """The pieces grouped into tasks, in order: consecutive pieces (of one file or of several small ones) up to
    `task_bytes` together, so that a source of many small files (FINWIRE's quarters) is not one task per file."""
    tasks: list[list[Chunk]] = []
    size = 0
    for chunk in chunks:
        length = chunk.end - chunk.start
        if tasks and size + length <= task_bytes:
            tasks[-1].append(chunk)
            size += length
        else:
            tasks.append([chunk])
            size = length
    return tasks


@dataclass
class _TablePart:
    """One staging table's share of a task."""

    staged: int  # parsed rows (before the checks)
    per_file: dict[str, tuple[int, int]]  # source file -> (rows parsed, rows kept)
    quarantined: pa.Table
    outcomes: dict[str, quality.CheckOutcome]


@dataclass
class _TaskResult:
    """What one task returns to the driver (pickled: small)."""

    read: dict[str, int]  # source file -> lines read
    rejects: pa.Table
    tables: dict[str, _TablePart]


@dataclass(frozen=True)
class _Output:
    """A staging table a task writes: its row-wise suite, its scratch directory and its side files' directory."""

    name: str
    table: Table
    suite: Suite | None  # the row-wise checks
    scratch: str
    side: str
    unique_columns: list[str]


@dataclass(frozen=True)
class _TaskJob:
    """Everything a task needs besides its pieces (sent to the executors with the function)."""

    landing_dir: str
    batch_id: int
    parse: PieceParser
    outputs: tuple[_Output, ...]
    resumed: bool

    def run(self, position: int, chunks: list[Chunk]) -> _TaskResult:
        """Parse, check and write task `position`'s pieces (one Parquet file per table, named after the task)."""
        parts: dict[str, list[pa.Table]] = {output.name: [] for output in self.outputs}
        bad, read = [], {}
        for chunk in chunks:
            data = read_chunk(Path(self.landing_dir), self.batch_id, chunk)
            staged, rejected, n = self.parse(data, chunk.file, chunk.first_line, chunk.ends_file, self.batch_id)
            del data
            for name, rows in staged.items():
                parts[name].append(rows)
            bad.append(rejected)
            read[chunk.file.file] = read.get(chunk.file.file, 0) + n
        tables = {
            output.name: self._write(output, position, concat_as(parts.pop(output.name), output.table))
            for output in self.outputs
        }
        return _TaskResult(read, concat_as(bad, REJECTS), tables)

    def _write(self, output: _Output, position: int, staged: pa.Table) -> _TablePart:
        """One table's rows of a task: its side file for the uniqueness checks, its checks, its Parquet file."""
        if output.unique_columns and staged.num_rows:  # the checked columns, and where each row stands
            side = staged.select(output.unique_columns)
            side = side.append_column("_task", pa.array([position] * staged.num_rows, pa.int64()))
            side = side.append_column("_row", pa.array(range(staged.num_rows), pa.int64()))
            pq.write_table(side, Path(output.side) / f"part-{position:05d}.parquet")
        kept, quarantined, outcomes = staged, empty_rows(QUARANTINE), []
        if output.suite is not None:
            checked = quality.local_validator().validate(output.suite, staged, self.batch_id, resumed=self.resumed)
            kept, quarantined, outcomes = checked.kept, checked.quarantined, checked.outcomes
        if kept.num_rows:
            path = Path(output.scratch) / f"part-{position:05d}.parquet"
            pq.write_table(concat_as([kept], output.table), path, compression="snappy")
        parsed, left = rows_per_file(staged), rows_per_file(kept)
        return _TablePart(
            staged.num_rows,
            {file: (n, left.get(file, 0)) for file, n in parsed.items()},
            concat_as([quarantined], QUARANTINE),
            {o.check.id: o for o in outcomes},
        )


_RESULT = pa.schema([("task", pa.int64()), ("result", pa.binary())])
_RESULT_DDL = "task long, result binary"  # the same, for Spark


def _run_tasks(ctx: JobContext, tasks: list[list[Chunk]], job: _TaskJob) -> list[_TaskResult]:
    """One Spark task per group of pieces; their results in order."""
    if not tasks:
        return []
    frame = ctx.spark.range(len(tasks), numPartitions=len(tasks)).mapInArrow(_function(job, tasks), _RESULT_DDL)
    try:
        rows = sorted(frame.collect(), key=lambda r: r["task"])
    except Exception as exc:
        # a landing file gone or changed under an executor: the same error (and advice) as in the driver, not Spark's
        found = re.search(r"LandingFileError: (.+)", str(exc))
        if found:
            raise LandingFileError(found.group(1).strip()) from exc
        raise
    return [pickle.loads(r["result"]) for r in rows]


def _function(
    job: _TaskJob, tasks: list[list[Chunk]]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for position in batch.column(0).to_pylist():
                result = pickle.dumps(job.run(position, tasks[position]))
                yield pa.RecordBatch.from_pylist([{"task": position, "result": result}], schema=_RESULT)

    return run


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


def _counts(batch_id: int, source: str, files: list[BatchFile], results: list[_TaskResult]) -> list[FileReport]:
    """Per-file counts (quarantined rows moved out of `staged`); raises unless read = staged + rejected per file."""
    by_file = {bf.file: FileReport(bf.file, source, 0, 0, 0) for bf in files}
    for result in results:
        for file, lines in result.read.items():
            by_file[file].read += lines
        for file, lines in rows_per_file(result.rejects).items():
            by_file[file].rejected += lines
        for part in result.tables.values():
            for file, (parsed, kept) in part.per_file.items():
                by_file[file].staged += kept
                by_file[file].quarantined += parsed - kept
    for report in by_file.values():
        if report.read != report.staged + report.quarantined + report.rejected:
            raise AssertionError(
                f"{report.file}: read {report.read} != staged {report.staged + report.quarantined} + rejected "
                f"{report.rejected}"
            )
        if report.rejected:
            log.warning("batch %s: %s: %d of %d rejected", batch_id, report.file, report.rejected, report.read)
    return list(by_file.values())
