"""The batch log read per data file, once per process: the states a stage can be in, and the indexes of the
registered files and of the events that `streamdi.batchlog.BatchLog` answers from.

A Delta data file never changes, so each of the log's data files is folded into an index once (`Lake.fold_files`),
as it appears: what a long-running service asks of the log every micro-batch costs what was logged since it last
asked, not the whole history again. A compaction of the log replaces files with others holding the same rows: the
index takes in what the new files hold beyond the rows of the files they replaced (`Index.rewritten`: nothing, unless
a file never folded was compacted with them) instead of being built again from every file, which cost what the
whole history costs at every compaction (every 16 micro-batches by default). Were rows gone, it is built again.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from streamdi.lake import Lake
from streamdi.parts import Part, part_of


class Registration(Protocol):
    """A registered file as the index needs it (`streamdi.batchlog.BatchFile`)."""

    batch_id: int
    file_seq: int
    file: str
    sha256: str
    source_batch: int


STAGES: tuple[str, ...] = ("stage", "transform", "migrate")
DONE = "done"
HALTED = "halted"
RESUMED = "resumed"
SKIPPED = "skipped"
FINISHED = (DONE, SKIPPED)  # states after which a stage never runs again


def stage_states(events: Iterable[Mapping]) -> dict[tuple[int, str], str]:
    """The state of each (batch, stage) that has events (`batch_id`, `stage`, `state`), in any order: done, else
    skipped, else halted while halts outnumber resumes, else resumed (module docstring)."""
    seen: dict[tuple[int, str], dict[str, int]] = {}
    for e in events:
        counts = seen.setdefault((e["batch_id"], e["stage"]), {})
        counts[e["state"]] = counts.get(e["state"], 0) + 1
    return {key: state_of(counts.get) for key, counts in seen.items()}


def state_of(count: Callable[[str], int | None]) -> str:
    """The state of a (batch, stage) from its number of events of each state (`count(state)`, None for none)."""
    if count(DONE):
        return DONE
    if count(SKIPPED):
        return SKIPPED
    return HALTED if (count(HALTED) or 0) > (count(RESUMED) or 0) else RESUMED


@dataclass(frozen=True)
class EventFold:
    """What the runner needs of one data file of the log's events: how many events each (batch, stage, state) has,
    and each (batch, stage)'s last halt among them (its number, reason and time)."""

    counts: dict[tuple[int, str, str], int]
    halts: dict[tuple[int, str], tuple[int, str, dt.datetime]]


def events_in(rows: pa.Table) -> EventFold:
    """`EventFold` of one data file of the events (`EVENT_COLUMNS`); only its halts' details are parsed."""
    keys = ["batch_id", "stage", "state"]
    grouped = rows.select(keys).group_by(keys, use_threads=False).aggregate([([], "count_all")])
    columns = [grouped[c].to_pylist() for c in [*keys, "count_all"]]
    counts = {(b, stage, state): n for b, stage, state, n in zip(*columns, strict=True)}
    halts: dict[tuple[int, str], tuple[int, str, dt.datetime]] = {}
    for r in rows.filter(pc.equal(rows["state"], HALTED)).to_pylist():
        detail = json.loads(r["detail"]) if r["detail"] else {}
        halt = (detail.get("occurrence", 0), detail.get("reason", ""), r["at"])  # older versions' rows: number 0
        keep_last_halt(halts, (r["batch_id"], r["stage"]), halt)
    return EventFold(counts, halts)


def keep_last_halt(
    halts: dict[tuple[int, str], tuple[int, str, dt.datetime]], key: tuple[int, str], halt: tuple[int, str, dt.datetime]
) -> None:
    """Keep `halt` for `key` when it is the last one seen: the highest number, then the latest time."""
    kept = halts.get(key)
    if kept is None or (halt[0], halt[2]) > (kept[0], kept[2]):
        halts[key] = halt


EVENT_COLUMNS = ["batch_id", "stage", "state", "at", "detail"]


@dataclass
class Index:
    """The log's rows merged from the values of its data files (`Lake.fold_files`), file by file as they appear.
    A data file never changes, so a file folded in stays valid while it is in the snapshot: a log that grows by a
    few files a micro-batch costs those files, not the whole history again. `folded`: the value of each data file
    folded in, by file."""

    folded: dict[str, object] = field(default_factory=dict)

    def add(self, value: object) -> None:
        raise NotImplementedError

    def rewritten(self, gone: list, new: list) -> object | None:
        """The value of what the files of values `new` hold beyond the rows of the files of values `gone` (which
        left the snapshot: a compaction put their rows into new files), or None when some row of `gone` is not
        among them (rows were removed: the index is then built again)."""
        raise NotImplementedError


