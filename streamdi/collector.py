"""The collector: turns what arrived in the landing zone into the next micro-batch of the batch log.

Every file under the landing directory (recursively) is registered exactly once. New files found in one
pass form one micro-batch (`merged`: whole files in arrival order -- modification time, ties broken by path --
then the parts of split files in their declared order, whatever the interleaving of their arrivals). Writers should
deliver a file under a temporary name and rename it when complete: names starting with `.` or `_`, or ending
in `.tmp`, `.part` or `~`, are not collected. A registered file whose content later changes is reported and
not collected again (deliver corrections under a new name). A registered file whose size and modification
time are unchanged is not read again (a scheduled collect costs a directory listing). Only regular files inside
the landing directory are collected and read (`read_landed`): a symbolic link (to a file or a directory) is skipped
with a warning, so a link cannot bring a file from elsewhere on the machine into the warehouse or its rejects.
A file that disappears while a pass reads it (renamed or removed between the listing and the read) is left out of
that pass with a warning; under its new name in the landing zone it is collected by a later pass.

The TPC-DI batch of a file comes from its path: a `BatchN` directory or a `batchN` mark in the file name
(e.g. `Batch2/Trade.txt`, `Trade_batch2_0007.txt`). A file with no mark belongs to the TPC-DI batch that was
open when it arrived: the latest batch of any file registered or found before it (batch 1 at the start).

New files of different TPC-DI batches never share a micro-batch: one pass registers one micro-batch per
TPC-DI batch found, oldest TPC-DI batch first, so a landing zone holding `Batch1/`, `Batch2/` and `Batch3/`
becomes micro-batches 1, 2 and 3 in that order.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from streamdi.batchlog import BatchFile, BatchLog, LandedFile
from streamdi.parts import part_of

log = logging.getLogger(__name__)

_SOURCE_BATCH = re.compile(r"(?i)batch[_-]?(\d+)")
_SKIP_SUFFIXES = (".tmp", ".part", "~")
HASH_THREADS = 4  # landing files read at once by a collect


@dataclass(frozen=True)
class CollectResult:
    batch_id: int | None  # the last micro-batch registered by this pass
    files: list[LandedFile] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    batch_ids: list[int] = field(default_factory=list)  # every micro-batch registered by this pass


def source_batch_of(relative: str) -> int | None:
    """The TPC-DI batch marked in a landing path (`Batch2/...`, `..._batch2_...`), or None if unmarked."""
    marks = _SOURCE_BATCH.findall(relative)
    return int(marks[-1]) if marks else None


def is_collectable(name: str) -> bool:
    """Whether a file of this name is collected (not a temporary name of a delivery in progress)."""
    return not name.startswith((".", "_")) and not name.endswith(_SKIP_SUFFIXES)


class NotARegularFile(OSError):
    """A landing path that is not a regular file (a symbolic link, a FIFO, a device): never read."""


def open_landed(path: str | Path):
    """A binary file object of a landed file, refusing anything but a regular file: the last component is opened
    without following a symbolic link (`O_NOFOLLOW`, so the check and the read are one step) and without blocking
    on a FIFO. Raises `NotARegularFile` with the path."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(
                f"{path} is a symbolic link: only regular files in the landing zone are read"
            ) from None
        raise
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise NotARegularFile(f"{path} is not a regular file: only regular files in the landing zone are read")
    return handle


def read_landed(path: str | Path) -> bytes:
    """The bytes of a landed file (`open_landed`)."""
    with open_landed(path) as handle:
        return handle.read()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_landed(path) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_if_there(path: Path) -> str | None:
    """`_sha256`, or None for a file that is gone since it was listed."""
    try:
        return _sha256(path)
    except FileNotFoundError:
        return None


def _vanished(relative: str) -> None:
    log.warning(
        "%s disappeared while it was being collected (renamed or removed during the scan); not registered: "
        "under a new name in the landing zone it is collected by a later pass",
        relative,
    )


FULL_SCAN_SECONDS = 300.0  # a `Listing` lists every directory again at least this often
SETTLED_NS = 2_000_000_000  # a directory modified longer ago than this may be left unlisted while unchanged


