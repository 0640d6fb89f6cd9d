"""The batch log (Delta): which landing files form which micro-batch, and how far each batch got.

It is the single source of progress. The collector registers each landing file exactly once, giving each
new set of files the next `batch_id`; every stage asks the log what to do next and records when it is done.
Every write carries an app transaction, so a crash between any two steps is repaired by a rerun.

Stages run in this order for every batch, and batch b+1 starts a stage only after batch b finished it:
`stage` (parse into staging) -> `transform` (warehouse in Delta) -> `migrate` (PostgreSQL).

A stage's state follows from which events it has, never from their times or the order they are read in (a step of
the clock or a compaction cannot reorder them; `stage_states`): `done` once it has a done event; else `skipped`
(the operator dropped the batch: its remaining stages never run, later batches go on, and the transform steps ignore
its staged rows); else `halted` while it has more halts than resumes (a data-quality policy stopped it: nothing
after it in that order runs until an operator acts); else `resumed` (the operator let the halted stage run again;
the policy that halted it then only warns for this batch). Halts and resumes alternate and are numbered (the n-th
halt, the n-th resume), so their counts say which came last.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from schemas.platform import BATCH_EVENTS, BATCH_FILES
from streamdi.batchlog_index import (
    DONE,
    EVENT_COLUMNS,
    FINISHED,
    HALTED,
    RESUMED,
    SKIPPED,
    STAGES,
    EventsIndex,
    FilesIndex,
    RegisteredBy,
    events_in,
    indexed,
    stage_states,
)
from streamdi.lake import Lake
from streamdi.parts import Part, missing_predecessors, parts_of

T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    """The batch log at one read (`BatchLog.progress`)."""

    pending: list[tuple[int, str]]  # as `BatchLog.pending`: in the order to run, ending before a halted stage
    halted: list[Halt]  # as `BatchLog.halted`
    states: dict[tuple[int, str], str]  # as `BatchLog.states`


def _pending(batch_ids: Iterable[int], states: Mapping[tuple[int, str], str]) -> list[tuple[int, str]]:
    """`BatchLog.pending` from the batch ids (ascending; those whose every stage is finished may be left out) and the
    stage states."""
    todo = []
    for b in batch_ids:
        for stage in STAGES:
            state = states.get((b, stage))
            if state == HALTED:
                return todo
            if state not in FINISHED:
                todo.append((b, stage))
    return todo


class BatchLogError(ValueError):
    """An operator action that does not fit the batch's state (e.g. resuming a batch that is not halted)."""


def operator_commands(batch_id: int, stage: str) -> list[tuple[str, str]]:
    """What an operator may do about a batch halted at `stage`: (command, what it does). A batch halted in
    staging may be dropped; one halted by a warehouse check after a transform step committed to the Delta
    warehouse (which later batches build on) can only be resumed."""
    options = [
        (
            f"streamdi batch resume {batch_id}",
            "let it go on: its halting checks then only warn for this batch (action overridden)",
        )
    ]
    if stage == "stage":
        options.append(
            (
                f"streamdi batch skip {batch_id} --reason TEXT",
                "drop it: its staged rows stay for inspection but never reach the warehouse; later batches go on",
            )
        )
    return options


@dataclass(frozen=True)
class Halt:
    """A halted stage: the batch, the stage, why (the policy's reason) and when."""

    batch_id: int
    stage: str
    reason: str
    at: dt.datetime

    def commands(self) -> list[tuple[str, str]]:
        """The operator's options: (command, what it does)."""
        return operator_commands(self.batch_id, self.stage)


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


FILE_COLUMNS = list(BatchFile.__dataclass_fields__)


def _registered_in(rows: pa.Table) -> dict[str, BatchFile]:
    """The files one data file of the log registers (`rows`: the columns of BatchFile, in its order), by path."""
    found = [BatchFile(*values) for values in zip(*rows.to_pydict().values(), strict=True)]
    return {f.file: f for f in found}


