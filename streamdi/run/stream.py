"""The always-on stream service (`streamdi stream`): one warm process that watches the landing zone and runs every
micro-batch through stage -> transform -> migrate as soon as its trigger fires.

A `streamdi load` or an Airflow task is a new process: it starts (or connects to) Spark, imports Great Expectations,
opens PostgreSQL, and its first plans meet a cold JIT. The service pays that once and keeps it: its SparkSession, the
warehouse connection settings, the imported suites. It then loops:

1. **Watch**: list the landing zone (a directory listing; a file's bytes are read only when it is collected). A file is
   *waiting* when the batch log has not registered it (`stream_cuts.waiting_files`); the collector's naming rules apply
   (`streamdi.collector`: write under a temporary name, then rename). A part whose predecessor has not arrived
   (`schemas.ordering`) is *held* until it does, or until it has waited `missing_part_grace` seconds (it is then cut
   without it, and its stage applies `missing_part_policy`), so out-of-order deliveries are put back in order before
   they run.
2. **Cut** (the trigger, `stream_cuts.Trigger` and `stream_cuts.next_round`): once files wait, the next micro-batch is
   cut `interval` seconds after the first of them was seen (0: at once), or as soon as `max_bytes` are waiting. Whatever
   waits at that moment is collected as one micro-batch per TPC-DI batch, exactly as `streamdi run` would collect it.
   With `cut="round"` the cuts do not depend on timing: each micro-batch is one *round*, the parts of one number of one
   TPC-DI batch (every source's `..._batch2_0003`, whatever channel brought them), lowest round first, cut as soon as
   every file the feed's manifest declares for it has arrived (`streamdi generate drip` writes one before its files), or
   after `missing_part_grace` seconds without the rest; a round without a manifest, and whole files (no part number),
   are cut by the time trigger, each on its own. The same deliveries then make the same micro-batches whatever the
   arrival order and the service's speed.
3. **Run**: every pending (batch, stage) in order, through the one loop the CLI and the Airflow tasks run too
   (`pipeline.run_pending`, `pipeline.drive`); the batch log records each stage, so a crash (`kill -9`) and a restart
   resume exactly once, and the first thing a (re)started service does is finish what the log has pending.

A run that fails on infrastructure (PostgreSQL stopped, a full disk) is retried with a growing pause, the error in the
status, and the service gives up (exit 1) after `GIVE_UP` failures in a row. A halted batch stops the service's work
(nothing after it may run) but not the service: it reports the halt and waits for an operator's `streamdi batch
resume|skip`, then goes on. SIGTERM or Ctrl-C finishes the micro-batch in flight (all of its stages) and stops; a second
one abandons it at once (its finished stages are in the batch log; a restart does the rest).

State for operators: `<home>/stream/status.json` (rewritten atomically at every change and every second), read by
`streamdi stream status` (`streamdi.run.stream_status`, also the Airflow supervision): whether the service runs, what it
does, the lag (age of the oldest waiting file), the last micro-batches with their latency from arrival to visible in
PostgreSQL (`streamdi.batch_metrics`), rows/s and any halt. One service per home (`<home>/stream/service.lock`,
`streamdi.locks.flocked_nowait`); it holds the lake's runner lease (`streamdi.locks`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from streamdi.batchlog import BatchLog
from streamdi.collector import Listing
from streamdi.context import JobContext
from streamdi.errors import causes
from streamdi.locks import HeldElsewhere, flocked_nowait, lake_lease
from streamdi.memory import footprint
from streamdi.parts import Part, missing_predecessors, part_of, parts_of
from streamdi.run.stream_cuts import Manifests, Round, Trigger, held_parts, next_round, waiting_files
from streamdi.run.stream_status import LOCK_FILE, STATUS_FILE, folder

log = logging.getLogger(__name__)

HEARTBEAT = 1.0  # seconds between two status writes while nothing changes
HALT_RECHECK = 2.0  # seconds between two looks at the batch log while a batch is halted
RECENT = 200  # micro-batches kept in the status for latency percentiles and rows/s
RETRY_FIRST = 1.0  # seconds before the first retry of a failed run; doubled after each failure
RETRY_MAX = 30.0
GIVE_UP = 8  # failed runs in a row after which the service stops with the error
JVM_EXIT_WAIT = 2.0  # seconds a run that lost its connection to the driver JVM waits to see the JVM's exit


@dataclass
class BatchLatency:
    """One micro-batch as the service saw it: its stages' run times and its times from `streamdi.batch_metrics`
    (seconds after the arrival of its last file)."""

    batch_id: int
    rows: int
    seconds: dict[str, float]  # stage -> run time in this service
    staged: float | None = None
    committed: float | None = None  # all of its Delta commits done (transform marked)
    visible: float | None = None  # visible in PostgreSQL
    cold: bool = False  # the service's first micro-batch: it met a cold Spark (left out of the percentiles)


@dataclass
class Status:
    pid: int
    started_at: str
    state: str = "starting"  # starting | idle | waiting | processing | halted | stopping | stopped
    updated_at: str = ""
    trigger: dict = field(default_factory=dict)
    landing: str = ""
    waiting_files: int = 0
    waiting_bytes: int = 0
    lag_seconds: float = 0.0  # age of the oldest waiting file (0 when none waits)
    held_files: list[str] = field(default_factory=list)  # parts held back until their predecessor arrives
    processing: int | None = None  # the micro-batch in flight
    last_batch: int | None = None  # the newest micro-batch visible in PostgreSQL
    batches_done: int = 0
    rows_done: int = 0
    halt: str | None = None
    error: str | None = None
    recent: list[dict] = field(default_factory=list)  # BatchLatency rows, oldest first
    memory: dict = field(default_factory=dict)  # after the last micro-batch: `streamdi.memory.footprint`
    landing_deleted: int = 0  # landing files of finished micro-batches deleted since the start (`landing_cleanup`)


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


def _utcnow() -> dt.datetime:
    """Wall clock for the service's bookkeeping only (status, lag); never used in transforms."""
    return dt.datetime.now(dt.UTC)


