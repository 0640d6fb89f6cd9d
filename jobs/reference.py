"""T0 (reference data): DimDate, DimTime, StatusType, TradeType, Industry, TaxRate and DimBroker.

These tables come from Batch1 files that are loaded as they are (TPC-DI 1.1.0, clause 4.5.1-4.5.3): each
warehouse row is the staged row of its natural key. If one micro-batch carries the same key more than once
(two deliveries of the file), the row that arrived last wins: the last file in the batch's arrival order,
then the last line of that file. The result is upserted by key, one app-transaction commit per table
(`T0/<table>`, batch id), so a rerun of a committed batch changes nothing.

DimBroker (4.5.4): one row per HR.csv employee with job code 314, current, effective from the first day of
DimDate, TPC-DI batch 1. Its surrogate key is derived from the employee id and that day (`jobs.scd2`). It is
rebuilt whenever HR.csv or Date.txt rows arrive; until DimDate has rows, brokers wait.

The step runs in the driver on Arrow (a hundred thousand rows of lookups): read with delta-rs, no Spark job.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.scd2 import DAY_SLOTS, END_OF_TIME, EPOCH_1900
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import SourceFile, Table
from streamdi.context import JobContext

log = logging.getLogger(__name__)

# Which staged source feeds which warehouse table (column names are the same on both sides).
REFERENCE_FEEDS: tuple[tuple[SourceFile, Table], ...] = (
    (src.DATE_FILE, wh.DIM_DATE),
    (src.TIME_FILE, wh.DIM_TIME),
    (src.STATUS_TYPE, wh.STATUS_TYPE),
    (src.TRADE_TYPE, wh.TRADE_TYPE),
    (src.INDUSTRY, wh.INDUSTRY),
    (src.TAX_RATE, wh.TAX_RATE),
)

_SEQ = "_file_seq"


def with_arrival(staged: pa.Table, file_seq: Mapping[str, int]) -> pa.Table:
    """`staged` with `_file_seq`: the position of its `source_file` among the micro-batch's files (`file_seq`),
    -1 for a file that is not one of them (a line staged by an earlier micro-batch), so it loses to every
    file of this one."""
    names = sorted(file_seq)
    positions = pc.index_in(staged["source_file"], value_set=pa.array(names, pa.large_string()))
    seq = pc.take(pa.array([file_seq[n] for n in names] + [-1], pa.int64()), pc.fill_null(positions, len(names)))
    return staged.append_column(_SEQ, seq)


def latest_per_key(staged: pa.Table, key: Sequence[str], file_seq: Mapping[str, int]) -> pa.Table:
    """One row per key: the one that arrived last (file arrival position, then line number)."""
    ordered = ao.sort(with_arrival(staged, file_seq), [*key, _SEQ, "line_no"])
    return ao.last_of_groups(ordered, key)


def build_reference_table(staged: pa.Table, target: Table, file_seq: Mapping[str, int]) -> pa.Table:
    """Warehouse rows of a reference table from its staged rows of one micro-batch."""
    return latest_per_key(staged, target.key, file_seq).select(target.column_names)


@dataclass
class TransformReport:
    batch_id: int
    rows: dict[str, int]
    committed: dict[str, bool]


BROKER_JOB_CODE = 314


def latest_employees(hr: pa.Table, file_seq: Mapping[str, int]) -> pa.Table:
    """One HR line per employee id: the last delivered one (micro-batch, then the file's position in this
    micro-batch, then file name, then line)."""
    ordered = ao.sort(with_arrival(hr, file_seq), ["employeeid", "batch_id", _SEQ, "source_file", "line_no"])
    return ao.last_of_groups(ordered, ["employeeid"])


def build_brokers(hr: pa.Table, first_day: dt.date) -> pa.Table:
    """DimBroker rows (declared columns, any order) from HR employees (one line per employee id) and the
    earliest DimDate day: the employees with job code 314."""
    brokers = hr.filter(pc.fill_null(pc.equal(hr["employeejobcode"], BROKER_JOB_CODE), False))
    n = brokers.num_rows
    ids = np.asarray(ao.column(brokers, "employeeid").cast(pa.int64()), dtype=np.int64)
    day_slot = (first_day - EPOCH_1900).days
    return pa.table(
        {
            "sk_brokerid": pa.array(ids * DAY_SLOTS + day_slot, pa.int64()),
            "brokerid": brokers["employeeid"],
            "managerid": brokers["managerid"],
            "firstname": brokers["employeefirstname"],
            "lastname": brokers["employeelastname"],
            "middleinitial": brokers["employeemi"],
            "branch": brokers["employeebranch"],
            "office": brokers["employeeoffice"],
            "phone": brokers["employeephone"],
            "iscurrent": pa.array([True] * n, pa.bool_()),
            "batchid": pa.array([1] * n, pa.int32()),
            "effectivedate": pa.array([first_day] * n, pa.date32()),
            "enddate": pa.array([END_OF_TIME] * n, pa.date32()),
        }
    )


def run(ctx: JobContext, scope: BatchScope) -> TransformReport:
    """Upsert the batch's staged reference rows into the warehouse tables (one commit per table)."""
    batch_id = scope.batch_id
    rows: dict[str, int] = {}
    committed: dict[str, bool] = {}
    for source, target in REFERENCE_FEEDS:
        if not scope.carries(source.name) or not ctx.lake.exists(source.staging):
            continue
        if scope.committed(ctx, "T0", target):
            continue
        staged = _this_batch(ctx, scope, source.staging)
        data = ctx.lake.to_arrow(target, build_reference_table(staged, target, scope.file_seq))
        if data.num_rows == 0:
            continue
        commit = ctx.lake.upsert(target, data, app_id=scope.app_id("T0", target), version=batch_id)
        rows[target.name] = data.num_rows
        committed[target.name] = commit.committed
    _run_brokers(ctx, scope, rows, committed)
    return TransformReport(batch_id, rows, committed)


def _this_batch(ctx: JobContext, scope: BatchScope, table: Table, columns: list[str] | None = None) -> pa.Table:
    return scope.staged_where(ctx, table, pc.field("batch_id") == scope.batch_id, columns)


def _run_brokers(ctx: JobContext, scope: BatchScope, rows: dict[str, int], committed: dict[str, bool]) -> None:
    if not scope.carries(src.HR.name, src.DATE_FILE.name):
        return
    arrived = any(
        ctx.lake.exists(t) and _this_batch(ctx, scope, t, ["line_no"]).num_rows  # whether any arrived: one column
        for t in (src.HR.staging, src.DATE_FILE.staging)
    )
    if not arrived or not ctx.lake.exists(wh.DIM_DATE) or scope.committed(ctx, "T0", wh.DIM_BROKER):
        return
    first_day = pc.min(ctx.lake.read_columns(wh.DIM_DATE, ["datevalue"])["datevalue"]).as_py()
    if first_day is None or not ctx.lake.exists(src.HR.staging):
        return
    # every HR line so far (the skipped micro-batches' excepted), the last delivered one per employee winning
    hr_all = scope.staged_where(ctx, src.HR.staging, pc.scalar(True))
    data = ctx.lake.to_arrow(wh.DIM_BROKER, build_brokers(latest_employees(hr_all, scope.file_seq), first_day))
    commit = ctx.lake.upsert(wh.DIM_BROKER, data, app_id=scope.app_id("T0", wh.DIM_BROKER), version=scope.batch_id)
    rows[wh.DIM_BROKER.name] = data.num_rows
    committed[wh.DIM_BROKER.name] = commit.committed
