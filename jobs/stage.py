"""Stage: parse a micro-batch's landing files into `staging.<source>` Delta tables.

Each file is matched to its declared source (`schemas.sources`) by name and parsed field by field with the
declared types. Delimited files are split into numbered lines and typed in the driver with Arrow's C++ kernels
(`jobs.delimited`; a round trip through Spark cost more than five times as long). A line that does not parse
(wrong number of fields, a value that is not of its type, an empty required field) goes to `staging.rejects`
with the file, the line number and the reason; nothing is dropped silently: for every file, lines read = lines
staged + lines rejected. The last line of a file that does not end with a line ending is rejected too: every source
file ends its lines with one, so such a line may have been cut short (a truncated delivery).

The stage reads each file as the collector registered it: a file that is no longer in the landing zone (renamed,
moved or deleted after it was collected), or whose bytes are not the ones registered (another file put in its
place), stops the stage with a `LandingFileError` that names it and says what to do; nothing of it is staged until
it is back. An empty file (0 bytes) is staged as no lines, with a warning, and is never a duplicate of another one.

The two sources that are not delimited (Batch1 only) follow the same rules (`jobs.fields` types every value):
- FINWIRE files (`jobs.finwire`): every line is a CMP, SEC or FIN record (characters 16-18), cut into the fields
  declared in `schemas.finwire`, in Arrow, into `staging.finwire_cmp`, `staging.finwire_sec` and
  `staging.finwire_fin`. A line of another record type, of a length its type does not have, or with a field
  that does not fit its type is rejected.
- CustomerMgmt.xml (`jobs.customer_mgmt`): read in the driver with Python's XML parser (row tag `TPCDI:Action`,
  every value read as text, surrounding spaces kept), numbered in file order (`action_seq`), then typed in Arrow
  into `staging.customermgmt`, one row per action. An action without C_ID, with a bad ActionTS or ActionType, a
  value not of its type, or XML the parser cannot read is rejected (`line` holds the action as JSON, or the
  unreadable text); a malformed action does not keep the others of its file from being read.

A delimited source or FINWIRE whose files hold at least `STREAMDI_EXECUTOR_PARSE_BYTES` is parsed, checked and
written by Spark's executors in pieces of whole lines, with the same functions (`jobs.stage_executors`); its rows never
pass through the driver, and what it records is what the driver's parse records.

Where the parts are: which source a file is, and its bytes and numbered lines as registered: `jobs.landing`; the
parse of one source's files per kind, with its rejects and per-file counts: `jobs.stage_parse` (typing: pure
`jobs.delimited`, `jobs.finwire`, `jobs.customer_mgmt.check_actions`); the executors' parse: `jobs.stage_executors`
(pieces: `jobs.landing_chunks`); this module is the step (`run`): the parses overlapped with the commits, the
ordering contract and the suites before each staging table's commit.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from jobs import audit_figures, ordering, stage_executors
from jobs.landing import FINWIRE, is_audit, nondelimited_source_for_file, source_for_file
from jobs.stage_executors import Written
from jobs.stage_parse import (
    FileReport,
    Parsed,
    concat_as,
    parse_delimited_piece,
    parse_finwire_piece,
    rows_per_file,
    stage_customer_mgmt,
    stage_finwire,
    stage_source,
)
from schemas.model import SourceFile, Table
from schemas.ordering import Ordering, contract_for
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.sources import ALL_SOURCES
from schemas.staging import FINWIRE_TABLES, REJECTS
from streamdi import quality
from streamdi.batchlog import BatchFile, Registered
from streamdi.context import JobContext
from streamdi.pools import kept_pool

log = logging.getLogger(__name__)
T_ = TypeVar("T_")


@dataclass
class StageReport:
    batch_id: int
    files: list[FileReport] = field(default_factory=list)
    checks: list[quality.CheckOutcome] = field(default_factory=list)
    halts: list[str] = field(default_factory=list)  # what halted the batch (empty: it goes on)
    duplicates: dict[str, str] = field(default_factory=dict)  # file not staged -> the earlier file it repeats

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
        return [f.file for f in self.files if f.source is None and is_audit(f.file) and f.file not in self.duplicates]

    @property
    def unknown_files(self) -> list[str]:
        """Files that match no declared source (registered in the batch log, not staged)."""
        return [
            f.file for f in self.files if f.source is None and not is_audit(f.file) and f.file not in self.duplicates
        ]


def run(
    ctx: JobContext,
    batch_id: int,
    files: list[BatchFile],
    *,
    attempt: int = 0,
    registered: Registered | None = None,
) -> StageReport:
    """Stage every file of micro-batch `batch_id`: one app-transaction commit per staging table.

    Each staging table's rows are validated with its suite (`expectations/staging/`, `streamdi.quality`) before
    the commit: quarantined rows go to `quality.quarantine` instead, and a failed halt check keeps the table's
    rows out and is listed in `StageReport.halts` (the caller halts the batch). `attempt` is the number of
    times an operator resumed this stage: from 1 on, halt checks only warn (`overridden`).

    The files of one source are parsed together: a delimited source (`jobs.delimited`) and FINWIRE
    (`jobs.finwire`) in Arrow, CustomerMgmt.xml with Python's XML parser, typed in Arrow. Two sources are
    parsed at a time while the previous one is committed (`_overlapped`), the largest first (`_largest_first`), and
    the commits start in that order (then rejects), made by two threads while the next table is checked
    (`_Commits`). Raises if the counts of a file do not reconcile
    (lines or actions read != staged + rejected), which would be a bug, not bad data.

    `registered` answers what the stage asks of the files registered before (`streamdi.batchlog.Registered`; None:
    nothing was). A data file whose bytes repeat a file of the same TPC-DI batch registered before it (by an earlier
    micro-batch, or earlier in this one's order) is a duplicate
    delivery (a producer's retry, a piece sent twice): it is not staged, and `StageReport.duplicates` names it with
    the file it repeats. Audit files are always staged (their figures are keyed by their path). Files of different
    TPC-DI batches never count as duplicates (Prospect.csv is a full snapshot in every batch, and may repeat).

    Each delimited source's rows are checked against its ordering contract (`schemas.ordering`, `jobs.ordering`)
    before its suite: a totally ordered source's keys must increase across its parts (the staged keys of the parts'
    groups registered by earlier micro-batches are read for it), a violation halts the
    batch; a part whose predecessor is not registered in this or an earlier micro-batch follows
    `missing_part_policy`.
    """
    report = StageReport(batch_id)
    registered = registered or Registered(None, batch_id)
    seen = registered.copies(files)
    by_source: dict[str, tuple[SourceFile, list[BatchFile]]] = {}
    finwire_files: list[BatchFile] = []
    xml_files: list[BatchFile] = []
    for bf in files:
        kind = nondelimited_source_for_file(bf.file, bf.source_batch)
        source = source_for_file(bf.file, bf.source_batch) if kind is None else None
        if (source is not None or kind is not None) and bf.size_bytes == 0:
            log.warning("batch %s: %s is empty (0 bytes): nothing to stage", batch_id, bf.file)
        elif source is not None or kind is not None:  # an empty file repeats nothing: it holds no lines
            first = seen.setdefault((bf.source_batch, bf.sha256), bf.file)
            if first != bf.file:
                log.warning(
                    "batch %s: %s repeats %s byte for byte; not staged (a duplicate delivery)", batch_id, bf.file, first
                )
                report.duplicates[bf.file] = first
                report.files.append(FileReport(bf.file, None, 0, 0, 0))
                continue
        if kind is not None:
            (finwire_files if kind == FINWIRE else xml_files).append(bf)
            continue
        if source is None:
            if not is_audit(bf.file):
                log.warning("batch %s: %s matches no declared source; registered but not staged", batch_id, bf.file)
            report.files.append(FileReport(bf.file, None, 0, 0, 0))
            continue
        by_source.setdefault(source.name, (source, []))[1].append(bf)
    # One parse per source; each returns ([(staging table, rows)], rejected rows, counts).
    parses: list[tuple[str, int, Callable[[], Parsed]]] = []  # (what, bytes, parse)
    for name in sorted(by_source):
        source, group = by_source[name]
        parse = functools.partial(_stage_delimited, ctx, batch_id, source, group, attempt > 0)
        parses.append((name, _bytes(group), parse))
    if finwire_files:
        parse = functools.partial(_stage_finwire, ctx, batch_id, finwire_files, attempt > 0)
        parses.append((FINWIRE, _bytes(finwire_files), parse))
    if xml_files:
        parse = functools.partial(stage_customer_mgmt, ctx, batch_id, xml_files)
        parses.append(("CustomerMgmt", _bytes(xml_files) * XML_BYTE_COST, parse))
    rejects: list[pa.Table] = []
    quarantined: list[pa.Table] = []
    results: list[pa.Table] = []
    parsed = _overlapped([_timed(batch_id, what, parse) for what, _, parse in _largest_first(parses)])
    missing = registered.missing_predecessors([bf.file for bf in files])
    validator = quality.validator()
    commits = _Commits()
    for tables, rejected, counts in parsed:
        for table, rows in tables:
            source = _DELIMITED_BY_TABLE.get(table.name)
            if isinstance(rows, Written):  # parsed, checked and written by Spark's executors
                if _written_checked(
                    ctx, report, rows, counts, source, missing, registered, results, quarantined, attempt
                ):
                    commits.submit(ctx.lake.append_written, table, app_id=f"stage/{table.name}", version=batch_id)
                else:
                    ctx.lake.discard_written(table, app_id=f"stage/{table.name}", version=batch_id)
                continue
            if source is not None:
                contract = _check_contract(ctx, table, rows, source, missing, registered, resumed=attempt > 0)
                _record_contract(report, results, table, contract, attempt)
                if contract.halts:  # held back, like a suite's halt: the operator's resume re-stages them
                    _count_removed(counts, rows, rows.slice(0, 0), held=True)
                    continue
            suite = validator.suite_for(table)
            if suite is not None:
                checked = validator.validate(suite, rows, batch_id, resumed=attempt > 0)
                _record_suite(report, results, quarantined, checked, attempt)
                kept = checked.kept.slice(0, 0) if checked.halts else checked.kept
                _count_removed(counts, rows, kept, held=bool(checked.halts))
                rows = kept
                if checked.halts:
                    continue  # the batch halts: these rows wait for the operator (resume re-stages them)
            commits.submit(ctx.lake.append, table, rows, app_id=f"stage/{table.name}", version=batch_id)
        report.files.extend(counts)
        rejects.append(rejected)
    commits.wait_all()
    if rejects:
        ctx.lake.append(REJECTS, concat_as(rejects, REJECTS), app_id="stage/rejects", version=batch_id)
    _commit_quality(ctx, batch_id, attempt, results, quarantined)
    audit_figures.stage(ctx, batch_id, files)  # expected counts of *_audit.csv files, for `streamdi audit`
    arrival = {bf.file: i for i, bf in enumerate(files)}
    report.files.sort(key=lambda f: arrival[f.file])
    return report


_DELIMITED_BY_TABLE = {s.staging.name: s for s in ALL_SOURCES}


Staged = Parsed | tuple[list[tuple[Table, Written]], pa.Table, list[FileReport]]


def _stage_delimited(
    ctx: JobContext, batch_id: int, source: SourceFile, files: list[BatchFile], resumed: bool
) -> Staged:
    """One delimited source's parse: on Spark's executors when its files are large and its checks allow it
    (`jobs.stage_executors`), else in the driver (`jobs.stage_parse.stage_source`)."""
    parse = functools.partial(parse_delimited_piece, source)
    staged = _on_executors(
        ctx, batch_id, source.name, [source.staging], parse, files, resumed, contract_for(source.name)
    )
    return staged or stage_source(ctx, batch_id, source, files)


def _stage_finwire(ctx: JobContext, batch_id: int, files: list[BatchFile], resumed: bool) -> Staged:
    """FINWIRE's parse: on Spark's executors when its files are large (`jobs.stage_executors`), else in the driver
    (`jobs.stage_parse.stage_finwire`)."""
    tables = list(FINWIRE_TABLES.values())
    staged = _on_executors(ctx, batch_id, FINWIRE, tables, parse_finwire_piece, files, resumed)
    return staged or stage_finwire(ctx, batch_id, files)


def _on_executors(
    ctx: JobContext,
    batch_id: int,
    source: str,
    tables: list[Table],
    parse: stage_executors.PieceParser,
    files: list[BatchFile],
    resumed: bool,
    contract: Ordering | None = None,
) -> Staged | None:
    """The executors' parse of a source's `files` into its staging `tables`, or None when the files are smaller than
    `STREAMDI_EXECUTOR_PARSE_BYTES` or the source's contract or checks need the whole table in the driver (logged)."""
    if _bytes(files) < ctx.settings.executor_parse_bytes:
        return None  # decided before asking for the suites, which wait for Great Expectations' import
    suites = {t.name: (t, quality.validator().suite_for(t)) for t in tables}
    why = stage_executors.parse_here([suite for _, suite in suites.values()], contract)
    if why is not None:
        log.info("batch %s: %s is parsed in the driver: %s", batch_id, source, why)
        return None
    return stage_executors.stage_on_executors(ctx, batch_id, source, parse, suites, files, resumed=resumed)


def _written_checked(
    ctx: JobContext,
    report: StageReport,
    written: Written,
    counts: list[FileReport],
    source: SourceFile | None,
    missing: dict[str, str],
    registered: Registered,
    results: list[pa.Table],
    quarantined: list[pa.Table],
    attempt: int,
) -> bool:
    """The ordering contract's checks and the suite's merged outcomes of rows written by the executors, recorded as
    for rows parsed in the driver; whether the rows are committed (False: a halt holds them back, and every row the
    files staged counts as held, as in the driver's way)."""
    table = written.table
    held = False
    if source is not None:  # FINWIRE declares no ordering contract
        empty = table.arrow_schema().empty_table()
        contract = _check_contract(
            ctx, table, empty, source, missing, registered, resumed=attempt > 0, files=written.files_with_rows
        )
        _record_contract(report, results, table, contract, attempt)
        held = bool(contract.halts)
    if not held and written.validated is not None:
        _record_suite(report, results, quarantined, written.validated, attempt)
        held = bool(written.validated.halts)
    if held:
        for file in counts:  # every parsed row of this table is held, the quarantined ones too
            parsed, kept = written.per_file.get(file.file, (0, 0))
            file.staged -= kept
            file.quarantined -= parsed - kept
            file.held += parsed
        return False
    return True


def _record_contract(
    report: StageReport, results: list[pa.Table], table: Table, contract: quality.Validated, attempt: int
) -> None:
    """A staging table's ordering-contract outcomes into the report and the quality results."""
    report.checks.extend(contract.outcomes)
    report.halts.extend(
        f"{o.describe(table.qualified_name)}: {'; '.join(o.failing_values[:3])}" for o in contract.halts
    )
    if contract.outcomes:
        results.append(contract.result_rows(report.batch_id, attempt))


def _record_suite(
    report: StageReport,
    results: list[pa.Table],
    quarantined: list[pa.Table],
    checked: quality.Validated,
    attempt: int,
) -> None:
    """A staging table's suite outcomes into the report and the quality results, its quarantined rows aside."""
    report.checks.extend(checked.outcomes)
    report.halts.extend(o.describe(checked.suite.name) for o in checked.halts)
    results.append(checked.result_rows(report.batch_id, attempt))
    quarantined.append(checked.quarantined)


def _check_contract(
    ctx: JobContext,
    table: Table,
    rows: pa.Table,
    source: SourceFile,
    missing: dict[str, str],
    registered: Registered,
    *,
    resumed: bool,
    files: set[str] | None = None,
) -> quality.Validated:
    """The ordering contract's checks on a staging table's rows (`jobs.ordering.check_staged`), with the keys of the
    same parts' groups staged by earlier micro-batches."""
    contract = contract_for(source.name)
    earlier = None
    if contract.kind == "total" and rows.num_rows:
        neighbours = registered.group_files(pc.unique(rows["source_file"]).to_pylist())
        if neighbours and ctx.lake.exists(table):
            earlier = ctx.lake.read_where(
                table, pc.field("source_file").isin(neighbours), ["source_file", "line_no", contract.key]
            )
    return ordering.check_staged(
        table,
        rows,
        contract,
        earlier,
        missing,
        missing_policy=ctx.settings.missing_part_policy,
        resumed=resumed,
        files=files,
    )


def _count_removed(counts: list[FileReport], rows: pa.Table, kept: pa.Table, *, held: bool) -> None:
    """Move the rows validation took out of `rows` from each file's staged count to quarantined (or held)."""
    before = rows_per_file(rows)
    after = rows_per_file(kept)
    for report in counts:
        removed = before.get(report.file, 0) - after.get(report.file, 0)
        if removed:
            report.staged -= removed
            if held:
                report.held += removed
            else:
                report.quarantined += removed


def _commit_quality(
    ctx: JobContext, batch_id: int, attempt: int, results: list[pa.Table], quarantined: list[pa.Table]
) -> None:
    """The suites' results and the quarantined rows of this micro-batch, once per attempt (a rerun of the same
    attempt is skipped; quarantined rows are keyed, so a resumed attempt upserts the same rows again)."""
    if results:
        ctx.lake.append(
            QUALITY_RESULTS, concat_as(results, QUALITY_RESULTS), app_id=f"stage/quality/{attempt}", version=batch_id
        )
    rows = concat_as(quarantined, QUARANTINE) if quarantined else None
    if rows is not None and rows.num_rows:
        ctx.lake.upsert(QUARANTINE, rows, app_id=f"stage/quarantine/{attempt}", version=batch_id)


def _bytes(files: list[BatchFile]) -> int:
    return sum(bf.size_bytes for bf in files)


def _largest_first(parses: list[tuple[str, int, Callable[[], T_]]]) -> list[tuple[str, int, Callable[[], T_]]]:
    """The parses in the order they are started and their tables committed: the largest (by the bytes of their files,
    weighted by what a byte costs) first, ties in the given order. Two parses run at a time and the caller takes
    them in this order, so the order decides how well the two keep both cores busy: with the sources by name, SF 10
    Batch1's DailyMarket (the largest) held the caller while the next parses were done and waiting, and FINWIRE (the
    second largest) ran alone at the end; about 9 s of the stage used one core. The order depends only on the
    files, so it is the same for the same micro-batch."""
    return sorted(parses, key=lambda p: -p[1])


def _timed(batch_id: int, what: str, parse: Callable[[], T_]) -> Callable[[], T_]:
    def timed() -> T_:
        started = time.perf_counter()
        result = parse()
        log.info("batch %s: %s parsed in %.2fs", batch_id, what, time.perf_counter() - started)
        return result

    return timed


# What a byte of CustomerMgmt.xml costs to parse (Python's XML parser) against a byte of a delimited or FINWIRE file
# (Arrow's kernels): the weight of the XML in `_largest_first`.
XML_BYTE_COST = 4

PARSES_IN_FLIGHT = 2  # parses running at a time
PARSES_QUEUED = 4  # parses started or waiting for a thread, ahead of the caller's commits


COMMITS_IN_FLIGHT = 2  # staging tables whose rows wait for (or are in) their commit while the next are validated


class _Commits:
    """The staging tables' commits of one micro-batch, started in the order submitted, `COMMITS_IN_FLIGHT` at a time,
    by threads kept for the process's life (the lake's Delta table handles are caught up, not opened again), while
    the caller validates the next table: a commit (delta-rs, which releases the GIL) overlaps the next table's
    ordering check and suite (Python), and another commit. Each table is its own Delta table and app transaction, so
    their order does not matter; two at a time end the stage sooner: SF 10 Batch1's last four commits (1.2 M-3.3 M
    rows each) ran back to back for 3.6 s after the last parse, one core busy. At most `COMMITS_IN_FLIGHT` wait, so
    a large stage holds no more rows than that in memory.
    `wait_all` raises the first failure; the commits after a failed one still run (each is its own app
    transaction, and a rerun skips the ones made)."""

    def __init__(self) -> None:
        self._pool = kept_pool("stage-commit", COMMITS_IN_FLIGHT)
        self._pending: deque[Future] = deque()
        self._done: list[Future] = []

    def submit(self, commit: Callable[..., object], *args: object, **kwargs: object) -> None:
        while len(self._pending) >= COMMITS_IN_FLIGHT:
            first = self._pending.popleft()
            wait([first])
            self._done.append(first)
        self._pending.append(self._pool.submit(commit, *args, **kwargs))

    def wait_all(self) -> None:
        wait(self._pending)
        for future in [*self._done, *self._pending]:
            future.result()


def _overlapped(parses: list[Callable[[], T_]]) -> Iterator[T_]:
    """The results of `parses`, in order, computed `PARSES_IN_FLIGHT` at a time in threads, so that one source's
    parse (Arrow's kernels release the GIL) and the caller's checks and commits of the previous source overlap another
    source's parse. Commits start in the fixed order (`_Commits`); at most `PARSES_QUEUED` parsed sources wait for the
    caller.

    The parses start when this is called, not when the first result is asked for: the caller builds its
    data-quality validator meanwhile, which waits for Great Expectations' import (~4 s of mostly one core in a new
    process), and the parses use the other core. SF 3 Batch1's stage in a new process (no Spark), two runs each:
    12.2-12.5 s when the parses waited for the validator, 10.1-10.3 s now."""
    pool = ThreadPoolExecutor(max_workers=PARSES_IN_FLIGHT, thread_name_prefix="stage")
    todo = iter(parses)
    running = deque(pool.submit(parse) for parse in itertools.islice(todo, PARSES_QUEUED))

    def results() -> Iterator[T_]:
        try:
            while running:
                result = running.popleft().result()
                following = next(todo, None)
                if following is not None:
                    running.append(pool.submit(following))
                yield result
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return results()