class StreamService:
    """The service's loop (`run`) over one warm `JobContext`. `stop()` (the first SIGTERM) lets the micro-batch in
    flight finish; `idle_exit` (seconds with nothing waiting or pending) ends the loop by itself, for scripted
    use."""

    def __init__(
        self,
        ctx: JobContext,
        trigger: Trigger = Trigger(),  # noqa: B008 (frozen: never changed)
        *,
        idle_exit: float | None = None,
        on_batch: Callable[[BatchLatency], None] | None = None,
        on_state: Callable[[Status], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.trigger = trigger
        self.idle_exit = idle_exit
        self.on_batch = on_batch
        self.on_state = on_state
        self.folder = folder(ctx.settings)
        self._stop = threading.Event()
        self._registered: set[str] = set()
        self._parts: set[Part] = set()  # the parts among `_registered` (held parts wait for their predecessor)
        self._quiet = Listing()  # the landing directories a look found nothing waiting in (`waiting_files`)
        self._first_seen: dict[str, float] = {}  # waiting file -> monotonic time it was first listed
        self._recent: deque[dict] = deque(maxlen=RECENT)
        self._held: set[str] = set()  # waiting parts held back for their predecessor
        self.grace = ctx.settings.missing_part_grace
        self._seconds: dict[int, dict[str, float]] = {}  # micro-batch -> stage -> run time, until it is visible
        self._round: Round | None = None  # with a round cut: the round to cut next
        self._cutting = False  # whether the run in flight was started by the trigger (else: to finish pending work)
        self._manifests = Manifests(ctx.settings.landing_dir)  # the drip's, for round cuts
        self.status = Status(
            pid=os.getpid(),
            started_at=_iso(_utcnow()),
            trigger=asdict(trigger),
            landing=str(ctx.settings.landing_dir),
        )

    # -- control ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the micro-batch in flight (all of its stages), then leave `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- status ----------------------------------------------------------------------------------------

    def _set(self, **changes) -> None:
        for name, value in changes.items():
            setattr(self.status, name, value)
        self._write_status()
        if self.on_state:
            self.on_state(self.status)

    def _write_status(self) -> None:
        self.status.updated_at = _iso(_utcnow())
        self.status.recent = list(self._recent)
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{STATUS_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(self.status), indent=1, default=str))
        os.replace(tmp, self.folder / STATUS_FILE)

    # -- the loop --------------------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until `stop()` (or `idle_exit`); returns the process exit code (0)."""
        from streamdi.quality import RemoteValidator, validator, warm_up
        from streamdi.run.pipeline import run_pending

        self.folder.mkdir(parents=True, exist_ok=True)
        with (
            _one_service(self.folder / LOCK_FILE),
            lake_lease(self.ctx.lake.root, f"streamdi stream (pid {os.getpid()})"),
        ):
            self._set(state="starting")
            warm_up()  # Great Expectations imports while Spark and PostgreSQL start
            self.ctx.start_spark()
            self.ctx.start_warehouse()
            ready = validator()  # ready before `idle`: a first micro-batch must not wait for Great Expectations
            if isinstance(ready, RemoteValidator):
                ready.wait_ready()
            batch_log = BatchLog(self.ctx.lake)
            self._reload(batch_log)
            idle_since = time.monotonic()
            pending = True  # a (re)start first finishes whatever the batch log has pending
            last_write = 0.0
            halted_at = None
            failures = 0  # consecutive failed attempts (infrastructure faults)
            while not self.stopping:
                waiting = self._look()
                now = time.monotonic()
                if halted_at is not None:
                    if now - halted_at < HALT_RECHECK:
                        self._stop.wait(self.trigger.poll)
                        continue
                    halts = batch_log.halted()
                    if halts:
                        halted_at = now
                        continue
                    halted_at, pending = None, True  # an operator resumed or skipped it
                    self._set(halt=None)
                fire = self._fires(waiting, now)
                if pending or fire:
                    self._cutting = fire
                    try:
                        report = run_pending(
                            self.ctx,
                            on_plan=lambda plan: plan and self._set(state="processing", processing=plan[0][0]),
                            on_step=self._step_done,
                            stop_before_batch=lambda: self.stopping,
                            hold=self._hold,
                        )
                    except Exception as exc:  # noqa: BLE001 - an infrastructure fault: reported, then retried
                        failures += 1
                        self._failed(exc, failures)
                        pending = True  # the batch log has the work that is left
                        # and the files that run registered before it failed
                        self._reload(batch_log)
                        continue
                    if failures:
                        log.warning("the stream goes on after %s failed attempt(s)", failures)
                        failures = 0
                        self._set(error=None)
                    self.status.landing_deleted += report.maintained.get("landing", 0)
                    self._registered.update(f.file for f in report.collected.files)
                    self._registered.update(report.collected.changed)
                    self._parts |= parts_of(f.file for f in report.collected.files)
                    if fire and not report.collected.files and not report.steps:
                        # what seemed to wait was registered by another collector (a CLI run beside the service)
                        self._reload(batch_log)
                    for name in report.collected.changed:
                        log.warning("%s changed after it was collected; ignored", name)
                    pending = False
                    idle_since = time.monotonic()
                    if report.halted:
                        halt = report.halted[0]
                        halted_at = time.monotonic()
                        self._set(
                            state="halted",
                            processing=None,
                            halt=f"micro-batch {halt.batch_id} ({halt.stage}): {halt.reason}",
                        )
                        log.warning("stream halted: %s; waiting for `streamdi batch resume|skip`", self.status.halt)
                        continue
                    self._set(state="idle", processing=None)
                    continue
                if waiting:
                    idle_since = now
                if self.idle_exit is not None and not waiting and now - idle_since >= self.idle_exit:
                    log.info("nothing arrived for %.1fs: the stream stops", self.idle_exit)
                    break
                if now - last_write >= HEARTBEAT:
                    self._set(state="waiting" if waiting else "idle")
                    last_write = now
                self._stop.wait(self.trigger.poll)
            self._set(state="stopped", processing=None, waiting_files=len(self._first_seen))
        return 0

    def _failed(self, exc: Exception, failures: int) -> None:
        """A run failed on something other than data (a halt is not an exception): PostgreSQL stopped, a disk full,
        a lock, the driver JVM killed. Its finished stages are in the batch log; the run is tried again after a pause
        that doubles up to `RETRY_MAX` seconds, with the warehouse connection opened afresh (an embedded server that
        was stopped is started again) and, if the driver JVM has exited, a new one (the failure's message says how it
        ended). After `GIVE_UP` failures in a row the service stops with the error (exit 1), for its
        supervisor (`streamdi_stream`, systemd, ...) to restart."""
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** (failures - 1))
        message = f"{type(exc).__name__}: {exc}".strip()[:2000]
        from streamdi.spark import driver_jvm_exit, jvm_exit_text

        jvm = driver_jvm_exit(wait=JVM_EXIT_WAIT if _connection_lost(exc) else 0.0)
        if jvm is not None:
            message = f"the Spark driver JVM exited ({jvm_exit_text(jvm)}); {message}"
        log.error("micro-batch run failed (attempt %s): %s; retrying in %gs", failures, message, delay, exc_info=exc)
        self._set(state="error", processing=None, error=message)
        if failures >= GIVE_UP:
            raise exc
        self.ctx.reset_warehouse()
        self.ctx.forget_exited_spark()  # a driver JVM that died (out of memory, killed) starts again when next used
        self._stop.wait(delay)

    def _reload(self, batch_log: BatchLog) -> None:
        """The registered files and parts, from the batch log (at a start, and after another collector's work)."""
        self._registered = set(batch_log.registered_files())
        self._parts = set(batch_log.registered_parts())

    def _look(self) -> list[tuple[str, int, float]]:
        """The waiting files, and the status fields that describe them."""
        waiting = list(waiting_files(self.ctx.settings.landing_dir, self._registered, self._quiet))
        now = time.monotonic()
        names = {name for name, _, _ in waiting}
        self._first_seen = {name: self._first_seen.get(name, now) for name in names}
        oldest = min((mtime for _, _, mtime in waiting), default=None)
        self.status.waiting_files = len(waiting)
        self.status.waiting_bytes = sum(size for _, size, _ in waiting)
        self.status.lag_seconds = round(max(0.0, time.time() - oldest), 3) if oldest is not None else 0.0
        self._held = held_parts(sorted(names), self._parts, self._first_seen, now, self.grace)
        self.status.held_files = sorted(self._held)
        if self.trigger.cut == "round":
            declared, retired = self._manifests.declared(self._registered) if names else ({}, frozenset())
            self._round = next_round(sorted(names), self._registered, self._held, declared, retired)
        return waiting

    def _fires(self, waiting: list[tuple[str, int, float]], now: float) -> bool:
        """Whether the trigger cuts a micro-batch now."""
        ready = [w for w in waiting if w[0] not in self._held]
        if self.trigger.cut == "round" and self._round is not None:
            ready = [w for w in ready if w[0] in self._round.files]
            if self._round.complete is not None:  # declared: cut once complete, or when its grace is over
                waited = now - min(self._first_seen[f] for f, _, _ in ready)
                return self._round.complete or waited >= self.grace
        return bool(ready) and self.trigger.fires(
            now - min(self._first_seen[f] for f, _, _ in ready), sum(size for _, size, _ in ready)
        )

    def _hold(self, new: list[str], registered: set[str]) -> set[str]:
        """The collector's `hold`: parts still waiting for their predecessor (see `held_parts`); a part released
        because its grace is over is logged (its stage then records the `predecessor_present` check). With a round
        cut, also every file outside the round the trigger fired for (every file in a run the trigger did not start:
        a (re)start first finishes the batch log's pending work, and cuts nothing)."""
        present = BatchLog(self.ctx.lake).registered_parts()  # `registered` as parts, from the log's index
        held = held_parts(new, present, self._first_seen, time.monotonic(), self.grace)
        if self.trigger.cut == "round":
            chosen = self._round
            if not self._cutting or chosen is None:
                return set(new)  # a run that finishes pending work cuts nothing: rounds are cut only when they fire
            if chosen.key is None:
                held |= {f for f in new if f not in chosen.files}
            else:
                held |= {f for f in new if (p := part_of(f)) is None or (p.source_batch, p.number) != chosen.key}
            if chosen.complete is False:
                log.warning("round %s cut without all of its declared files after %gs", chosen.key, self.grace)
        for name, before in sorted(missing_predecessors(new, present | parts_of(new)).items()):
            if name not in held:
                log.warning("%s: its predecessor %s has not arrived in %gs; cut without it", name, before, self.grace)
        return held

    def _step_done(self, step) -> None:
        self._seconds.setdefault(step.batch_id, {})[step.stage] = round(step.seconds, 3)
        if step.stage != "migrate" or step.detail.get("halted"):
            return
        for batch_id in step.detail.get("batches") or [step.batch_id]:
            latency = self._latency(batch_id)
            latency.seconds = self._seconds.pop(batch_id, {})
            latency.cold = self.status.batches_done == 0
            self._recent.append(asdict(latency))
            self.status.batches_done += 1
            self.status.rows_done += latency.rows
            self.status.last_batch = batch_id
            if self.on_batch:
                self.on_batch(latency)
        self._set(processing=None, memory=footprint(self.ctx.lake.held_bytes))

    def _latency(self, batch_id: int) -> BatchLatency:
        """The batch's `streamdi.batch_metrics` row as seconds after its arrival."""
        rows, *seconds = self.ctx.warehouse.batch_latency(batch_id) or (0, None, None, None)
        staged, committed, visible = (None if v is None else round(v, 3) for v in seconds)
        return BatchLatency(batch_id, rows, {}, staged, committed, visible)