class BatchLog:
    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        for table in (BATCH_FILES, BATCH_EVENTS):
            lake.ensure_table(table)

    # ---------------------------------------------------------------------------------------- files
    def _files_index(self, read: Callable[[FilesIndex], T]) -> T:
        """`read` of the registered files, each data file of the log read once per process (`indexed`)."""
        return indexed(self.lake, BATCH_FILES, FILE_COLUMNS, "batchlog/registered", _registered_in, FilesIndex, read)

    def _events_index(self, read: Callable[[EventsIndex], T]) -> T:
        """`read` of the events, each data file of the log read once per process (`indexed`)."""
        return indexed(self.lake, BATCH_EVENTS, EVENT_COLUMNS, "batchlog/events", events_in, EventsIndex, read)

    def registered_files(self) -> dict[str, BatchFile]:
        """Every registered file by its landing path. The log only grows: each of its data files is read once per
        process (`indexed`), so a long-running service that collects every micro-batch pays for the files
        registered since its last call, not for the whole history again (SF 6 after 16 TPC-DI batches: 707 files,
        ~25 ms a call read whole; the Python objects of its rows cost the most)."""
        return self._files_index(lambda index: dict(index.by_path))

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
        return self._files_index(lambda index: list(index.by_batch.get(batch_id, ())))

    def last_batch_id(self) -> int:
        return self._files_index(lambda index: index.last_batch_id)

    def registered_parts(self) -> frozenset[Part]:
        """The parts (`streamdi.parts.Part`) among the registered files."""
        return self._files_index(lambda index: frozenset(index.parts))

    def before(self, batch_id: int) -> Registered:
        """The registered files as the stage of `batch_id` asks about them (`Registered`)."""
        return Registered(self, batch_id)

    def batch_ids(self) -> list[int]:
        return self._files_index(lambda index: sorted(index.by_batch))

    # --------------------------------------------------------------------------------------- states
    def mark(
        self,
        batch_id: int,
        stage: str,
        state: str,
        *,
        now: dt.datetime,
        detail: dict | None = None,
        occurrence: int | None = None,
    ) -> bool:
        """Record that `stage` of `batch_id` reached `state` (once: a repeated mark is a no-op).

        `occurrence` numbers states that may recur (a stage halted, resumed, then halted again): each
        (state, occurrence) is recorded once."""
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
        app_id = f"event/{batch_id}/{stage}/{state}" + (f"/{occurrence}" if occurrence is not None else "")
        return self.lake.append(BATCH_EVENTS, data, app_id=app_id, version=batch_id).committed

    def _count(self, batch_id: int, stage: str, state: str) -> int:
        """How many events of `state` `stage` of `batch_id` has."""
        return self._events_index(lambda index: index.counts.get((batch_id, stage, state), 0))

    def halt(self, batch_id: int, stage: str, reason: str, *, now: dt.datetime) -> bool:
        """Halt `stage` of `batch_id`: it and everything after it wait for `resume` or `skip`.

        Idempotent until the next resume: a retried halt (say, after a crash right after it) records nothing."""
        resumes = self._count(batch_id, stage, RESUMED)
        detail = {"reason": reason, "occurrence": resumes + 1}
        return self.mark(batch_id, stage, HALTED, now=now, detail=detail, occurrence=resumes + 1)

    def halted(self) -> list[Halt]:
        """The stages halted now, oldest batch first (at most one can be reached, the others wait behind it)."""
        return [Halt(*h) for h in self._events_index(EventsIndex.halts)]

    def resume(self, batch_id: int, *, now: dt.datetime, note: str | None = None) -> str:
        """Let the halted stage of `batch_id` run again (the policy that halted it only warns for this batch
        from now on). Returns the stage. Raises BatchLogError when the batch is not halted."""
        halt = next((h for h in self.halted() if h.batch_id == batch_id), None)
        if halt is None:
            raise BatchLogError(f"micro-batch {batch_id} is not halted; nothing to resume")
        halts = self._count(batch_id, halt.stage, HALTED)
        detail = {"halted_because": halt.reason, **({"note": note} if note else {})}
        self.mark(batch_id, halt.stage, RESUMED, now=now, detail=detail, occurrence=halts)
        return halt.stage

    def resumes(self, batch_id: int, stage: str) -> int:
        """How often an operator resumed `stage` of `batch_id` (0: never; its halting policies then only warn)."""
        return self._count(batch_id, stage, RESUMED)

    def was_resumed(self, batch_id: int, stage: str) -> bool:
        """Whether an operator ever resumed `stage` of `batch_id` (its halting policies then only warn)."""
        return self.resumes(batch_id, stage) > 0

    def skip(self, batch_id: int, reason: str, *, now: dt.datetime) -> list[str]:
        """Drop `batch_id`: every stage of it not done yet is skipped (never runs), so later batches go on; the
        transform steps ignore its staged rows. Returns the stages skipped. Raises BatchLogError for an unknown
        batch, an empty reason, or a batch whose stages are all done (it is in the warehouse already)."""
        if not reason.strip():
            raise BatchLogError("skipping a batch needs a reason (it is kept in the batch log)")
        if batch_id not in self.batch_ids():
            raise BatchLogError(f"micro-batch {batch_id} is not in the batch log")
        states = self.states()
        left = [s for s in STAGES if states.get((batch_id, s)) not in FINISHED]
        if not left and all(states.get((batch_id, s)) == DONE for s in STAGES):
            raise BatchLogError(f"micro-batch {batch_id} is done; its rows are in the warehouse and cannot be skipped")
        if states.get((batch_id, "transform")) == HALTED:
            raise BatchLogError(
                f"micro-batch {batch_id} halted after its transform committed to the Delta warehouse, which later "
                f"batches build on; fix what the check found and run `streamdi batch resume {batch_id}` instead"
            )
        if states.get((batch_id, "transform")) == DONE:
            raise BatchLogError(
                f"micro-batch {batch_id} is already transformed into the Delta warehouse; only its migration is left, "
                "and skipping that would leave PostgreSQL behind Delta"
            )
        for stage in left:
            self.mark(batch_id, stage, SKIPPED, now=now, detail={"reason": reason})
        return left

    def skipped_batches(self) -> frozenset[int]:
        """Batches an operator dropped before their transform (their staged rows must not reach the warehouse)."""
        return self._events_index(lambda index: frozenset(index.skipped))

    def states(self) -> dict[tuple[int, str], str]:
        """The state of every (batch, stage) that has an event (`stage_states`)."""
        return self._events_index(lambda index: dict(index.states))

    def is_done(self, batch_id: int, stage: str) -> bool:
        return self._events_index(lambda index: index.states.get((batch_id, stage))) == DONE

    def pending(self) -> list[tuple[int, str]]:
        """What is left to do, in the order it must be done: (batch, stage) pairs, oldest batch first. A halted
        stage ends the list: nothing after it may run until it is resumed or its batch skipped."""
        return self.progress().pending

    def next_step(self) -> tuple[int, str] | None:
        """The next (batch, stage) to run, or None when everything registered is done."""
        todo = self.pending()
        return todo[0] if todo else None

    def done_times(self, *, stage: str | None = None, after: int = 0) -> dict[tuple[int, str], dt.datetime]:
        """When each (batch, stage) was last marked done; only `stage`'s and the batches after `after` when given (a
        read the log's files skip by their statistics)."""
        wanted = (pc.field("state") == DONE) & (pc.field("batch_id") > after)
        if stage is not None:
            wanted &= pc.field("stage") == stage
        done: dict[tuple[int, str], dt.datetime] = {}
        for r in self.lake.read_where(BATCH_EVENTS, wanted, ["batch_id", "stage", "at"]).to_pylist():
            key = (r["batch_id"], r["stage"])
            done[key] = max(r["at"], done.get(key, r["at"]))
        return done

    def done_details(self, stage: str) -> dict[int, dict]:
        """Each batch's detail of its last `done` event of `stage` (e.g. the transform's seconds per step)."""
        out: dict[int, tuple[dt.datetime, dict]] = {}
        for r in self.lake.read_arrow(BATCH_EVENTS).to_pylist():
            if r["stage"] != stage or r["state"] != DONE:
                continue
            if r["batch_id"] not in out or r["at"] >= out[r["batch_id"]][0]:
                detail = json.loads(r["detail"]) if r.get("detail") else {}
                out[r["batch_id"]] = (r["at"], detail)
        return {b: detail for b, (_, detail) in sorted(out.items())}

    def summary(self) -> list[dict]:
        """One row per batch: files, each stage's state, and when each stage was marked done (`<stage>_at`, None
        when it is not done) (for `streamdi batches` and the batch-log page)."""
        states = self.states()
        done = self.done_times()
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
                **{f"{stage}_at": done.get((b, stage)) if states.get((b, stage)) == DONE else None for stage in STAGES},
            }
            for b, rows in sorted(by_batch.items())
        ]

    # ------------------------------------------------------------------------- readers for the quality report
    def skip_reasons(self) -> dict[int, str]:
        """Each skipped batch's reason (the operator's `--reason`, as its first skip event recorded it)."""
        reasons: dict[int, str] = {}
        for r in self.lake.read_arrow(BATCH_EVENTS).to_pylist():
            if r["state"] == SKIPPED:
                reasons.setdefault(r["batch_id"], json.loads(r["detail"] or "{}").get("reason", ""))
        return reasons

    def resumed_batches(self) -> frozenset[int]:
        """Batches an operator resumed at some stage (`resume`; their halting policies then only warn)."""
        events = self.lake.read_columns(BATCH_EVENTS, ["batch_id", "state"]).to_pylist()
        return frozenset(r["batch_id"] for r in events if r["state"] == RESUMED)

    # ------------------------------------------------------------------------- readers for the migrator
    @classmethod
    def if_exists(cls, lake: Lake) -> BatchLog | None:
        """The batch log of `lake`, or None when it has none yet: for readers that must not create its tables (the
        migrator on a lake that no collect has written)."""
        if not (lake.exists(BATCH_FILES) and lake.exists(BATCH_EVENTS)):
            return None
        return cls(lake)

    def _after(self, table: Table, columns: list[str], after: int) -> pa.Table:
        """`columns` of the log's rows of the batches after `after` (0: every batch)."""
        return self.lake.read_if_exists(table, columns, pc.field("batch_id") > after if after else None)

    def arrivals(self, after: int = 0) -> dict[int, dt.datetime]:
        """When each batch after `after` arrived: the `arrived_at` of its last file. Reads only those two columns of
        those batches' rows (the batch log grows, and every migration reads this: at 10,000 micro-batches of 13 files,
        49 ms for every batch)."""
        data = self._after(BATCH_FILES, ["batch_id", "arrived_at"], after)
        if data.num_rows == 0:
            return {}
        latest = data.group_by("batch_id", use_threads=False).aggregate([("arrived_at", "max")])
        return dict(zip(latest["batch_id"].to_pylist(), latest["arrived_at_max"].to_pylist(), strict=True))

    def stage_progress(
        self, stages: Iterable[str] = STAGES, after: int = 0
    ) -> dict[tuple[int, str], tuple[str, dt.datetime | None]]:
        """Each (batch, stage) of `stages` that has an event, of the batches after `after`: its state (as `states`:
        from the events it has, not their times) and when it was marked done (None unless it is done; a stage is
        marked done once). Reads only the events' batch, stage, state and time columns, and turns only those
        batches' rows into Python objects (at 10,000 micro-batches: 181 ms for every batch)."""
        events = self._after(BATCH_EVENTS, ["batch_id", "stage", "state", "at"], after)
        events = events.filter(pc.is_in(events["stage"], pa.array(list(stages), pa.string()))).to_pylist()
        done_at = {(e["batch_id"], e["stage"]): e["at"] for e in events if e["state"] == DONE}
        states = stage_states(events)
        return {key: (state, done_at.get(key) if state == DONE else None) for key, state in states.items()}

    # ------------------------------------------------------------------------------- one read, for a runner
    def progress(self) -> Progress:
        """What is left, what is halted and every stage's state, at one look at the log: the runner's loop
        (`streamdi.run.pipeline.drive`) plans a run from it. Only the batches with a stage not finished are walked
        (a long-running service's history is finished)."""
        states, halts, finished = self._events_index(lambda ix: (dict(ix.states), ix.halts(), frozenset(ix.finished)))
        open_batches = self._files_index(lambda index: sorted(index.by_batch.keys() - finished))
        return Progress(pending=_pending(open_batches, states), halted=[Halt(*h) for h in halts], states=states)


