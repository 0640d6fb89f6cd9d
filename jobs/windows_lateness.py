"""Lateness of the live windows (step AG, `jobs.windows`): watermarks per TPC-DI batch, which records are late,
and their "Late record past grace" Alerts.

A record is late when its event time is before its TPC-DI batch's watermark (the latest event time of the batches
before it) minus the source's grace (`schemas.windows.GRACE`); a late record counts in no window and raises an
Alert in DImessages. Where it sits: the step (`jobs.windows`) keeps the latest event time per batch in
`staging.window_watermarks`, filters late records out before the window rows are computed
(`jobs.windows_slices`), and recomputes the spans where a moved watermark may change lateness
(`watermark_moves`). Pure: no lake.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.messages import alert_rows
from jobs.windows_slices import Records
from schemas import windows as ws

LATE = "Late record past grace"
ALERT_SOURCE = {ws.TRADES: "TradeWindows", ws.MARKET: "MarketWindows"}
NO_TIME = np.iinfo(np.int64).min  # the watermark before any record: nothing is late


def watermarks(latest: Mapping[int, int]) -> Callable[[np.ndarray], np.ndarray]:
    """The watermark of each TPC-DI batch: the latest event time of the batches before it (NO_TIME for none)."""
    batches = np.array(sorted(latest), np.int64)
    running = np.maximum.accumulate(np.array([latest[b] for b in batches], np.int64)) if len(batches) else batches

    def of(batch: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(batches, np.asarray(batch, np.int64), side="left") - 1  # batches strictly before
        return np.where(pos >= 0, running[np.maximum(pos, 0)] if len(running) else NO_TIME, NO_TIME)

    return of


def late_mask(ts: np.ndarray, batch: np.ndarray, latest: Mapping[int, int], grace_us: int) -> np.ndarray:
    """Whether each record is late: its event time is before its batch's watermark minus the grace. Per TPC-DI
    batch, with boolean masks only (a first load judges every record: SF 100's 42 M market rows)."""
    ts, batch = np.asarray(ts), np.asarray(batch)
    out = np.zeros(len(ts), dtype=bool)
    distinct = np.asarray(pc.unique(pa.array(batch)), np.int64) if len(batch) else np.array([], np.int64)
    for b, mark in zip(distinct.tolist(), watermarks(latest)(distinct).tolist(), strict=True):
        if mark != NO_TIME:
            out |= (batch == b) & (ts < mark - grace_us)
    return out


def watermark_moves(before: Mapping[int, int], after: Mapping[int, int], grace_us: int) -> list[tuple[int, int]]:
    """The spans of event time in which lateness may differ between the watermarks `before` and `after`: per batch
    of `after` whose watermark moved, from the lower to the higher of the two, minus the grace. A watermark that
    appears (NO_TIME before) opens the span from the start of time."""
    out = []
    batches = np.array(sorted(after), np.int64)
    old, new = watermarks(before)(batches), watermarks(after)(batches)
    for o, n in zip(old.tolist(), new.tolist(), strict=True):
        if o != n:
            lo = 0 if NO_TIME in (o, n) else min(o, n) - grace_us
            out.append((lo, max(o, n) - grace_us + 1))
    return out


def _iso(ts_us: int) -> str:
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(ts_us))).isoformat(sep=" ")


def late_alerts(source: str, late: pa.Table | Records, latest: Mapping[int, int]) -> pa.Table:
    """One "Late record past grace" Alert per late record (`ident`, `ts`, `batch`), in its TPC-DI batch."""
    if isinstance(late, Records):
        late = pa.table({"ident": late.ident, "ts": late.ts, "batch": late.batch})
    ts = ao.column(late, "ts").to_numpy(zero_copy_only=False).astype(np.int64)
    batch = ao.column(late, "batch").to_numpy(zero_copy_only=False).astype(np.int64)
    marks = watermarks(latest)(batch)
    grace = ws.GRACE[source]
    data = [
        f"event time {_iso(t)} is before the watermark of batch {b} ({_iso(m)}) minus the grace ({grace})"
        for t, b, m in zip(ts.tolist(), batch.tolist(), marks.tolist(), strict=True)
    ]
    return alert_rows(
        pa.array(batch, pa.int64()), source=ALERT_SOURCE[source], text=LATE, data=data, key=late["ident"].to_pylist()
    )