@dataclass
class Listing:
    """What a long-lived process (the stream service) remembers of the landing zone between collects: the
    directories whose every collectable file was registered and unchanged at a scan (path -> their modification time
    and subdirectories). A directory's modification time changes whenever a name is added, removed or renamed in it,
    so one whose time is unchanged holds no new file and is not listed again: a collect then costs the directories
    that changed, not every file ever landed (130,000 landed files: ~1.5 s a collect listed and stat-ed whole). A
    registered file changed in place leaves its directory's time alone: every `full_every` seconds everything is
    listed again, so such a file is still reported (`collect`'s `changed`). A time younger than `SETTLED_NS` is not
    trusted (a name added within the same tick of the file system's clock would leave it unchanged)."""

    full_every: float = FULL_SCAN_SECONDS
    quiet: dict[str, tuple[int, list[Path]]] = field(default_factory=dict)
    listed_whole_at: float | None = None  # time.monotonic() of the last scan that listed every directory

    def settle(self, directory: Listed, quiet: bool) -> None:
        """Remember whether `directory`, as just listed, is quiet (its caller found nothing to do in it): it is then
        left unlisted while its modification time stays, if that time is older than `SETTLED_NS`."""
        if quiet and directory.mtime_ns < time.time_ns() - SETTLED_NS:
            self.quiet[str(directory.path)] = (directory.mtime_ns, directory.subdirectories)
        else:
            self.quiet.pop(str(directory.path), None)


@dataclass(frozen=True)
class Listed:
    """One directory of the landing zone as a scan listed it: its modification time, its subdirectories and its
    regular, collectable files."""

    path: Path
    mtime_ns: int
    subdirectories: list[Path]
    files: list[os.DirEntry]


def landing_relative(landing: Path, path: str) -> str:
    """The landing-relative form (`Batch2/Trade.txt`) of `path`, a path under `landing` as `os.scandir` gives it."""
    return path[len(str(landing)) + 1 :] if os.sep == "/" else Path(path).relative_to(landing).as_posix()


def list_landing(landing: Path, listing: Listing | None, *, warn_links: bool = True) -> list[Listed]:
    """The directories under `landing` to look at (not those whose name starts with `.` or `_`, nor those `listing`
    knows as quiet while their time is unchanged), each with its regular, collectable files (a symbolic link is left
    out, with a warning unless `warn_links` is False: a link cannot bring a file from elsewhere into the warehouse).
    The caller tells `listing` which of them were quiet (`Listing.settle`)."""
    whole = listing is None or listing.listed_whole_at is None
    if listing is not None and not whole:
        whole = time.monotonic() - listing.listed_whole_at >= listing.full_every  # type: ignore[operator]
    if listing is not None and whole:
        listing.listed_whole_at = time.monotonic()
    found = []
    stack = [landing]
    while stack:
        directory = stack.pop()
        try:
            mtime = directory.stat().st_mtime_ns
            quiet = listing.quiet.get(str(directory)) if listing is not None and not whole else None
            if quiet is not None and quiet[0] == mtime:
                stack.extend(quiet[1])
                continue
            with os.scandir(directory) as scan:
                entries = list(scan)
        except FileNotFoundError:
            continue
        subdirectories = [
            Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith((".", "_"))
        ]
        stack.extend(subdirectories)
        files = []
        for entry in entries:
            if not is_collectable(entry.name) or entry.is_dir(follow_symlinks=False):
                continue
            if entry.is_symlink():
                if warn_links:
                    log.warning(
                        "%s is a symbolic link; not collected (only regular files in the landing zone are)", entry.path
                    )
            elif entry.is_file(follow_symlinks=False):
                files.append(entry)
        found.append(Listed(directory, mtime, subdirectories, files))
    return found


