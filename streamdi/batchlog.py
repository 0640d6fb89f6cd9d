"""The batch log (Delta): which landing files form which micro-batch, and how far each batch got.

It is the single source of progress. The collector registers each landing file exactly once, giving each
new set of files the next `batch_id`; every stage asks the log what to do next and records when it is done.
Every write carries an app transaction, so a crash between any two steps is repaired by a rerun.

Stages run in this order for every batch, and batch b+1 starts a stage only after batch b finished it:
`stage` (parse into staging) -> `transform` (warehouse in Delta) -> `migrate` (PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from schemas.platform import BATCH_EVENTS, BATCH_FILES
from streamdi.lake import Lake

STAGES: tuple[str, ...] = ("stage", "transform", "migrate")
DONE = "done"


@dataclass(frozen=True)
class LandedFile:
    """A landing file as the collector found it."""

    file: str
    size_bytes: int
    sha256: str
    arrived_at: dt.datetime
    source_batch: int


@dataclass(frozen=True)
class BatchFile:
    batch_id: int
    file_seq: int
    file: str
    size_bytes: int
    sha256: str
    arrived_at: dt.datetime
    source_batch: int


class BatchLog:
    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        for table in (BATCH_FILES, BATCH_EVENTS):
            lake.ensure_table(table)

    # ---------------------------------------------------------------------------------------- files
    def registered_files(self) -> dict[str, BatchFile]:
        """Every registered file by its landing path."""
        rows = self.lake.read_arrow(BATCH_FILES).to_pylist()
        return {r["file"]: BatchFile(**{k: r[k] for k in BatchFile.__dataclass_fields__}) for r in rows}

    def register(self, files: list[LandedFile], *, now: dt.datetime) -> int | None:
        """Register `files` (not yet in the log) as the next micro-batch; return its batch id.

        The caller holds the collector lock, so ids are allocated by one process at a time. Files keep the
        order given (arrival order). Returns None when `files` is empty.
        """
        if not files:
            return None
        batch_id = self.last_batch_id() + 1
        rows = [
            {
                "batch_id": batch_id,
                "file_seq": seq,
                "file": f.file,
                "size_bytes": f.size_bytes,
                "sha256": f.sha256,
                "arrived_at": f.arrived_at,
                "source_batch": f.source_batch,
                "registered_at": now,
            }
            for seq, f in enumerate(files, start=1)
        ]
        data = pa.Table.from_pylist(rows, schema=BATCH_FILES.arrow_schema())
        self.lake.append(BATCH_FILES, data, app_id="collect", version=batch_id)
        return batch_id

    def files(self, batch_id: int) -> list[BatchFile]:
        """The batch's files in arrival order."""
        data = self.lake.read_arrow(BATCH_FILES)
        rows = data.filter(pc.equal(data["batch_id"], batch_id)).to_pylist()
        return [BatchFile(**{k: r[k] for k in BatchFile.__dataclass_fields__}) for r in rows]

    def last_batch_id(self) -> int:
        ids = self.lake.read_arrow(BATCH_FILES)["batch_id"]
        return int(pc.max(ids).as_py() or 0) if len(ids) else 0

    def batch_ids(self) -> list[int]:
        ids = self.lake.read_arrow(BATCH_FILES)["batch_id"]
        return sorted(set(ids.to_pylist()))

    # --------------------------------------------------------------------------------------- states
    def mark(self, batch_id: int, stage: str, state: str, *, now: dt.datetime, detail: dict | None = None) -> bool:
        """Record that `stage` of `batch_id` reached `state` (once: a repeated mark is a no-op)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
        row = {
            "batch_id": batch_id,
            "stage": stage,
            "state": state,
            "at": now,
            "detail": json.dumps(detail, sort_keys=True) if detail is not None else None,
        }
        data = pa.Table.from_pylist([row], schema=BATCH_EVENTS.arrow_schema())
        # One app id per (batch, stage, state): marks of different batches never shadow each other, whatever
        # order they arrive in (an app id's check skips every version not newer than the last one).
        app_id = f"event/{batch_id}/{stage}/{state}"
        return self.lake.append(BATCH_EVENTS, data, app_id=app_id, version=batch_id).committed

    def states(self) -> dict[tuple[int, str], str]:
        """Latest state per (batch, stage)."""
        latest: dict[tuple[int, str], str] = {}
        for r in self.lake.read_arrow(BATCH_EVENTS).to_pylist():  # sorted by (batch, at, stage)
            latest[(r["batch_id"], r["stage"])] = r["state"]
        return latest

    def is_done(self, batch_id: int, stage: str) -> bool:
        return self.states().get((batch_id, stage)) == DONE

    def pending(self) -> list[tuple[int, str]]:
        """What is left to do, in the order it must be done: (batch, stage) pairs, oldest batch first."""
        states = self.states()
        return [(b, stage) for b in self.batch_ids() for stage in STAGES if states.get((b, stage)) != DONE]

    def next_step(self) -> tuple[int, str] | None:
        """The next (batch, stage) to run, or None when everything registered is done."""
        todo = self.pending()
        return todo[0] if todo else None

    def summary(self) -> list[dict]:
        """One row per batch: files, and each stage's state (for `streamdi batches`)."""
        states = self.states()
        data = self.lake.read_arrow(BATCH_FILES).to_pylist()
        by_batch: dict[int, list[dict]] = {}
        for r in data:
            by_batch.setdefault(r["batch_id"], []).append(r)
        return [
            {
                "batch_id": b,
                "files": len(rows),
                "source_batches": sorted({r["source_batch"] for r in rows}),
                "arrived_at": max(r["arrived_at"] for r in rows),
                **{stage: states.get((b, stage), "pending") for stage in STAGES},
            }
            for b, rows in sorted(by_batch.items())
        ]
