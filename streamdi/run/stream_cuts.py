"""When the stream service (`streamdi.run.stream`) cuts the next micro-batch out of the waiting files: its trigger,
the parts it holds back for their predecessor, round cuts and the listing of the landing zone. Pure rules over
names, sizes and times (no batch log, no Spark): the service's loop feeds them what it sees.

Where it sits: landing zone -> (here: what waits, and whether to cut now) -> the collector
(`streamdi.collector.collect`, whose `hold` the service answers with `held_parts` and the round) -> the loop
(`streamdi.run.pipeline.drive`).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from streamdi.collector import Listing, landing_relative, list_landing
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
) -> Round | None:
    """The round to cut next out of `waiting` (minus the `held` parts): the whole files (no part number) if any wait,
    else the waiting parts of the lowest (TPC-DI batch, part number) -- duplicates, whose names carry their
    original's number, included. `declared` holds the feed's manifests: TPC-DI batch -> part number -> its landing
    files. A declared round is complete when all of its files are registered or waiting and every file declared for
    an earlier round is registered (a round never overtakes one that has not arrived yet); a round of a batch
    without a manifest is undeclared (`complete` None)."""
    free = [w for w in waiting if w not in held]
    if not free:
        return None
    parts = {w: part_of(w) for w in free}
    whole = frozenset(w for w, p in parts.items() if p is None)
    if whole:
        return Round(None, whole, None)
    key = min((p.source_batch, p.number) for p in parts.values() if p is not None)
    files = frozenset(w for w, p in parts.items() if p is not None and (p.source_batch, p.number) == key)
    if key[0] not in declared:
        return Round(key, files, None)
    earlier = [f for b, rounds in declared.items() for n, fs in rounds.items() if (b, n) < key for f in fs]
    complete = declared[key[0]].get(key[1], frozenset()) <= files | registered and registered.issuperset(earlier)
    return Round(key, files, complete)


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