@dataclass(frozen=True)
class Registered:
    """The registered files as the stage of micro-batch `batch_id` asks about them: answered from the batch log's
    index (`BatchLog.before`), not by walking every registered file, which grows with history (a synthetic log of
    10,000 micro-batches of 13 parts each: ~3.6 s a micro-batch walked, ~10 ms from the index); without a log (`log`
    None), nothing was registered before."""

    log: BatchLog | None
    batch_id: int

    def copies(self, files: Iterable[BatchFile]) -> dict[tuple[int, str], str]:
        """(TPC-DI batch, sha256) -> the first file with those bytes registered by an earlier micro-batch, for the
        contents of `files`."""
        if self.log is None:
            return {}
        wanted = {(f.source_batch, f.sha256) for f in files}

        def read(index: FilesIndex) -> dict[tuple[int, str], str]:
            found = {key: index.first_copies.get(key) for key in wanted}
            return {key: f.file for key, f in found.items() if f is not None and f.batch_id < self.batch_id}

        return self.log._files_index(read)

    def missing_predecessors(self, files: list[str]) -> dict[str, str]:
        """`streamdi.parts.missing_predecessors` of `files` (this batch's) against the parts registered by this
        and earlier micro-batches."""
        if self.log is None:
            return missing_predecessors(files, parts_of(files))
        return self.log._files_index(lambda ix: missing_predecessors(files, RegisteredBy(ix.parts, self.batch_id)))

    def group_files(self, of: Iterable[str]) -> list[str]:
        """The files of earlier micro-batches that are parts of the same groups as the parts among `of`, in
        registration order."""
        groups = sorted({p.group for p in parts_of(of)})
        if self.log is None or not groups:
            return []

        def read(index: FilesIndex) -> list[str]:
            found = (f for g in groups for f in index.groups.get(g, ()) if f.batch_id < self.batch_id)
            return [f.file for f in sorted(found, key=lambda f: (f.batch_id, f.file_seq))]

        return self.log._files_index(read)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100, nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


def wall_clock() -> dt.datetime:
    """Wall clock for platform bookkeeping only (batch log, metrics); never used in transforms."""
    return dt.datetime.now(dt.UTC)
