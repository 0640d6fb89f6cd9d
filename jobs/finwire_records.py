"""The FINWIRE records of step T1 (CreateSecurities), as DimCompany, DimSecurity and Financial all read them.

Shared by `jobs.companies`, `jobs.securities` and `jobs.financials` (pure Arrow transforms in the driver) and the
T1 step (`jobs.create_securities`): the declared order of the records, which delivery of a line counts, a record's
identity and lineage, why a record cannot be loaded, and the alerts of the records left out.

**Declared order** of FINWIRE records: posting timestamp (PTS), then file name, then line. A file delivered
again (same name) replaces its earlier lines: per (file, line) the latest micro-batch's line counts.

**Records that cannot be loaded** are left out of the warehouse and raise one Alert each (`messagekey` =
`<file>:<line>`, batch = the record's TPC-DI batch), with the reason as message text: "Unknown company"
(no company version with that CIK/name on the PTS date), "Unknown status type", "Unknown industry",
"Missing required field" (a column the warehouse declares NOT NULL would be NULL). Left-out records do not
take part in versioning (the key's history is built from the loadable records only, so its rows still
chain). When a later micro-batch makes such a record loadable (its company arrives), its alert is withdrawn:
the alerts of every recomputed record are replaced by the ones the recomputation raises.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.arrow_ops import ROW, column, is_every_row, same_as_next, sort, with_row_numbers
from jobs.fields import join
from jobs.messages import ALERT, ALERT_COLUMNS
from schemas import warehouse as wh
from schemas.model import Table

# Declared order of FINWIRE records (after `latest_delivery`, (file, line) is unique).
ORDER = ("_ts", "source_file", "line_no")
_LINE = ["source_file", "line_no"]  # a staged line
DELIVERY = [*_LINE, "batch_id"]  # a delivery of it (a line staged again by a later micro-batch replaces it)

INVALID_SP_RATING = "Invalid SPRating"
UNKNOWN_COMPANY = "Unknown company"
UNKNOWN_STATUS = "Unknown status type"
UNKNOWN_INDUSTRY = "Unknown industry"
MISSING_FIELD = "Missing required field"
ALERT_TEXTS = (INVALID_SP_RATING, UNKNOWN_COMPANY, UNKNOWN_STATUS, UNKNOWN_INDUSTRY, MISSING_FIELD)

SOURCE_OF = {wh.DIM_COMPANY.name: "DimCompany", wh.DIM_SECURITY.name: "DimSecurity", wh.FINANCIAL.name: "Financial"}

STRING = pa.large_string()


def latest_delivery(staged: pa.Table) -> pa.Table:
    """One row per (file, line): the one staged by the latest micro-batch (a file delivered again wins), in the
    order of file, line (Financial's FIN records, the most, are read in pieces instead: `redelivered`). Ordered by
    the key columns alone and taken once; `staged` itself when that is already it (one delivery of each line, in
    order)."""
    ordered = _deliveries(with_row_numbers(staged.select(DELIVERY)))
    kept = ordered[ROW].filter(pa.array(~same_as_next(ordered, _LINE), pa.bool_()))
    return staged if is_every_row(kept, staged.num_rows) else staged.take(kept)


def redelivered(delivered: pa.Table) -> pa.Table:
    """(`source_file`, `line_no`, `batch_id`) of the staged lines (`delivered`, with those columns) that a later
    micro-batch delivered again, so `latest_delivery` leaves them out; empty when every line came once."""
    ordered = _deliveries(delivered.select(DELIVERY))
    return ordered.filter(pa.array(same_as_next(ordered, _LINE), pa.bool_()))


def _deliveries(rows: pa.Table) -> pa.Table:
    """`rows` in the order of their line, then of the micro-batch that delivered it (a line's latest delivery last)."""
    return sort(rows, DELIVERY)


def without_redelivered(staged: pa.Table, stale: pa.Table) -> pa.Table:
    """`staged` without the lines `stale` (`redelivered`) names, in the staged order: `latest_delivery` of a piece of
    the staged records, given what the whole of them redelivered."""
    if not stale.num_rows:
        return staged
    on = list(stale.column_names)
    numbered = with_row_numbers(staged.select(on))
    kept = numbered.join(stale.cast(numbered.select(on).schema), on, join_type="left anti")[ROW].combine_chunks()
    kept = pc.take(kept, pc.array_sort_indices(kept))
    return staged if is_every_row(kept, staged.num_rows) else staged.take(kept)


def lineage(records: pa.Table) -> dict[str, pa.Array]:
    """The lineage columns every change record carries: `_ts` (PTS), `_pdate` (its UTC day), `_batch` (TPC-DI
    batch), `source_file`, `line_no`, `batch_id` (micro-batch) and `_rec`, the record's identity `<file>:<line>`
    (the `messagekey` of its alerts)."""
    file, line = column(records, "source_file"), column(records, "line_no")
    return {
        "_ts": column(records, "pts"),
        "_pdate": pc.cast(column(records, "pts"), pa.date32()),
        "_batch": column(records, "source_batch"),
        "source_file": file,
        "line_no": line,
        "batch_id": column(records, "batch_id"),
        "_rec": join(file, ":", line),
    }


def missing_required(table: Table, rows: pa.Table, columns: tuple[str, ...]) -> pa.Array:
    """Per row, the comma list of the `columns` that `table` declares NOT NULL and that are NULL ('' when none). The
    lists are made only for the rows that have one (a first load: SF 100's 5.77 M FIN records, almost none)."""
    names = [c for c in columns if not table.column(c).nullable]
    nulls = [np.asarray(pc.is_null(column(rows, c)), dtype=bool) for c in names]
    at = np.flatnonzero(np.logical_or.reduce(nulls)) if nulls else np.array([], np.int64)
    lists = [",".join(c for c, null in zip(names, nulls, strict=True) if null[i]) for i in at.tolist()]
    index = np.zeros(rows.num_rows, np.int64)
    index[at] = np.arange(1, len(at) + 1)
    return pa.array(["", *lists], STRING).take(pa.array(index))


Detail = pa.Array | Callable[[np.ndarray], pa.Array]


def first_reason(n: int, *checks: tuple[pa.Array, str, Detail]) -> tuple[pa.Array, pa.Array]:
    """(`_reason`, `_detail`) of the first failing check (condition, reason text, detail) per row; NULLs when none.
    A NULL condition does not fail. A detail is an array parallel to the rows, or a function of the positions of
    the rows that fail the check (details made only for them: a first load's records rarely fail)."""
    which = np.full(n, -1, np.int64)
    for i, (cond, _, _) in enumerate(checks):
        fails = np.asarray(pc.fill_null(cond, False), dtype=bool)
        which[fails & (which < 0)] = i
    bad = np.flatnonzero(which >= 0)
    if not len(bad):
        return pa.nulls(n, STRING), pa.nulls(n, STRING)
    at = [bad[which[bad] == i] for i in range(len(checks))]
    details = [
        pa.array([], STRING)
        if not len(rows)
        else pc.cast(info(rows) if callable(info) else pc.take(info, pa.array(rows)), STRING)
        for rows, (_, _, info) in zip(at, checks, strict=True)
    ]
    order = np.argsort(np.concatenate(at), kind="stable")  # each failing row's detail, in row order
    index = np.full(n, -1, np.int64)
    index[bad] = np.arange(len(bad))
    slot = pa.array(index, mask=index < 0)
    reason = pa.array([why for _, why, _ in checks], STRING).take(pa.array(which[bad])).take(slot)
    chunks = [c for d in details for c in (d.chunks if isinstance(d, pa.ChunkedArray) else [d])]
    detail = pa.chunked_array(chunks, STRING).combine_chunks().take(pa.array(order)).take(slot)
    return reason, detail


def rejection_alerts(records: pa.Table, source: str, ident: pa.Array) -> pa.Table:
    """One Alert per record with a `_reason` (rows in `jobs.messages.ALERT_COLUMNS`, the reason as text): data =
    `ident, detail` (the detail left out when NULL), key = the record, batch = the record's TPC-DI batch."""
    bad = pc.is_valid(records["_reason"])
    rows = records.filter(bad)
    ident = pc.cast(ident, STRING).filter(bad)
    detail = pc.cast(rows["_detail"], STRING)
    return pa.table(
        {
            "batchid": rows["_batch"].cast(pa.int32()),
            "messagesource": pa.array([source] * rows.num_rows, STRING),
            "messagetext": rows["_reason"].cast(STRING),
            "messagetype": pa.array([ALERT] * rows.num_rows, STRING),
            "messagedata": pc.if_else(pc.is_valid(detail), join(ident, ", ", detail), ident),
            "messagekey": rows["_rec"].cast(STRING),
        },
        schema=ALERT_COLUMNS,
    )


def withdrawn_alerts(existing: pa.Table, examined: pa.Table, raised: pa.Table) -> pa.Table:
    """Keys of the T1 alerts in `existing` (DImessages rows with its key columns and `messagetext`) about records
    in `examined` (`batchid`, `messagesource`, `messagekey`) that the recomputation no longer raises (`raised`)."""
    keys = list(wh.DI_MESSAGES.key)
    mine = pc.and_(
        pc.equal(existing["messagetype"], ALERT),
        pc.is_in(existing["messagetext"], value_set=pa.array(ALERT_TEXTS, existing["messagetext"].type)),
    )
    on = ["batchid", "messagesource", "messagekey"]
    about = (
        existing.filter(mine)
        .select(keys)
        .join(examined.select(on).cast(existing.select(on).schema), on, join_type="left semi")
    )
    again = raised.select(keys).cast(existing.select(keys).schema)
    return about.join(again, keys, join_type="left anti").select(keys)
