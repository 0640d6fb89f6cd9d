"""Parse of one source's landing files into staging rows (`jobs.stage`), per source kind: delimited sources
(`stage_source`, typed by `jobs.delimited`), FINWIRE (`stage_finwire`, `jobs.finwire`) and CustomerMgmt.xml
(`stage_customer_mgmt`, `jobs.customer_mgmt`).

Each returns the staged rows per staging table, the rejected rows (`staging.rejects`, with file, line and reason)
and the per-file counts (`FileReport`), and raises unless every file reconciles (lines or actions read = staged +
rejected; a mismatch is a bug, not bad data). Where it sits: reads the files through `jobs.landing`; the step
(`jobs.stage.run`) runs the parses, validates each table and commits it. No commit here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import customer_mgmt, delimited, fields, finwire
from jobs.landing import CUSTOMER_MGMT_SOURCE, FINWIRE, file_lines, landing_lines, read_registered, with_file
from schemas.model import SourceFile, Table
from schemas.staging import CUSTOMER_MGMT, FINWIRE_TABLES, REJECTS
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext

log = logging.getLogger(__name__)


@dataclass
class FileReport:
    file: str
    source: str | None
    read: int
    staged: int
    rejected: int
    quarantined: int = 0  # moved to quality.quarantine by a quarantine check
    held: int = 0  # kept out because a halt check failed on its table (staged when the batch is resumed)


Parsed = tuple[list[tuple[Table, pa.Table]], pa.Table, list[FileReport]]  # ([(staging table, rows)], rejects, counts)


def stage_source(ctx: JobContext, batch_id: int, source: SourceFile, files: list[BatchFile]) -> Parsed:
    """Parse all `files` of one source: ([(its staging table, staged rows)], rejected rows, per-file counts)."""
    staged, rejected, read = [], [], []
    for bf in files:
        rows, bad, n_read = parse_file(read_registered(ctx, batch_id, bf), bf, source, batch_id)
        staged.append(rows)
        rejected.append(bad)
        read.append(n_read)
    staged_rows = concat_as(staged, source.staging) if staged else empty_rows(source.staging)
    rejects = concat_as(rejected, REJECTS) if rejected else empty_rows(REJECTS)
    counts = reconcile(batch_id, source.name, files, read, [staged_rows], rejects)
    return [(source.staging, staged_rows)], rejects, counts


def parse_file(
    data: bytes, bf: BatchFile, source: SourceFile, batch_id: int, *, first_line: int = 1, ends_file: bool = True
) -> tuple[pa.Table, pa.Table, int]:
    """`(staged, rejected, lines read)` of one file of a delimited source, or of a piece of it that starts at line
    `first_line` (`ends_file`: the piece is the file's end, `jobs.landing.file_lines`). A file whose every line has
    the declared width is split by Arrow's CSV reader (`jobs.delimited.split_whole`), any other line by line: the
    same rows, line numbers and reasons either way."""
    raws = delimited.split_whole(data, source)
    if raws is None:
        lines, undecodable = file_lines(data, bf, first_line=first_line, ends_file=ends_file)
        staged, rejected = parse_lines(lines, undecodable, source, batch_id)
        return staged, rejected, lines.num_rows + undecodable.num_rows
    n = len(raws[0])
    numbered = with_file(pa.table({"line_no": np.arange(first_line, first_line + n, dtype=np.int64)}), bf)
    parsed, bad = fields.split_checked(delimited.check_split(numbered, raws, source), [c.name for c in source.columns])
    return (*_with_lineage(parsed, [bad], source, batch_id), n)


def parse_lines(lines: pa.Table, undecodable: pa.Table, source: SourceFile, batch_id: int) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` rows of a delimited source's numbered lines (`jobs.landing.file_lines`): the staging
    table's columns, and `staging.rejects`' (the lines that did not parse, and the `undecodable` ones)."""
    parsed, bad = delimited.parse_delimited(lines, source)
    return _with_lineage(parsed, [bad, undecodable], source, batch_id)


def _with_lineage(
    parsed: pa.Table, bad: list[pa.Table], source: SourceFile, batch_id: int
) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)`: a delimited source's parsed rows in its staging table's columns, its bad lines in
    `staging.rejects`' columns, each with the micro-batch and the source."""
    staged = _with_batch(parsed, batch_id, source.name).select(source.staging.column_names)
    rejected = concat_as([_with_batch(t, batch_id, source.name).select(REJECTS.column_names) for t in bad], REJECTS)
    return staged, rejected


def _with_batch(checked: pa.Table, batch_id: int, source: str) -> pa.Table:
    n = checked.num_rows
    return checked.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), n)).append_column(
        "source", pa.repeat(pa.scalar(source, pa.large_string()), n)
    )


def reconcile(
    batch_id: int, source: str, files: list[BatchFile], read: list[int], staged: list[pa.Table], rejected: pa.Table
) -> list[FileReport]:
    """Per-file counts; raises unless read = staged + rejected for every file (a bug, not bad data)."""
    counts = []
    staged_per_file = [rows_per_file(t) for t in staged]  # counted once: FINWIRE has ~200 files a batch
    rejected_per_file = rows_per_file(rejected)
    for bf, n_read in zip(files, read, strict=True):
        n_staged = sum(per_file.get(bf.file, 0) for per_file in staged_per_file)
        n_rejected = rejected_per_file.get(bf.file, 0)
        if n_read != n_staged + n_rejected:
            raise AssertionError(f"{bf.file}: read {n_read} != staged {n_staged} + rejected {n_rejected}")
        if n_rejected:
            log.warning("batch %s: %s: %d of %d rejected", batch_id, bf.file, n_rejected, n_read)
        counts.append(FileReport(bf.file, source, n_read, n_staged, n_rejected))
    return counts


def stage_finwire(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> Parsed:
    """Parse all FINWIRE `files` of a batch (`jobs.finwire`): ([(CMP/SEC/FIN staging table, staged rows)], rejected
    rows, per-file counts)."""
    lines, undecodable, read = landing_lines(ctx, batch_id, files)
    staged, rejects = parse_finwire_lines(lines, undecodable, batch_id)
    counts = reconcile(batch_id, FINWIRE, files, read, list(staged.values()), rejects)
    return [(table, staged[table.name]) for table in FINWIRE_TABLES.values()], rejects, counts


def parse_finwire_lines(lines: pa.Table, undecodable: pa.Table, batch_id: int) -> tuple[dict[str, pa.Table], pa.Table]:
    """`({CMP/SEC/FIN staging table's name: staged rows}, rejected rows)` of FINWIRE's numbered lines."""
    parsed, rejected = finwire.parse_finwire(lines)
    staged = {
        FINWIRE_TABLES[code].name: _with_batch(rows, batch_id, FINWIRE).select(FINWIRE_TABLES[code].column_names)
        for code, rows in parsed.items()
    }
    rejects = concat_as(
        [_with_batch(t, batch_id, FINWIRE).select(REJECTS.column_names) for t in (rejected, undecodable)], REJECTS
    )
    return staged, rejects


def parse_delimited_piece(
    source: SourceFile, data: bytes, bf: BatchFile, first_line: int, ends_file: bool, batch_id: int
) -> tuple[dict[str, pa.Table], pa.Table, int]:
    """`parse_file` of a piece of a file, in the shape of a piece's parse on the executors
    (`jobs.stage_executors.PieceParser`): ({the staging table's name: staged rows}, rejected rows, lines read)."""
    staged, rejected, read = parse_file(data, bf, source, batch_id, first_line=first_line, ends_file=ends_file)
    return {source.staging.name: staged}, rejected, read


def parse_finwire_piece(
    data: bytes, bf: BatchFile, first_line: int, ends_file: bool, batch_id: int
) -> tuple[dict[str, pa.Table], pa.Table, int]:
    """FINWIRE's records of a piece of a file, in the shape of `parse_delimited_piece`."""
    lines, undecodable = file_lines(data, bf, first_line=first_line, ends_file=ends_file)
    staged, rejected = parse_finwire_lines(lines, undecodable, batch_id)
    return staged, rejected, lines.num_rows + undecodable.num_rows


def stage_customer_mgmt(ctx: JobContext, batch_id: int, files: list[BatchFile]) -> Parsed:
    """Parse CustomerMgmt.xml `files` (`jobs.customer_mgmt`, in the driver, no Spark): ([(its staging table, staged
    actions)], rejected actions, per-file counts); `read` counts the actions the parser found (an unreadable stretch
    of XML counts as one rejected action)."""
    staged, rejected, read = [], [], []
    for bf in files:
        raw = customer_mgmt.raw_actions(read_registered(ctx, batch_id, bf))
        n = raw.num_rows
        raw = raw.add_column(1, "source_file", pa.array([bf.file] * n, pa.large_string())).add_column(
            2, "source_batch", pa.array([bf.source_batch] * n, pa.int32())
        )
        rows = _with_batch(customer_mgmt.check_actions(raw), batch_id, CUSTOMER_MGMT_SOURCE)
        read.append(rows.num_rows)
        good = pc.equal(rows["reason"], "")
        staged.append(rows.filter(good).select(CUSTOMER_MGMT.column_names))
        bad = rows.filter(pc.invert(good)).rename_columns(
            ["line_no" if c == "action_seq" else c for c in rows.column_names]
        )
        rejected.append(bad.select(REJECTS.column_names))
    staged_rows, rejects = concat_as(staged, CUSTOMER_MGMT), concat_as(rejected, REJECTS)
    counts = reconcile(batch_id, CUSTOMER_MGMT_SOURCE, files, read, [staged_rows], rejects)
    return [(CUSTOMER_MGMT, staged_rows)], rejects, counts


def rows_per_file(rows: pa.Table) -> dict[str, int]:
    """How many of `rows` each `source_file` has."""
    if rows.num_rows == 0:
        return {}
    return {r["values"]: r["counts"] for r in rows["source_file"].value_counts().to_pylist()}


def concat_as(parts: list[pa.Table], table: Table) -> pa.Table:
    """One Arrow table of `parts` in the declared schema (parts from different Spark plans differ in nullability)."""
    return pa.concat_tables([p.cast(table.arrow_schema()) for p in parts])


def empty_rows(table: Table) -> pa.Table:
    """No rows, in `table`'s declared schema."""
    return table.arrow_schema().empty_table()
