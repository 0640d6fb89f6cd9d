"""Facts about a Delta table read straight from the files of its log (`_delta_log/`), without opening the table.

Opening a table with delta-rs replays its log (6-17 ms on this 2-core machine); these answers cost a `stat` or a
directory listing. A Delta log holds one JSON commit file per version (`<version>.json`, written whole: delta-rs
writes it aside and renames it), checkpoint files (`<version>.checkpoint.parquet`, the table's state at that
version) and `_last_checkpoint`, naming the newest checkpoint. Log cleanup (`Lake.maintain`, `remove_before`) deletes
the commit files and checkpoints before an older checkpoint, once a newer checkpoint holds what they said: the first
commit is gone then.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq

FIRST_COMMIT = "00000000000000000000.json"  # a Delta log's first commit file
LAST_CHECKPOINT = "_last_checkpoint"  # names a Delta log's newest checkpoint
CHANGE_DIR = "_change_data"  # a table's change-data files (`cdc` actions: what a MERGE changed)
IDS_KEPT = 4096  # table ids remembered, one per (log file, inode, modification time)


def last_checkpoint(log_dir: Path) -> int:
    """The version of the table's last checkpoint (its `_last_checkpoint` file), -1 when it has none."""
    try:
        return int(json.loads((log_dir / LAST_CHECKPOINT).read_text())["version"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def log_version(log_dir: Path) -> int:
    """The table's latest version, from the names of its commit files, without opening it: log cleanup keeps the
    newest. -1 when the log has no commit file."""
    versions = [int(name[:-5]) for name in os.listdir(log_dir) if name.endswith(".json") and name[:-5].isdigit()]
    return max(versions, default=-1)


def remove_before(log_dir: Path, version: int) -> int:
    """Delete the log's commit files and checkpoints of the versions before `version` (one whose checkpoint exists,
    older than the newest: what they said is in the checkpoints); returns how many files were deleted. Every other
    file of the log (`_last_checkpoint`, a commit being written) is left alone.

    Why not delta-rs's cleanup: it keeps every log file younger than the log retention (30 days), and a local
    table's catch-up (`DeltaTable.update_incremental`) lists the whole log directory, so a table committed to in
    every micro-batch got slower with each one (quality.results after 500 SF 1 micro-batches: 2,946 log files, a
    catch-up after a commit 5.3 ms, 2.0 ms with 13 files)."""
    removed = 0
    for name in os.listdir(log_dir):
        if len(name) > 21 and name[:20].isdigit() and name[20] == "." and int(name[:20]) < version:
            try:
                (log_dir / name).unlink()
            except FileNotFoundError:  # removed by another process's cleanup meanwhile
                continue
            removed += 1
    return removed


def remove_change_files(table_dir: Path, older_than_seconds: float) -> int:
    """Delete the table's change-data files (`_change_data/`) that no commit still in its log names and that were
    written more than `older_than_seconds` ago; returns how many were deleted.

    Why: delta-rs's vacuum never looks into `_change_data/` (it passes over every directory whose name starts with an
    underscore), so each MERGE's change file stayed for good: 306 MB after 490 SF 1 micro-batches, 242 MB of them
    warehouse.prospect's, ~0.6 MB a micro-batch for ever. A change feed is read from the commits' `cdc` actions, so a
    file named by no commit left in the log (`remove_before` deleted it) can no longer be read by anyone; one too young
    may belong to a commit being written (its file is written first), and is left for a later call."""
    folder = table_dir / CHANGE_DIR
    if not folder.is_dir():
        return 0
    log_dir = table_dir / "_delta_log"
    named: set[str] = set()
    for name in os.listdir(log_dir):
        if name.endswith(".json") and name[:-5].isdigit():
            lines = _commit_lines(log_dir, int(name[:-5])) or []
            named.update(unquote(json.loads(line)["cdc"]["path"]) for line in lines if line.startswith('{"cdc"'))
    cutoff = time.time() - older_than_seconds
    removed = 0
    for parent, _, files in os.walk(folder):
        for file in files:
            full = Path(parent) / file
            try:
                if full.relative_to(table_dir).as_posix() in named or full.stat().st_mtime > cutoff:
                    continue
                full.unlink()
            except FileNotFoundError:  # removed by another process's maintenance meanwhile
                continue
            removed += 1
    return removed


def commit_infos(log_dir: Path, first: int, last: int) -> list[dict] | None:
    """The `commitInfo` action of each version from `first` to `last`, newest first, each with its `version` added:
    what delta-rs's `DeltaTable.history` gives for them, read from the commit files. delta-rs holds Python's lock
    while it reads a history (~0.3 s of a stream micro-batch's ~40 reads, every other thread of the process
    stopped); a few small JSON files are read here in well under a millisecond each. None when a commit file is
    gone (cleaned up after a checkpoint) or has no `commitInfo`."""
    infos = []
    for version in range(last, first - 1, -1):
        lines = _commit_lines(log_dir, version)
        if lines is None:
            return None
        for line in lines:
            if line.startswith('{"commitInfo"'):
                infos.append({**json.loads(line)["commitInfo"], "version": version})
                break
        else:
            return None
    return infos


def app_transactions(log_dir: Path, first: int, last: int) -> dict[str, int] | None:
    """The app transactions (`txn` actions: app id -> its version) that the commits from `first` to `last` record, a
    later commit's over an earlier one's (Delta keeps an app id's last); None when a commit file is gone (cleaned up
    after a checkpoint)."""
    found: dict[str, int] = {}
    for version in range(first, last + 1):
        lines = _commit_lines(log_dir, version)
        if lines is None:
            return None
        for line in lines:
            if line.startswith('{"txn"'):
                txn = json.loads(line)["txn"]
                found[str(txn["appId"])] = int(txn["version"])
    return found


def _commit_lines(log_dir: Path, version: int) -> list[str] | None:
    """The actions of commit `version`, one JSON text each, or None when its file is gone (cleaned up)."""
    try:
        return (log_dir / f"{version:020d}.json").read_text().splitlines()
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class _Known:
    table_id: str | None
    version: int
    apps: Mapping[str, int | None]  # app id -> its transaction version at `version` (None: it has none)


class AppTransactions:
    """Each table's app transaction versions, remembered at a table version and carried forward by reading the
    commit files made since. delta-rs's `DeltaTable.transaction_version` reads the log's actions since the last
    checkpoint again at every call (0.3 ms after a checkpoint, 4.8 ms 50 commits later); every exactly-once commit and
    every step's "already committed?" asks it (SF 1 micro-batches in a warm process: ~0.15 s of CPU each). A new
    commit file is a few hundred bytes to read here. Thread-safe; a table created again under its path (another
    `table_id`) starts afresh, and so does one whose commits since were cleaned up."""

    def __init__(self) -> None:
        self._known: dict[Path, _Known] = {}
        self._lock = threading.Lock()

    def version(self, path: Path, at: int, app_id: str, ask: Callable[[str], int | None]) -> int | None:
        """`app_id`'s transaction version in the table at `path` as of table version `at`; `ask(app_id)` is the
        answer of a handle at `at` (delta-rs), called when what is remembered cannot answer."""
        stamp = table_id(path)
        with self._lock:
            known = self._known.get(path)
        apps: dict[str, int | None] | None = None
        if known is not None and known.table_id == stamp and known.version <= at:
            newer = app_transactions(path / "_delta_log", known.version + 1, at) if known.version < at else {}
            if newer is not None:
                apps = {**known.apps, **newer}
        if apps is None:
            apps = {}
        if app_id not in apps:
            apps[app_id] = ask(app_id)
        with self._lock:
            current = self._known.get(path)
            if current is None or current.table_id != stamp or current.version <= at:
                self._known[path] = _Known(stamp, at, apps)
        return apps[app_id]


def table_id(path: Path) -> str | None:
    """The Delta table id of the table at `path` (its `metaData.id`, a UUID written when the table was created and
    carried by every checkpoint): another table created under the same path has another id, and log cleanup does not
    change it. Read from the first commit while it exists, else from the checkpoint `_last_checkpoint` names; each
    file is read once (a call then costs a `stat` or two). None when neither can be read (no table there)."""
    log_dir = path / "_delta_log"
    for name in (FIRST_COMMIT, LAST_CHECKPOINT):
        file = log_dir / name
        try:
            info = file.stat()
            return _id_in(str(file), info.st_ino, info.st_mtime_ns)
        except (OSError, LookupError, ValueError):  # gone (cleaned up since the stat), or not what a log holds
            continue
    return None


@lru_cache(maxsize=IDS_KEPT)
def _id_in(file: str, inode: int, mtime_ns: int) -> str:
    """The table id in a first commit file or in the checkpoint a `_last_checkpoint` file names; `inode` and
    `mtime_ns` key the memo, so a file written again is read again."""
    del inode, mtime_ns
    log_dir = Path(file).parent
    if file.endswith(".json"):
        for line in Path(file).read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                return str(action["metaData"]["id"])
        raise LookupError(f"no metaData action in {file}")
    version = last_checkpoint(log_dir)
    # single-part (`<v>.checkpoint.parquet`) or multi-part (`<v>.checkpoint.<part>.<parts>.parquet`) checkpoints
    for part in sorted(log_dir.glob(f"{version:020d}.checkpoint*.parquet")):
        for meta in pq.read_table(part, columns=["metaData"])["metaData"].to_pylist():
            if meta is not None:
                return str(meta["id"])
    raise LookupError(f"no metaData in the checkpoint at version {version} of {log_dir}")
