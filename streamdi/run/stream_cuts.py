"""When the stream service (`streamdi.run.stream`) cuts the next micro-batch out of the waiting files: its trigger,
the parts it holds back for their predecessor, round cuts and the listing of the landing zone. Pure rules over
names, sizes and times (no batch log, no Spark): the service's loop feeds them what it sees.

Where it sits: landing zone -> (here: what waits, and whether to cut now) -> the collector
(`streamdi.collector.collect`, whose `hold` the service answers with `held_parts` and the round) -> the loop
(`streamdi.run.pipeline.drive`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from streamdi.collector import FULL_SCAN_SECONDS, SETTLED_NS, Listing, landing_relative, list_landing
from streamdi.generator.drip import manifest_path
from streamdi.parts import Part, part_of

CUTS = ("time", "round")


@dataclass(frozen=True)
class Trigger:
    """When the service cuts the next micro-batch out of the waiting files."""

    interval: float = 0.5  # seconds after the first waiting file was seen (0: as soon as a file waits)
    max_bytes: int = 0  # cut as soon as this many bytes wait, before the interval ends (0: no size trigger)
    poll: float = 0.05  # seconds between two listings of the landing zone
    cut: str = "time"  # "round": one round of parts per micro-batch (`next_round`), whatever the timing

    def __post_init__(self) -> None:
        if self.interval < 0 or self.max_bytes < 0 or self.poll <= 0:
            raise ValueError(f"a trigger needs interval >= 0, max_bytes >= 0 and poll > 0, got {self}")
        if self.cut not in CUTS:
            raise ValueError(f"unknown cut {self.cut!r}: one of {', '.join(CUTS)}")

    def fires(self, waited: float, waiting_bytes: int) -> bool:
        return waited >= self.interval or (self.max_bytes > 0 and waiting_bytes >= self.max_bytes)


def held_parts(
    new: list[str], present: Container[Part], first_seen: dict[str, float], now: float, grace: float
) -> set[str]:
    """The parts among `new` to hold back for now: a part whose predecessor (`streamdi.parts.Part`) is neither
    `present` (registered) nor among `new`, or is held itself, until it has waited `grace` seconds (`first_seen`:
    when the service first listed it; a file never listed has just arrived). Whole files are never held."""
    arrived: dict = {}
    for file in new:
        part = part_of(file)
        if part is not None:
            arrived.setdefault(part, []).append(file)
    held: set[str] = set()
    for part in sorted(arrived):  # a predecessor is decided before its successors
        before = part.predecessor()
        gap = before is not None and before not in present and (before not in arrived or arrived[before][0] in held)
        for file in arrived[part]:
            if gap and now - first_seen.get(file, now) < grace:
                held.add(file)
    return held


@dataclass(frozen=True)
class Round:
    """The next micro-batch of a round cut: the waiting files it takes, their round (TPC-DI batch, part number; None
    for whole files) and whether every file declared for the round has arrived (None: nothing declares it)."""

    key: tuple[int, int] | None
    files: frozenset[str]
    complete: bool | None


def next_round(
    waiting: list[str],
    registered: set[str],
    held: set[str],
    declared: Mapping[int, Mapping[int, frozenset[str]]],
    retired: Container[int] = frozenset(),
) -> Round | None:
    """The round to cut next out of `waiting` (minus the `held` parts): the whole files (no part number) if any wait,
    else the waiting parts of the lowest (TPC-DI batch, part number) -- duplicates, whose names carry their
    original's number, included. `declared` holds the feed's manifests: TPC-DI batch -> part number -> its landing
    files. A declared round is complete when all of its files are registered or waiting and every file declared for
    an earlier round is registered (a round never overtakes one that has not arrived yet); a round of a batch
    without a manifest is undeclared (`complete` None). `retired`: TPC-DI batches whose manifest declares only
    registered files, left out of `declared` (`Manifests`): they decide nothing any more, but their rounds are still
    declared ones."""
    free = [w for w in waiting if w not in held]
    if not free:
        return None
    parts = {w: part_of(w) for w in free}
    whole = frozenset(w for w, p in parts.items() if p is None)
    if whole:
        return Round(None, whole, None)
    key = min((p.source_batch, p.number) for p in parts.values() if p is not None)
    files = frozenset(w for w, p in parts.items() if p is not None and (p.source_batch, p.number) == key)
    if key[0] not in declared and key[0] not in retired:
        return Round(key, files, None)
    earlier = [f for b, rounds in declared.items() for n, fs in rounds.items() if (b, n) < key for f in fs]
    own = declared.get(key[0], {}).get(key[1], frozenset())
    complete = all(f in files or f in registered for f in own) and all(f in registered for f in earlier)
    return Round(key, files, complete)


class Manifests:
    """The drip manifests of a landing zone (`streamdi.generator.drip.manifest_path`) as a long-lived service reads
    them at every look: TPC-DI batch -> part number -> its landing files (duplicates left out). A manifest is read
    again when it changes; one being written is left out until the next look. Once every file a manifest declares is
    registered it is *retired*: no longer stat-ed or read, and out of `declared` (`next_round` still counts its
    rounds as declared). So a look costs the batches still arriving, not every manifest ever written (reading all of
    5,000 took 113 ms a look, more than the service's 50 ms poll: bench/stream_look.py). The manifests' directory is
    listed again only when its modification time changes (a manifest added), and everything, the retired ones
    included, is looked at again every `full_every` seconds (a manifest rewritten in place)."""

    def __init__(self, landing: Path, full_every: float = FULL_SCAN_SECONDS) -> None:
        self.folder = manifest_path(landing, 0).parent
        self.full_every = full_every
        self._read: dict[int, tuple[int, dict[int, frozenset[str]]]] = {}  # batch -> (mtime, rounds), not retired
        self._retired: dict[int, int] = {}  # batch -> its manifest's mtime when retired
        self._listed_at: int | None = None  # the folder's mtime when last listed
        self._active: dict[int, Path] = {}  # the manifests listed then, less the retired ones
        self._whole_at: float | None = None

    def declared(self, registered: Container[str]) -> tuple[dict[int, dict[int, frozenset[str]]], Container[int]]:
        """(the manifests not retired, the retired batches), given the `registered` files."""
        now = time.monotonic()
        whole = self._whole_at is None or now - self._whole_at >= self.full_every
        if whole:
            self._whole_at = now
        self._list(whole)
        out: dict[int, dict[int, frozenset[str]]] = {}
        for batch, path in list(self._active.items()):
            try:
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                self._forget(batch)
                continue
            if self._retired.get(batch) == mtime:
                del self._active[batch]
                continue
            self._retired.pop(batch, None)
            rounds = self._rounds(batch, path, mtime)
            if rounds is None:
                continue
            if all(f in registered for files in rounds.values() for f in files):
                self._retired[batch] = mtime
                self._read.pop(batch, None)
                del self._active[batch]
                continue
            out[batch] = rounds
        return out, self._retired.keys()

    def _list(self, whole: bool) -> None:
        """List the manifests again when the folder changed (or its time is too young to trust), or for a `whole`
        look, which looks at the retired ones again too."""
        try:
            mtime = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            self._listed_at, self._active = None, {}
            return
        if not whole and self._listed_at == mtime and mtime < time.time_ns() - SETTLED_NS:
            return
        self._listed_at = mtime
        listed = {}
        for path in sorted(self.folder.glob("batch*_manifest.json")):
            with contextlib.suppress(ValueError):
                listed[int(path.name[len("batch") : -len("_manifest.json")])] = path
        for batch in [b for b in self._retired if b not in listed]:
            self._forget(batch)
        self._active = listed if whole else {b: p for b, p in listed.items() if b not in self._retired}

    def _forget(self, batch: int) -> None:
        self._retired.pop(batch, None)
        self._read.pop(batch, None)
        self._active.pop(batch, None)

    def _rounds(self, batch: int, path: Path, mtime: int) -> dict[int, frozenset[str]] | None:
        cached = self._read.get(batch)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            deliveries = json.loads(path.read_text())["deliveries"]
        except (json.JSONDecodeError, KeyError, OSError):
            return None  # being written: the next look reads it
        rounds: dict[int, set[str]] = {}
        for delivery in deliveries:
            if delivery.get("kind", "original") == "original":
                rounds.setdefault(int(delivery["part"]), set()).add(delivery["file"])
        frozen = {n: frozenset(files) for n, files in rounds.items()}
        self._read[batch] = (mtime, frozen)
        return frozen


def waiting_files(
    landing: Path, registered: set[str], listing: Listing | None = None
) -> Iterator[tuple[str, int, float]]:
    """(relative path, size, mtime) of every collectable file under `landing` that `registered` lacks.

    `listing`, kept by the caller between calls (`streamdi.collector.Listing`), remembers the directories a look found
    nothing waiting in: the registered files only grow, so one whose modification time is unchanged still has nothing
    waiting and is not listed again: a long-running service's look costs the directories that changed, not every file
    ever landed (130,000 landed files: ~140 ms a look listed whole)."""
    if not landing.is_dir():
        return
    for directory in list_landing(landing, listing, warn_links=False):  # the collector warns about links
        waiting = [(relative, entry) for entry in directory.files
                   if (relative := landing_relative(landing, entry.path)) not in registered]  # fmt: skip
        if listing is not None:
            listing.settle(directory, not waiting)
        for relative, entry in waiting:
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield relative, stat.st_size, stat.st_mtime