def scan_landing(
    landing: Path, known: dict[str, BatchFile] | None = None, listing: Listing | None = None
) -> list[LandedFile]:
    """Every collectable file under `landing`, in arrival order (mtime, then relative path). A file that disappears
    while it is listed or read is left out, with a warning.

    A file in `known` (the registered files) whose size and modification time are unchanged keeps its
    registered checksum instead of being read again, so a scheduled collect costs a directory listing, not a
    re-read of the whole landing zone. With a `listing` (kept by a long-lived caller), such files are left out of the
    result (only what is new or changed is returned), and the directories it knows hold only such files are not listed
    again while unchanged.
    """
    if not landing.is_dir():
        raise FileNotFoundError(f"landing directory {landing} does not exist")
    known = known or {}
    listed: list[tuple[Path, str, os.stat_result, BatchFile | None, bool]] = []
    for directory in list_landing(landing, listing):
        quiet = True
        for entry in directory.files:
            relative = landing_relative(landing, entry.path)
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                _vanished(relative)
                continue
            seen = known.get(relative)
            arrived_at = dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC)
            unchanged = seen is not None and seen.size_bytes == stat.st_size and seen.arrived_at == arrived_at
            quiet = quiet and unchanged
            if not (unchanged and listing is not None):  # a registered file as it was: nothing for a collect to do
                listed.append((Path(entry.path), relative, stat, seen, unchanged))
        if listing is not None:
            listing.settle(directory, quiet)
    # the new and changed files are read in parallel (the channels' files are independent; hashing is I/O bound)
    to_read = [path for path, _, _, _, unchanged in listed if not unchanged]
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        digests = dict(zip(to_read, pool.map(_sha256_if_there, to_read), strict=True))
    found: list[tuple[LandedFile, bool]] = []
    for path, relative, stat, seen, unchanged in listed:
        if not unchanged and digests[path] is None:
            _vanished(relative)
            continue
        mark = source_batch_of(relative)
        landed = LandedFile(
            file=relative,
            size_bytes=stat.st_size,
            sha256=seen.sha256 if unchanged else digests[path],
            arrived_at=dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC),
            source_batch=mark or 0,
        )
        found.append((landed, mark is None and seen is None))
    found.sort(key=lambda item: (item[0].arrived_at, item[0].file))
    # an unmarked new file belongs to the TPC-DI batch open when it arrived
    open_batch = max((f.source_batch for f in known.values()), default=1)
    result = []
    for landed, unmarked in found:
        if unmarked:
            landed = LandedFile(landed.file, landed.size_bytes, landed.sha256, landed.arrived_at, open_batch)
        elif landed.file in known:
            landed = LandedFile(
                landed.file, landed.size_bytes, landed.sha256, landed.arrived_at, known[landed.file].source_batch
            )
        open_batch = max(open_batch, landed.source_batch)
        result.append(landed)
    return result


def channel_order(landing: Path) -> dict[str, int]:
    """The fixed order of the landing zone's channels: the root (''), then its sub-directories by name (one per
    source system or producer; `BatchN` folders count as channels too). Ties of the merge are broken by it."""
    names = [""] + sorted(p.name for p in landing.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    return {name: i for i, name in enumerate(names)}


def merged(files: list[LandedFile], channels: dict[str, int]) -> list[LandedFile]:
    """The order of one micro-batch's files (their `file_seq`): whole files first, in arrival order (a correction
    delivered later wins, `jobs.reference`); then the parts, merged by their declared order key (TPC-DI batch, part
    number), ties broken by the channel order, then the name. So parts collected together get the same order
    whatever the interleaving of their arrivals across channels."""
    whole = [f for f in files if part_of(f.file) is None]
    parts = [(part_of(f.file), f) for f in files if part_of(f.file) is not None]
    parts.sort(key=lambda pf: (pf[0].source_batch, pf[0].number, channels.get(pf[0].channel.split("/")[0], 0),
                               pf[1].file))  # fmt: skip
    return whole + [f for _, f in parts]


def collect(
    batch_log: BatchLog,
    landing: Path,
    *,
    now: dt.datetime,
    hold: Callable[[list[str], set[str]], set[str]] | None = None,
    listing: Listing | None = None,
) -> CollectResult:
    """Register every new landing file exactly once (even under concurrent callers): one new micro-batch per
    TPC-DI batch among the new files, oldest TPC-DI batch first. `hold(new, registered)` names new files to leave
    for a later pass (the stream service holds back a part whose predecessor has not arrived). `listing`: what a
    long-lived caller remembers of the landing zone between collects (`Listing`)."""
    with batch_log.lake.lock("collector"):
        known = batch_log.registered_files()
        new, changed = [], []
        landed_files = scan_landing(landing, known, listing)
        held = hold([f.file for f in landed_files if f.file not in known], set(known)) if hold else set()
        for landed in landed_files:
            seen = known.get(landed.file)
            if seen is None:
                if landed.file in held:
                    continue
                new.append(landed)
            elif seen.sha256 != landed.sha256:
                changed.append(landed.file)
        for name in changed:
            log.warning(
                "landing file %s changed after it was collected in batch %s; ignored "
                "(deliver corrections under a new name)",
                name,
                known[name].batch_id,
            )
        batch_ids = []
        for source_batch in sorted({f.source_batch for f in new}):
            files = merged([f for f in new if f.source_batch == source_batch], channel_order(landing))
            batch_ids.append(batch_log.register(files, now=now))
    return CollectResult(batch_id=batch_ids[-1] if batch_ids else None, files=new, changed=changed, batch_ids=batch_ids)