class ServiceRunning(RuntimeError):
    """Another stream service holds this home."""


@contextlib.contextmanager
def _one_service(path):
    """Hold the home's service lock (`streamdi.locks.flocked_nowait`) for the service's life; a second service of
    the same home fails clearly."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(flocked_nowait(path, f"pid {os.getpid()}"))
        except HeldElsewhere as exc:
            raise ServiceRunning(f"a stream service already runs for this home ({exc.holder or path})") from None
        yield


def install_signals(service: StreamService) -> None:
    """SIGTERM / SIGINT: the first finishes the micro-batch in flight, then stops; the second abandons it at once
    (its finished stages are in the batch log; a restart does the rest)."""

    def handler(signum, _frame) -> None:
        if service.stopping:
            log.warning("second %s: abandoning the micro-batch in flight", signal.Signals(signum).name)
            raise KeyboardInterrupt
        log.warning(
            "%s: finishing the micro-batch in flight, then stopping (again to abandon it)", signal.Signals(signum).name
        )
        service.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _connection_lost(exc: BaseException) -> bool:
    """Whether a failed run lost a connection (to the driver JVM, say: Py4J reports a closed socket as a network
    error, or the refused connection or end of stream under it), anywhere in its chain of causes."""
    return any(isinstance(e, ConnectionError | EOFError) or type(e).__name__ == "Py4JNetworkError" for e in causes(exc))