@dataclass
class FilesIndex(Index):
    """The registered files, by landing path and by batch (in `file_seq` order); for the parts among them, the
    first batch that registered each part and the files of each part's group (in batch, then `file_seq` order); the
    first file registered with each content of a TPC-DI batch (`(source_batch, sha256)`)."""

    by_path: dict[str, Registration] = field(default_factory=dict)
    by_batch: dict[int, list[Registration]] = field(default_factory=dict)
    last_batch_id: int = 0
    parts: dict[Part, int] = field(default_factory=dict)
    groups: dict[tuple[str, str, int], list[Registration]] = field(default_factory=dict)
    first_copies: dict[tuple[int, str], Registration] = field(default_factory=dict)

    def add(self, value: object) -> None:
        touched, groups = set(), set()
        for name, found in value.items():  # type: ignore[attr-defined]
            self.by_path[name] = found
            self.by_batch.setdefault(found.batch_id, []).append(found)
            touched.add(found.batch_id)
            content = (found.source_batch, found.sha256)
            first = self.first_copies.get(content)
            if first is None or (found.batch_id, found.file_seq) < (first.batch_id, first.file_seq):
                self.first_copies[content] = found
            part = part_of(name)
            if part is not None:
                self.parts[part] = min(self.parts.get(part, found.batch_id), found.batch_id)
                self.groups.setdefault(part.group, []).append(found)
                groups.add(part.group)
        for b in touched:
            self.by_batch[b].sort(key=lambda f: f.file_seq)
        for g in groups:
            self.groups[g].sort(key=lambda f: (f.batch_id, f.file_seq))
        self.last_batch_id = max(self.last_batch_id, *touched) if touched else self.last_batch_id

    def rewritten(self, gone: list, new: list) -> dict[str, Registration] | None:
        old: dict[str, Registration] = {}
        for value in gone:
            old.update(value)
        now: dict[str, Registration] = {}
        for value in new:
            now.update(value)
        if any(now.get(name) != found for name, found in old.items()):
            return None
        return {name: found for name, found in now.items() if name not in old}


class RegisteredBy(Container[Part]):
    """The parts registered up to a batch (`FilesIndex.parts`), without copying them."""

    def __init__(self, parts: Mapping[Part, int], batch_id: int) -> None:
        self._parts, self._batch_id = parts, batch_id

    def __contains__(self, part: object) -> bool:
        first = self._parts.get(part)  # type: ignore[call-overload]
        return first is not None and first <= self._batch_id


@dataclass
class EventsIndex(Index):
    """The events merged: their counts, each stage's state and last halt, and the sets the runner asks for."""

    counts: dict[tuple[int, str, str], int] = field(default_factory=dict)
    last_halts: dict[tuple[int, str], tuple[int, str, dt.datetime]] = field(default_factory=dict)
    states: dict[tuple[int, str], str] = field(default_factory=dict)
    halted: set[tuple[int, str]] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)  # batches whose every stage is done or skipped
    skipped: set[int] = field(default_factory=set)  # batches whose transform was skipped

    def add(self, value: object) -> None:
        assert isinstance(value, EventFold)
        for key, n in value.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for key, halt in value.halts.items():
            keep_last_halt(self.last_halts, key, halt)
        for b, stage in {key[:2] for key in value.counts}:
            state = state_of(lambda s, b=b, stage=stage: self.counts.get((b, stage, s)))
            self.states[(b, stage)] = state
            (self.halted.add if state == HALTED else self.halted.discard)((b, stage))
            if stage == "transform" and state == SKIPPED:
                self.skipped.add(b)
            if all(self.states.get((b, s)) in FINISHED for s in STAGES):
                self.finished.add(b)

    def rewritten(self, gone: list, new: list) -> EventFold | None:
        old: dict[tuple[int, str, str], int] = {}
        for value in gone:
            for key, n in value.counts.items():
                old[key] = old.get(key, 0) + n
        now: dict[tuple[int, str, str], int] = {}
        halts: dict[tuple[int, str], tuple[int, str, dt.datetime]] = {}
        for value in new:
            for key, n in value.counts.items():
                now[key] = now.get(key, 0) + n
            for key, halt in value.halts.items():
                keep_last_halt(halts, key, halt)  # kept again: the last halt of a stage is the last either way
        if any(now.get(key, 0) < n for key, n in old.items()):
            return None
        return EventFold({key: n - old.get(key, 0) for key, n in now.items() if n > old.get(key, 0)}, halts)

    def halts(self) -> list[tuple[int, str, str, dt.datetime]]:
        """The halted stages, oldest batch first: (batch, stage, its last halt's reason and time)."""
        ordered = sorted(self.halted, key=lambda k: (k[0], STAGES.index(k[1])))
        return [(b, stage, *self.last_halts[(b, stage)][1:]) for b, stage in ordered]


_INDEX_LOCK = threading.Lock()
_INDEXES: dict[tuple[str, str], Index] = {}  # (the table's path, the fold's name) -> its index in this process
T = TypeVar("T")
IndexT = TypeVar("IndexT", bound=Index)


def indexed(
    lake: Lake,
    table: Table,
    columns: list[str],
    name: str,
    fold: Callable[[pa.Table], object],
    make: Callable[[], IndexT],
    read: Callable[[IndexT], T],
) -> T:
    """`read` of the table's `Index` (`make` builds an empty one), brought up to the latest snapshot first; `read`
    runs under the index's lock, so what it returns must be a copy of what can change."""
    per_file = lake.fold_files(table, columns, name, fold)
    key = (str(lake.path(table)), name)
    with _INDEX_LOCK:
        index = _INDEXES.get(key)
        gone = [] if index is None else [f for f in index.folded if f not in per_file]
        if gone and index is not None:
            new = [f for f in per_file if f not in index.folded]
            extra = index.rewritten([index.folded[f] for f in gone], [per_file[f] for f in new])
            if extra is not None:
                for f in gone:
                    del index.folded[f]
                index.add(extra)
                index.folded.update((f, per_file[f]) for f in new)
            else:
                index = None
        if index is None:
            index = make()
            _INDEXES[key] = index
        for f, value in per_file.items():
            if f not in index.folded:
                index.add(value)
                index.folded[f] = value
        return read(index)  # type: ignore[arg-type]
