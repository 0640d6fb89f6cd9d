"""File locks across processes, and the lease that lets one runner at a time advance a lake.

- `flocked(path)`: an exclusive `flock` on `path` (created if missing) for the `with` block. The kernel drops it
  when the process dies, so a `kill -9` never leaves a lock behind. `flocked_nowait(path, holder)` is refused at
  once instead of waiting (one stream service per home), and `flock_held(path)` says whether someone holds it.
- `lake_lease(root, runner)`: the **runner lease** of the lake at `root`. Everything that advances the batch log
  (a `streamdi load`/`run`, `streamdi migrate`, the operator's `batch resume`/`skip`, the stream service, every
  Airflow task that collects, stages, transforms or migrates) holds it while it works. A second runner is refused at
  once with `LakeBusy`, whose message names the holder (its command, pid, Airflow DAG run, since when) and what to
  do. The tasks of one Airflow DAG run share the lease (its transform steps run side by side by design); another
  DAG run, a CLI or the stream service cannot join them. Order is the batch log's: a lease only keeps two runners
  from working on it at the same time.

The holders are kept in `<root>/_locks/lease.json` (read and written under the `flock` of `lease.lock`). A holder
whose process has died (pid gone, or reused by another process: its start time differs) no longer counts, so a
restart after `kill -9` takes the lease at once. The lease is re-entrant within a process. Like `Lake.lock`, it is
a lock among the processes of one machine (a lake shared by machines needs a lock service, which streamdi does
not have).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

from streamdi.errors import LakeDiskFull

log = logging.getLogger(__name__)

LOCK_DIR = "_locks"
LEASE_FILE = "lease.json"
LEASE_LOCK = "lease.lock"


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (across processes of this machine) for the `with` block.

    Not re-entrant: a process must not take the same path twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class HeldElsewhere(RuntimeError):
    """`flocked_nowait`: another process holds the lock. `holder` is the line it wrote into the file."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path = path
        self.holder = holder


@contextlib.contextmanager
def flocked_nowait(path: Path, holder: str = "") -> Iterator[None]:
    """`flocked` without waiting: raises HeldElsewhere at once when another process holds `path`'s lock. While
    held, the file holds the line `holder` (e.g. "pid 123"), for the message a refused process gets.

    Not re-entrant: a process must not take the same path twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise HeldElsewhere(path, handle.read().strip()) from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{holder}\n" if holder else "")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def flock_held(path: Path) -> bool:
    """Whether a process holds `path`'s lock (`flocked`, `flocked_nowait`) now; False when there is no such file."""
    if not path.exists():
        return False
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


class LakeBusy(RuntimeError):
    """Another runner holds the lake's lease."""


def runner_group() -> str:
    """Who may share the lease with this process: the Airflow DAG run its task belongs to (the task runner puts it
    in the environment), else this process alone."""
    dag, run = os.environ.get("AIRFLOW_CTX_DAG_ID"), os.environ.get("AIRFLOW_CTX_DAG_RUN_ID")
    if dag and run:
        return f"Airflow DAG run {dag} / {run}"
    return f"process {os.getpid()}"


_held: dict[Path, int] = {}  # lake root -> depth of this process's lease on it
_held_guard = threading.Lock()


def describe_runner() -> str:
    """This process, as a refused runner is told about it: its Airflow task, else its command line."""
    dag, task = os.environ.get("AIRFLOW_CTX_DAG_ID"), os.environ.get("AIRFLOW_CTX_TASK_ID")
    if dag and task:
        return f"Airflow task {dag}.{task}"
    words = psutil.Process().cmdline() or ["?"]
    command = " ".join([Path(words[0]).name, *words[1:]])
    return command if len(command) <= 120 else command[:117] + "..."


@contextlib.contextmanager
def lake_lease(root: Path, runner: str | None = None) -> Iterator[None]:
    """Hold the runner lease of the lake at `root` for the `with` block; `runner` says who holds it in the message a
    refused runner sees (default: `describe_runner()`, e.g. "streamdi load --data ... --batch 2", "Airflow task
    streamdi_incremental.stage").

    Raises LakeBusy at once when a runner of another group holds it."""
    root = Path(root).absolute()
    with _held_guard:
        depth = _held.get(root, 0)
        if depth == 0:
            _acquire(root, runner or describe_runner())
        _held[root] = depth + 1
    try:
        yield
    finally:
        with _held_guard:
            _held[root] -= 1
            if _held[root] == 0:
                del _held[root]
                _release(root)


def lease_holders(root: Path) -> list[dict]:
    """The live holders of the lake's lease (empty when it is free)."""
    folder = Path(root).absolute() / LOCK_DIR
    with flocked(folder / LEASE_LOCK):
        return _live(_read(folder))


def _acquire(root: Path, runner: str) -> None:
    folder = root / LOCK_DIR
    me = {
        "pid": os.getpid(),
        "started": psutil.Process().create_time(),
        "group": runner_group(),
        "runner": runner,
        "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    with flocked(folder / LEASE_LOCK):
        holders = _live(_read(folder))
        others = [h for h in holders if h["group"] != me["group"]]
        if others:
            raise LakeBusy(_busy_message(root, others[0], runner))
        _write(folder, [*holders, me])


def _release(root: Path) -> None:
    folder = root / LOCK_DIR
    try:
        with flocked(folder / LEASE_LOCK):
            _write(folder, [h for h in _live(_read(folder)) if h["pid"] != os.getpid()])
    except OSError as exc:  # e.g. a full disk: must not hide the error the run is ending with
        log.warning("could not give back the runner lease of %s (%s); it lapses when this process ends", root, exc)


def _busy_message(root: Path, holder: dict, runner: str) -> str:
    return (
        f"refused ({runner}): the lake {root} is in use by {holder['runner']} (pid {holder['pid']}, {holder['group']}, "
        f"since {holder['since']}); one runner at a time may advance a lake. Wait for it to finish or stop it "
        "(`streamdi stream stop` for the stream service; pause the other Airflow DAG), then run again."
    )


def _read(folder: Path) -> list[dict]:
    try:
        return json.loads((folder / LEASE_FILE).read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError:  # written by replace, so only a hand edit gets here: no holder is known
        return []


def _write(folder: Path, holders: list[dict]) -> None:
    tmp = folder / f".{LEASE_FILE}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(holders, indent=1))
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise LakeDiskFull(
                errno.ENOSPC, f"the lake's disk is full ({folder.parent}): free space and run again"
            ) from exc
        raise
    os.replace(tmp, folder / LEASE_FILE)


def _live(holders: list[dict]) -> list[dict]:
    return [h for h in holders if _alive(h)]


def _alive(holder: dict) -> bool:
    try:
        process = psutil.Process(holder["pid"])
        return process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - holder["started"]) < 0.01
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # it exists but cannot be looked at: count it
    except (KeyError, TypeError):
        return False  # not an entry this module wrote
