"""Chaos: `kill -9` at random moments across collect, stage, transform, migrate and the stream service, each followed
by a restart; the warehouse must end identical to a clean run.

Long because it is one experiment whose parts share one run's state: the kill schedule, where each kill landed
(read from the process's stack), the restarts, the stream feeder and the final comparison.

Usage: .venv/bin/python bench/chaos.py [--data DIR] [--sf 0.1] [--batches 20] [--stream-batches 3] [--work DIR]
                                       [--kills 100] [--stream-kills 25] [--seed 1] [--compact 4] [--parts 4]
                                       [--rate 0.15] [--stream-max-delay 25] [--keep] [--out FILE]

1. Data: `--data DIR` (generated there at `--sf` with `--batches` TPC-DI batches when DIR has none).
2. The clean reference: a fresh home loads every batch with `streamdi -v load --data DIR --batch K`, one process per
   batch, nothing killed; its `snapshot` (tests/cli_runs.py: every Delta warehouse table row for row, every PostgreSQL
   `dw.*` table's count and md5) is what the chaos run must end with. The output of each process is watched as in the
   chaos run, which gives each batch's wall time and its phases' times (the kill delays below are drawn from them).
3. The chaos run, in a second fresh home (`STREAMDI_COMPACT_SMALL_FILES=--compact`, so compactions happen, and get
   killed, where the reference never compacts):
   - the first `--batches - --stream-batches` TPC-DI batches: `streamdi -v load --data DIR --batch K` started again
     and again, each process killed with SIGKILL after a random delay (seeded RNG), until the batch has had its share
     of the kills (`--kills - --stream-kills`, spread over the batches); then one more process runs to its end. Each
     attempt draws a target: `any` (35%: a delay uniform over what the process has left to do, from the reference
     process's phases: its start and end, collect, and the stages the batch log has pending), else, of `collect`
     (while the batch is not registered) and the batch's pending stages, the phase where the fewest kills have landed
     so far. For a phase it waits until the process starts it (collect: the process holds the lake's runner lease, up
     to its batch-log commit; a stage: its plan line, or the `done` line of the stage before) and kills it after a
     delay uniform over that phase's reference duration. An attempt that ends before its kill completes the batch
     (its unused share goes to the batches after it).
   - the last `--stream-batches` batches: `streamdi -v stream --interval 0.2` runs while a feeder thread drips those
     batches into the landing zone (`--parts` pieces per data file, `--rate` files/s, then each batch's audit files,
     as `streamdi load --drip` delivers them); the service is killed after a random delay (`any`: uniform over
     `--stream-max-delay` seconds; else the least-hit of `stage`, `transform`, `migrate`: once the service is in that
     phase of a micro-batch, by its status and the batch-log commits in its log, uniform over that phase's durations
     seen so far) and restarted, `--stream-kills` times (plus what the loads fell short of, while there is work),
     then a last service with `--idle-exit` finishes what landed.
   Where each kill landed is read from the process itself right before the kill: `py-spy dump --locals` (when py-spy
   is installed; the process is stopped while it is read, so the kill lands where the stack was) gives the job in
   flight on the main thread (`collect_job`, `stage_job`, `transform_job` / `compact_job`, `migrate_job`; the stream
   service's loop: `idle`; imports, delivery, Spark / PostgreSQL / Great Expectations start: `startup`; in the
   loop (`pipeline.drive`) between two jobs (the pending list read after collect, Spark and PostgreSQL starting, the
   end of the run): `plan`; after the run: `exit`), the micro-batch (its locals) and the transform steps in flight
   (the jobs modules on any thread). Its output markers give the phase without py-spy (recorded as well; the report
   says how often the two agree), and the last Delta commit the process logged. After each kill: the batch log's
   pending work, and the Spark JVM the process started must exit by itself (an orphan is reported, then killed).
   An attempt that exits non-zero without being killed is a failure: three in a row stop the run (crash loop); one
   that does not end within its timeout stops it too (stuck).
4. Checks: the chaos home's snapshot equals the reference's (else the first difference: table, rows missing and extra);
   no duplicate row in any Delta or PostgreSQL warehouse table; the batch log has nothing pending and nothing halted,
   and every file that landed is registered; no Delta commit was made twice (the same app transaction and version in
   two commits of one table); the migration ledger has no duplicate (table, version) and no warehouse commit above its
   last migrated version.

Prints the kills per phase, per target and per part, restarts, wall time and the result; writes everything (each
kill: batch, delay, target, where it landed, the pending state after it) to bench/out/chaos.json. On a difference, a
stuck batch or a crash loop the homes are kept and their paths printed; otherwise they are removed unless `--keep`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import psutil
import typer

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from cli_runs import STREAMDI, env_for, snapshot  # noqa: E402

from schemas.warehouse import WAREHOUSE_TABLES  # noqa: E402
from streamdi import embedded_pg  # noqa: E402
from streamdi.batchlog import STAGES, BatchLog  # noqa: E402
from streamdi.delivery import root_audits  # noqa: E402
from streamdi.generator import Params, generate  # noqa: E402
from streamdi.generator.drip import DripOptions, drip  # noqa: E402
from streamdi.lake import Lake  # noqa: E402
from streamdi.run.stream_cuts import waiting_files  # noqa: E402
from streamdi.scripts import script_app  # noqa: E402
from streamdi.settings import Settings  # noqa: E402
from streamdi.warehouse import open_warehouse, sql  # noqa: E402  (sql: psycopg's, as streamdi.warehouse has it)

OUT = REPO / "bench" / "out"
POLL = 0.02  # seconds between two looks at a watched process
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
STEP_OF_MODULE = {
    "reference": "T0",
    "securities": "T1",
    "accounts": "T2",
    "prospect": "T2",
    "trades": "T3",
    "holdings": "T3",
    "cash_balances": "T3",
    "market_history": "T4",
    "watches": "T4",
    "windows": "AG",
    "messages": "DM",
}
PHASES = ("startup", "collect", "plan", "stage", "transform", "migrate", "idle", "exit")


# -- watching a process ----------------------------------------------------------------------------------------------


class Watched:
    """A streamdi process whose stdout and stderr go to files, read as they grow: every line with the time (seconds
    since the start) it was first seen, and the markers found in it."""

    MARKERS = {
        "plan": re.compile(r"^\d+ step\(s\) to run: (.*)$"),
        "done": re.compile(r"^\s*batch (\d+) (stage|transform|migrate)\s+(?:done in|HALTED after)"),
        "nothing": re.compile(r"^nothing new arrived"),
        "finished": re.compile(r"^finished in"),
        "commit": re.compile(r"streamdi\.lake: \w+ \d+ rows into \S+ as (\S+)@(\d+) -> v\d+"),
        "event": re.compile(r"as event/(\d+)/(stage|transform|migrate)/done@"),
        "collected": re.compile(r"as collect@(\d+) -> v"),
    }

    def __init__(self, cmd: list[str], env: dict[str, str], logs: Path, name: str) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.paths = (logs / f"{name}.out", logs / f"{name}.err")
        with open(self.paths[0], "w") as out, open(self.paths[1], "w") as err:
            self.proc = subprocess.Popen(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=err, cwd=REPO)
        self.started = time.monotonic()
        self._pos = [0, 0]
        self._partial = ["", ""]
        self.events: list[tuple[float, str, tuple]] = []  # (seconds since start, marker, groups)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def read(self) -> None:
        now = self.elapsed()
        for i, path in enumerate(self.paths):
            with open(path, errors="replace") as f:
                f.seek(self._pos[i])
                chunk = f.read()
                self._pos[i] = f.tell()
            if not chunk:
                continue
            *lines, self._partial[i] = (self._partial[i] + chunk).split("\n")
            for line in lines:
                for marker, pattern in self.MARKERS.items():
                    m = pattern.search(line)
                    if m:
                        self.events.append((now, marker, m.groups()))

    def seen(self, marker: str) -> list[tuple[float, tuple]]:
        return [(t, g) for t, k, g in self.events if k == marker]

    def last_commit(self) -> str | None:
        commits = self.seen("commit")
        return f"{commits[-1][1][0]}@{commits[-1][1][1]}" if commits else None

    def tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.paths).strip()

    def children(self) -> list[psutil.Process]:
        """Its process tree (the Spark JVM), the embedded PostgreSQL server left out (it outlives its clients)."""
        with contextlib.suppress(psutil.Error):
            return [
                c
                for c in psutil.Process(self.pid).children(recursive=True)
                if not _name(c).lower().startswith(("postgres", "pg_", "initdb"))
            ]
        return []


def _name(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return process.name()
    return "?"


def parse_plan(text: str) -> list[tuple[int, str]]:
    """`batch 4 stage+transform+migrate, batch 5 stage` -> [(4, 'stage'), (4, 'transform'), ...]."""
    plan = []
    for part in text.split(", "):
        m = re.match(r"batch (\d+) ([\w+]+)", part.strip())
        if m:
            plan.extend((int(m.group(1)), s) for s in m.group(2).split("+"))
    return plan


def lease_held(home: Path, pid: int) -> bool:
    with contextlib.suppress(OSError, json.JSONDecodeError):
        return any(h.get("pid") == pid for h in json.loads((home / "lake" / "_locks" / "lease.json").read_text()))
    return False


def load_phase_starts(w: Watched, home: Path, lease_at: dict) -> dict[str, float]:
    """When the load process began each phase (seconds since its start), from its output and the lake's lease."""
    starts: dict[str, float] = {}
    if "collect" in lease_at:
        starts["collect"] = lease_at["collect"]
    plans = w.seen("plan")
    if plans:
        t_plan, groups = plans[0]
        plan = parse_plan(groups[0])
        done = {(int(b), s): t for t, (b, s) in w.seen("done")}
        before = t_plan
        for item in plan:
            starts.setdefault(item[1], before)
            if item not in done:
                break
            before = done[item]
    return starts


def load_phase_now(w: Watched, home: Path) -> tuple[str, int | None]:
    """The phase a `streamdi load` process is in, from its output markers (and the lease): what is known without
    looking into the process."""
    if w.seen("finished") or w.seen("nothing"):
        return "exit", None
    plans = w.seen("plan")
    if plans:
        done = {(int(b), s) for _, (b, s) in w.seen("done")}
        for item in parse_plan(plans[0][1][0]):
            if item not in done:
                return item[1], item[0]
        return "exit", None
    if w.seen("collected"):
        return "plan", int(w.seen("collected")[-1][1][0])
    if lease_held(home, w.pid):
        return "collect", None
    return "startup", None


def stream_phase_now(w: Watched, home: Path, pending_before: list) -> tuple[str, int | None]:
    """The same for the stream service: its status file, and what is left of the work pending when it started and of
    the micro-batches it collected since, by the batch-log commits in its log."""
    status = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        status = json.loads((home / "stream" / "status.json").read_text())
    if status.get("pid") != w.pid:
        return "startup", None
    work = [tuple(p) for p in pending_before]
    work += [(int(b), s) for _, (b,) in w.seen("collected") for s in STAGES]
    done = {(int(b), s) for _, (b, s) in w.seen("event")}
    left = [p for p in work if p not in done]
    state = status.get("state")
    if state == "processing" or (state == "starting" and w.seen("event")):
        return (left[0][1], left[0][0]) if left else ("plan", None)
    if state == "starting":
        return "startup", None
    if state == "waiting":
        return "collect", None
    return "idle", None


# -- where a kill landed: the process's own stack ---------------------------------------------------------------------


@dataclass
class Frame:
    func: str
    file: str
    values: dict[str, str] = field(default_factory=dict)


def parse_dump(text: str) -> dict[str, list[Frame]]:
    """`py-spy dump --locals` -> thread name -> frames, innermost first (with their arguments and locals)."""
    threads: dict[str, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in text.splitlines():
        m = re.match(r'^Thread \S+ \([^)]*\): "(.*)"', line)
        if m:
            current = threads.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        m = re.match(r"^    (\S.*) \((.+?)(?::\d+)?\)$", line)
        if m:
            current.append(Frame(m.group(1), m.group(2)))
            continue
        m = re.match(r"^\s{12}(\w+): (.*)$", line)
        if m and current:
            current[-1].values[m.group(1)] = m.group(2)
    return threads


def classify_stack(threads: dict[str, list[Frame]]) -> dict | None:
    """The phase, micro-batch and detail of a process from its threads' stacks (None: nothing to go by)."""
    main = threads.get("MainThread")
    if not main:
        return None
    funcs = [f.func for f in main]
    batch = None
    for f in main:
        if f.func == "drive" and "stage_name" in f.values:
            with contextlib.suppress(ValueError):
                batch = int(f.values.get("batch_id", ""))
    steps = sorted(
        {
            STEP_OF_MODULE[Path(f.file).stem]
            for frames in threads.values()
            for f in frames
            if f.file.startswith("jobs/") and Path(f.file).stem in STEP_OF_MODULE
        }
    )
    ours = [f for f in main if f.file.startswith(("streamdi/", "jobs/", "schemas/"))]
    detail = f"{ours[0].func} ({ours[0].file})" if ours else (f"{main[0].func} ({main[0].file})" if main else "")
    frames = [f"{f.func} ({f.file})" for f in ours[:12]]
    if "collect_job" in funcs:
        phase = "collect"
    elif "stage_job" in funcs:
        phase = "stage"
    elif "compact_job" in funcs:
        phase, detail = "transform", f"compaction: {detail}"
    elif "transform_job" in funcs or "transform_step_job" in funcs:
        phase = "transform"
        if steps:
            detail = f"{'+'.join(steps)}: {detail}"
    elif "migrate_job" in funcs:
        phase = "migrate"
    elif "drive" in funcs:
        phase = "plan"
    elif "StreamService.run" in funcs:
        starting = {"warm_up", "start_spark", "start_warehouse", "_one_service", "lake_lease", "_find_and_load"}
        phase = "startup" if starting & set(funcs) else "idle"
    elif "deliver_batch" in funcs:
        phase, detail = "startup", f"delivering the batch: {detail}"
    elif any(f in funcs for f in ("_find_and_load", "open_context", "_process")) or "stream" in funcs:
        phase = "startup"
    else:
        return {"phase": None, "batch": batch, "detail": detail, "frames": frames}
    return {"phase": phase, "batch": batch, "detail": detail, "frames": frames}


def dump_stack(pid: int) -> str | None:
    if not Path(PY_SPY).exists():
        return None
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        cmd = [PY_SPY, "dump", "--locals", "--pid", str(pid)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout
    return None


# -- one attempt -------------------------------------------------------------------------------------------------------


@dataclass
class Kill:
    n: int
    part: str  # load | stream
    tpcdi_batch: int | None  # the batch a load process loads (None: the stream service)
    attempt: int
    target: str
    at: float  # seconds after the process started
    phase: str  # where it landed (the stack's phase when py-spy read one, else the markers')
    micro_batch: int | None
    detail: str
    marker_phase: str
    by: str  # stack | markers
    last_commit: str | None
    pending_after: list | None = None
    orphans: list = field(default_factory=list)
    stack: list = field(default_factory=list)  # the main thread's frames in streamdi's code, innermost first


class Stop(Exception):
    """The chaos run found something: a crash loop, a stuck process."""


def kill_now(
    w: Watched, home: Path, kind: str, target: str, n: int, attempt: int, batch: int | None, before: list
) -> Kill:
    """Read where the process is, kill it (SIGKILL) and wait for it; its JVM must go with it. `before`: the batch
    log's pending work when the process started."""
    w.read()
    marker_phase, marker_batch = load_phase_now(w, home) if kind == "load" else stream_phase_now(w, home, before)
    children = w.children()
    text = dump_stack(w.pid)  # the process is stopped while py-spy reads it: the kill lands right after
    at = w.elapsed()
    with contextlib.suppress(ProcessLookupError):
        os.kill(w.pid, signal.SIGKILL)
    w.proc.wait(timeout=60)
    w.read()
    stack = classify_stack(parse_dump(text)) if text else None
    if stack and stack["phase"] is None:  # a stack that tells nothing (interpreter start or exit)
        stack["phase"] = "exit" if marker_phase == "exit" else "startup"
    orphans = []
    deadline = time.monotonic() + 20
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(psutil.Error):
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                orphans.append(f"{_name(child)} {child.pid}")
                child.kill()  # ours: started by the killed process
    return Kill(
        n=n,
        part=kind,
        tpcdi_batch=batch,
        attempt=attempt,
        target=target,
        at=round(at, 3),
        phase=stack["phase"] if stack else marker_phase,
        micro_batch=(stack["batch"] if stack and stack["batch"] is not None else marker_batch),
        detail=stack["detail"] if stack else "",
        marker_phase=marker_phase,
        by="stack" if stack else "markers",
        last_commit=w.last_commit(),
        orphans=orphans,
        stack=stack["frames"] if stack else [],
    )


def pending(home: Path) -> list[list]:
    return [[b, s] for b, s in BatchLog(Lake(home / "lake")).pending()]


# -- the clean reference -----------------------------------------------------------------------------------------------


def load_cmd(data: Path, batch: int) -> list[str]:
    return [STREAMDI, "-v", "load", "--data", str(data), "--batch", str(batch)]


def run_reference(data: Path, batches: int, home: Path, logs: Path) -> dict[int, dict]:
    """Every batch loaded once, nothing killed: each process's wall time and its phases' durations."""
    timings: dict[int, dict] = {}
    for batch in range(1, batches + 1):
        w = Watched(load_cmd(data, batch), env_for(home), logs, f"reference-b{batch}")
        lease_at: dict[str, float] = {}
        while w.proc.poll() is None:
            w.read()
            if "collect" not in lease_at and lease_held(home, w.pid):
                lease_at["collect"] = w.elapsed()
            time.sleep(POLL)
        w.read()
        wall = w.elapsed()
        if w.proc.returncode != 0:
            raise SystemExit(f"the reference load of Batch{batch} failed ({w.proc.returncode}):\n{w.tail()}")
        starts = load_phase_starts(w, home, lease_at)
        ends = {"collect": (w.seen("collected") or w.seen("plan") or w.seen("nothing") or [(wall, ())])[0][0]}
        ends.update({s: t for t, (_, s) in w.seen("done")})
        durations = {p: round(max(0.05, ends[p] - starts[p]), 3) for p in starts if p in ends}
        timings[batch] = {"wall": round(wall, 2), "phases": durations}
        print(f"  reference Batch{batch}: {wall:.1f} s ({', '.join(f'{p} {d:.2f}' for p, d in durations.items())})")
    return timings


# -- the chaos run: loads -------------------------------------------------------------------------------------------


@dataclass
class Tally:
    kills: list[Kill] = field(default_factory=list)
    started: int = 0  # processes started
    failures: list[dict] = field(default_factory=list)  # attempts that exited non-zero without a kill


def load_with_kills(
    data: Path, batch: int, home: Path, env: dict, logs: Path, ref: dict, quota: int, rng: random.Random, t: Tally
) -> int:
    """Load `batch`, killing the process `quota` times at random moments; returns the kills made."""
    kills = 0
    attempt = 0
    failures_in_row = 0
    timeout = max(300.0, 10 * ref["wall"])
    while True:
        attempt += 1
        left = {stage for _, stage in pending(home)}
        todo = [stage for stage in STAGES if stage in left] or list(STAGES)
        if kills < quota:
            landed = collections.Counter(k.phase for k in t.kills if k.part == "load")
            # collect is a target while the batch's files are not registered yet (later, it finds nothing new)
            target = choose(rng, [*(["collect"] if not left else []), *todo], landed)
            phases = ref["phases"]
            if target == "any":  # the process's start and end, its collect and the stages it has left
                overhead = max(0.5, ref["wall"] - sum(phases.values()))
                span = overhead + phases.get("collect", 0.1) + sum(phases.get(s, 0.0) for s in todo)
            else:
                span = phases.get(target, 1.0)
            delay = rng.uniform(0, span)
        else:
            target, delay = "none", None
        w = Watched(load_cmd(data, batch), env, logs, f"load-b{batch}-a{attempt}")
        t.started += 1
        lease_at: dict[str, float] = {}
        kill_at = delay if target == "any" else None
        killed = None
        while w.proc.poll() is None:
            w.read()
            if "collect" not in lease_at and lease_held(home, w.pid):
                lease_at["collect"] = w.elapsed()
            if kill_at is None and delay is not None:
                start = load_phase_starts(w, home, lease_at).get(target)
                if start is not None:
                    kill_at = start + delay
            if kill_at is not None and w.elapsed() >= kill_at:
                killed = kill_now(w, home, "load", target, len(t.kills) + 1, attempt, batch, [])
                break
            if w.elapsed() > timeout:
                w.proc.kill()
                raise Stop(f"Batch{batch} attempt {attempt}: still running after {timeout:.0f} s (stuck)\n{w.tail()}")
            time.sleep(POLL)
        if killed is not None:
            killed.pending_after = pending(home)
            t.kills.append(killed)
            kills += 1
            failures_in_row = 0
            print(describe(killed))
            continue
        code = w.proc.returncode
        if code == 0:
            print(f"  [load Batch{batch}] attempt {attempt} ran to its end ({w.elapsed():.1f} s, target {target})")
            return kills
        t.failures.append({"batch": batch, "attempt": attempt, "code": code, "log": str(w.paths[1]), "tail": w.tail()})
        failures_in_row += 1
        print(f"  [load Batch{batch}] attempt {attempt} FAILED with exit code {code}; see {w.paths[1]}")
        if failures_in_row >= 3:
            raise Stop(f"Batch{batch}: {failures_in_row} failed attempts in a row (crash loop):\n{w.tail()}")


ANY_SHARE = 0.35  # attempts whose delay is drawn over the whole process; the others target a phase


def choose(rng: random.Random, feasible: list[str], landed: collections.Counter) -> str:
    """`any`, or the feasible phase where the fewest kills have landed so far (so the kills spread over the phases)."""
    if rng.random() < ANY_SHARE:
        return "any"
    fewest = min(landed[p] for p in feasible)
    return rng.choice([p for p in feasible if landed[p] == fewest])


def describe(k: Kill) -> str:
    where = f"{k.phase}" + (f" of micro-batch {k.micro_batch}" if k.micro_batch is not None else "")
    detail = f" [{k.detail}]" if k.detail else ""
    what = f"load Batch{k.tpcdi_batch}" if k.part == "load" else "stream"
    orphans = f"; ORPHANS {k.orphans}" if k.orphans else ""
    return (
        f"  kill {k.n:3d} [{what} #{k.attempt}] target {k.target:<9} at {k.at:6.2f} s: {where}{detail}; "
        f"last commit {k.last_commit}; pending after {k.pending_after}{orphans}"
    )


# -- the chaos run: the stream service ------------------------------------------------------------------------------


def feed(data: Path, batches: list[int], landing: Path, parts: int, rate: float, seed: int, done: threading.Event):
    """Drip each batch into the landing zone, then its audit files (as `streamdi load --drip` delivers them)."""
    try:
        for batch in batches:
            drip(data / f"Batch{batch}", landing, DripOptions(parts=parts, seed=seed), rate=rate)
            for audit in [*sorted((data / f"Batch{batch}").glob("*_audit.csv")), *root_audits(data, batch)]:
                target = landing / f"Batch{batch}" / audit.name
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_bytes(audit.read_bytes())
                os.replace(tmp, target)
    finally:
        done.set()


def unregistered(home: Path) -> list[str]:
    """Files in the landing zone that the batch log has not registered."""
    registered = set(BatchLog(Lake(home / "lake")).registered_files())
    return [name for name, _, _ in waiting_files(home / "landing", registered)]


def stream_with_kills(
    data: Path, batches: list[int], home: Path, env: dict, logs: Path, args, quota: int, rng: random.Random, t: Tally
) -> tuple[int, float]:
    """Run the stream service while the batches drip in, killing it `quota` times; returns (kills, feed seconds)."""
    fed = threading.Event()
    started = time.monotonic()
    feeder = threading.Thread(
        target=feed, args=(data, batches, home / "landing", args.parts, args.rate, args.seed, fed), daemon=True
    )
    feeder.start()
    cmd = [STREAMDI, "-v", "stream", "--interval", "0.2"]
    seen: dict[str, list[float]] = {"stage": [], "transform": [], "migrate": []}
    kills = 0
    attempt = 0
    failures_in_row = 0
    while kills < quota:
        if fed.is_set() and not pending(home) and not unregistered(home):
            print(f"  [stream] the feed ended and everything is processed after {kills} kill(s): no more to kill")
            break
        attempt += 1
        landed = collections.Counter(k.phase for k in t.kills if k.part == "stream")
        target = choose(rng, ["stage", "transform", "migrate"], landed)
        if target == "any":
            delay = rng.uniform(0, args.stream_max_delay)
        else:
            durations = seen[target] or [{"stage": 0.3, "transform": 5.0, "migrate": 0.3}[target]]
            delay = rng.uniform(0, statistics.median(durations))
        before = pending(home)
        w = Watched(cmd, env, logs, f"stream-a{attempt}")
        t.started += 1
        kill_at = delay if target == "any" else None
        killed = None
        while w.proc.poll() is None:
            w.read()
            if kill_at is None:
                if stream_phase_now(w, home, before)[0] == target:
                    kill_at = w.elapsed() + delay
                elif w.elapsed() > 3 * args.stream_max_delay:
                    kill_at = w.elapsed()  # the phase did not come (nothing to process): kill where it is
            if kill_at is not None and w.elapsed() >= kill_at:
                killed = kill_now(w, home, "stream", target, len(t.kills) + 1, attempt, None, before)
                break
            time.sleep(POLL)
        learn_stream_durations(w, seen)
        if killed is None:
            t.failures.append({"stream": True, "attempt": attempt, "code": w.proc.returncode, "tail": w.tail()})
            failures_in_row += 1
            print(f"  [stream] attempt {attempt} exited by itself with {w.proc.returncode}; see {w.paths[1]}")
            if failures_in_row >= 3:
                raise Stop(f"the stream service: {failures_in_row} failed starts in a row (crash loop):\n{w.tail()}")
            continue
        failures_in_row = 0
        killed.pending_after = pending(home)
        t.kills.append(killed)
        kills += 1
        print(describe(killed))
    # the last service: it runs until the feed has ended and nothing waits (its idle exit outlasts the feed's gaps)
    idle_exit = max(5.0, 2.0 / args.rate + 2.0)
    while True:
        attempt += 1
        w = Watched([*cmd, "--idle-exit", f"{idle_exit:g}"], env, logs, f"stream-a{attempt}-final")
        t.started += 1
        try:
            code = w.proc.wait(timeout=max(900.0, 4 * len(batches) * 60))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            raise Stop(f"the last stream service did not finish (stuck)\n{w.tail()}") from None
        if code != 0:
            t.failures.append({"stream": True, "attempt": attempt, "code": code, "tail": w.tail()})
            failures_in_row += 1
            print(f"  [stream] the last service exited with {code}; see {w.paths[1]}")
            if failures_in_row >= 3:
                raise Stop(f"the stream service: {failures_in_row} failed runs in a row (crash loop):\n{w.tail()}")
            continue
        print(f"  [stream] the last service ended (idle exit {idle_exit:g} s) after {w.elapsed():.1f} s")
        if fed.is_set() and not pending(home) and not unregistered(home):
            break
    feeder.join()
    return kills, time.monotonic() - started


def learn_stream_durations(w: Watched, seen: dict[str, list[float]]) -> None:
    """Each stage's duration per micro-batch in the service's log: from the batch-log commit before its `done` (the
    micro-batch's collect, the stage before it, or the micro-batch before it), for the next targeted delays."""
    marks = sorted(
        [(tm, "collect") for tm, _ in w.seen("collected")] + [(tm, stage) for tm, (_, stage) in w.seen("event")]
    )
    for (before, _), (tm, stage) in zip(marks, marks[1:], strict=False):
        if stage in seen:
            seen[stage].append(max(0.05, tm - before))


# -- checks ------------------------------------------------------------------------------------------------------------


def hashable(row: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def first_difference(expected: dict, got: dict) -> str | None:
    if got["postgres"] != expected["postgres"]:
        want = {r[0]: r for r in expected["postgres"]}
        have = {r[0]: r for r in got["postgres"]}
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                return f"PostgreSQL dw.{name}: {have.get(name)} (count, md5) against {want.get(name)} in the clean run"
    for table in sorted(set(expected["delta"]) | set(got["delta"])):
        a, b = expected["delta"].get(table), got["delta"].get(table)
        if a == b:
            continue
        if a is None or b is None:
            return f"Delta warehouse.{table}: {'missing' if b is None else 'only'} in the chaos run"
        ca, cb = collections.Counter(map(hashable, a)), collections.Counter(map(hashable, b))
        missing, extra = ca - cb, cb - ca
        text = f"Delta warehouse.{table}: {len(b)} rows against {len(a)}; {sum(missing.values())} missing"
        if missing:
            text += f" (first: {dict(next(iter(missing)))})"
        text += f", {sum(extra.values())} extra"
        if extra:
            text += f" (first: {dict(next(iter(extra)))})"
        if not missing and not extra:
            text += " (same rows, another order)"
        return text
    return None


def duplicates_in_delta(snap: dict) -> dict[str, int]:
    out = {}
    for table, rows in snap["delta"].items():
        n = len(rows) - len(set(map(hashable, rows)))
        if n:
            out[table] = n
    return out


def twice_committed(lake_root: Path) -> list[str]:
    """App transactions (app id, version) found in more than one commit of a Delta table."""
    from deltalake import DeltaTable

    found = []
    for log_dir in sorted(lake_root.glob("*/*/_delta_log")):
        seen = collections.Counter(
            (e.get("streamdi.app_id"), e.get("streamdi.txn_version"))
            for e in DeltaTable(str(log_dir.parent)).history()
            if e.get("streamdi.app_id")
        )
        found += [f"{log_dir.parent.parent.name}.{log_dir.parent.name}: {k} x{n}" for k, n in seen.items() if n > 1]
    return found


def database_checks(home: Path) -> dict:
    """Duplicate rows in PostgreSQL's warehouse tables, duplicate ledger rows, warehouse commits not migrated."""
    settings = Settings(home=home)
    lake = Lake(home / "lake")
    try:
        warehouse = open_warehouse(settings)
        dup_sql = sql.SQL(" UNION ALL ").join(
            sql.SQL(
                "SELECT {name}, count(*) - (SELECT count(*) FROM (SELECT DISTINCT x::text FROM {t} x) d) FROM {t}"
            ).format(name=sql.Literal(t.name), t=sql.Identifier("dw", t.name))
            for t in WAREHOUSE_TABLES
        )
        _, dup_rows = warehouse.query(dup_sql)
        _, ledger_dups = warehouse.query(
            "SELECT table_name, delta_version, count(*) FROM streamdi.migration_ledger "
            "GROUP BY table_name, delta_version HAVING count(*) > 1"
        )
        _, ledger = warehouse.query(
            "SELECT table_name, count(*), max(delta_version) FROM streamdi.migration_ledger GROUP BY table_name"
        )
    finally:
        embedded_pg.stop_server(settings)
    last = {name: int(v) for name, _, v in ledger}
    unmigrated = {}
    for t in WAREHOUSE_TABLES:
        if lake.exists(t):
            left = [c.table_version for c in lake.history(t) if c.app_id and c.table_version > last.get(t.name, -1)]
            if left:
                unmigrated[t.name] = left
    return {
        "postgres_duplicate_rows": {name: int(n) for name, n in dup_rows if n},
        "ledger_duplicates": [list(r) for r in ledger_dups],
        "ledger_rows": sum(int(n) for _, n, _ in ledger),
        "unmigrated_commits": unmigrated,
    }


def batch_log_checks(home: Path) -> dict:
    log = BatchLog(Lake(home / "lake"))
    return {
        "micro_batches": len(log.batch_ids()),
        "pending": [list(p) for p in log.pending()],
        "halted": [f"{h.batch_id} {h.stage}: {h.reason}" for h in log.halted()],
        "unregistered_landing_files": unregistered(home),
    }


def db_stop(home: Path) -> None:
    subprocess.run([STREAMDI, "db", "stop"], env=env_for(home), capture_output=True, text=True, timeout=120)


# -- main --------------------------------------------------------------------------------------------------------------


app = script_app()


@app.command(help=" ".join(__doc__.split("\n\n")[0].split()))
def main(
    sf: Annotated[
        float | None, typer.Option(help="scale factor of the data set (generated at 0.1 if not given)")
    ] = None,
    batches: Annotated[int, typer.Option(help="TPC-DI batches, Batch1 included")] = 20,
    stream_batches: Annotated[int, typer.Option(help="the last batches, dripped into the service")] = 3,
    data: Annotated[Path | None, typer.Option()] = None,
    work: Annotated[Path | None, typer.Option(help="homes and logs (default: a new temporary directory)")] = None,
    kills: Annotated[int, typer.Option(help="kills in all (at least; a shortfall is reported)")] = 100,
    stream_kills: Annotated[int, typer.Option(help="of them, kills of the stream service")] = 25,
    seed: Annotated[int, typer.Option()] = 1,
    compact: Annotated[int, typer.Option(help="STREAMDI_COMPACT_SMALL_FILES of the chaos home")] = 4,
    parts: Annotated[int, typer.Option(help="pieces per data file in the stream's feed")] = 4,
    rate: Annotated[float, typer.Option(help="files per second in the stream's feed")] = 0.15,
    stream_max_delay: Annotated[float, typer.Option(help="seconds; target 'any' of the service")] = 25.0,
    keep: Annotated[bool, typer.Option("--keep", help="keep the homes even when the run ends identical")] = False,
    out: Annotated[Path, typer.Option()] = OUT / "chaos.json",
) -> None:
    args = SimpleNamespace(**locals())  # the options by name, as the rest of main reads them
    if not 0 <= args.stream_batches < args.batches:
        raise typer.BadParameter("must leave at least Batch1 to the loads", param_hint="--stream-batches")
    for name in ("DATABASE_URL", "STREAMDI_HOME", "STREAMDI_FAULT_AT"):
        os.environ.pop(name, None)
    # removed at exit, after the embedded server's exit hooks (atexit runs last what was registered first): they take
    # `<home>/.pgdata.lock` of every home this process opened, which would leave the removed homes behind, empty
    removed: list[Path] = []
    atexit.register(lambda: [shutil.rmtree(home, ignore_errors=True) for home in removed])

    work = args.work or Path(tempfile.mkdtemp(prefix="streamdi-bench-chaos-"))
    data = args.data or work / f"data-sf{args.sf or 0.1:g}-b{args.batches}"
    if not (data / f"Batch{args.batches}").is_dir():
        args.sf = args.sf or 0.1
        print(f"generating SF {args.sf:g}, {args.batches} batches into {data}")
        generate(Params(scale_factor=args.sf, batches=args.batches), data)
    reference, chaos, logs = work / "reference", work / "chaos", work / "logs"
    for home in (reference, chaos):
        if home.exists():
            db_stop(home)
            shutil.rmtree(home)
    shutil.rmtree(logs, ignore_errors=True)
    load_batches = list(range(1, args.batches - args.stream_batches + 1))
    stream_batches = list(range(args.batches - args.stream_batches + 1, args.batches + 1))
    rng = random.Random(args.seed)
    print(f"data {data} (SF {args.sf or '?'}, Batch1..{args.batches}); work {work}; seed {args.seed}")
    print(f"py-spy: {PY_SPY if Path(PY_SPY).exists() else 'not found: kills classified from the output markers'}")

    print("clean reference run: every batch loaded once, nothing killed")
    t0 = time.monotonic()
    timings = run_reference(data, args.batches, reference, logs)
    reference_seconds = time.monotonic() - t0
    expected = snapshot(reference)
    db_stop(reference)

    print(f"chaos run: loads of Batch{load_batches[0]}..{load_batches[-1]}, the stream service for {stream_batches}")
    env = env_for(chaos, compact=str(args.compact))
    tally = Tally()
    result: dict = {}
    t0 = time.monotonic()
    load_quota = args.kills - (args.stream_kills if stream_batches else 0)
    per_batch: dict[str, dict] = {}
    stream_seconds = None
    stop = None
    try:
        for i, batch in enumerate(load_batches):
            quota = -(-(load_quota - len(tally.kills)) // (len(load_batches) - i))  # what is left, spread
            b0 = time.monotonic()
            n = load_with_kills(data, batch, chaos, env, logs, timings[batch], quota, rng, tally)
            per_batch[f"Batch{batch}"] = {"kills": n, "quota": quota, "seconds": round(time.monotonic() - b0, 1)}
        if stream_batches:
            quota = args.kills - len(tally.kills)
            n, stream_seconds = stream_with_kills(data, stream_batches, chaos, env, logs, args, quota, rng, tally)
            per_batch["stream " + ",".join(f"Batch{b}" for b in stream_batches)] = {
                "kills": n,
                "quota": quota,
                "seconds": round(stream_seconds, 1),
            }
    except Stop as exc:
        stop = str(exc)
    chaos_seconds = time.monotonic() - t0

    checks: dict = {}
    difference = None
    if stop is None:
        got = snapshot(chaos)
        difference = first_difference(expected, got)
        checks = {
            "delta_duplicate_rows": duplicates_in_delta(got),
            "delta_duplicate_rows_in_reference": duplicates_in_delta(expected),
            "twice_committed": twice_committed(chaos / "lake"),
            **batch_log_checks(chaos),
            **database_checks(chaos),
        }
        checks["reference"] = {k: v for k, v in database_checks(reference).items() if k != "postgres_duplicate_rows"}
    db_stop(chaos)
    db_stop(reference)
    problems = [
        p
        for p in (
            stop,
            difference,
            checks.get("delta_duplicate_rows") and f"duplicate Delta rows {checks['delta_duplicate_rows']}",
            checks.get("postgres_duplicate_rows") and f"duplicate PostgreSQL rows {checks['postgres_duplicate_rows']}",
            checks.get("twice_committed") and f"Delta commits made twice: {checks['twice_committed'][:5]}",
            checks.get("pending") and f"pending in the batch log: {checks['pending']}",
            checks.get("halted") and f"halted: {checks['halted']}",
            checks.get("unregistered_landing_files") and f"not collected: {checks['unregistered_landing_files'][:5]}",
            checks.get("ledger_duplicates") and f"duplicate ledger rows: {checks['ledger_duplicates']}",
            checks.get("unmigrated_commits") and f"warehouse commits not migrated: {checks['unmigrated_commits']}",
            [k.n for k in tally.kills if k.orphans] and "orphan processes after a kill",
        )
        if p
    ]
    kills = tally.kills
    by_phase = collections.Counter(k.phase for k in kills)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "data": {"path": str(data), "sf": args.sf, "batches": args.batches, "stream_batches": stream_batches},
        "seed": args.seed,
        "compact_small_files": args.compact,
        "feed": {"parts": args.parts, "rate": args.rate},
        "classified_by": dict(collections.Counter(k.by for k in kills)),
        "kills": len(kills),
        "kills_asked": args.kills,
        "kills_by_phase": {p: by_phase[p] for p in PHASES if by_phase[p]},
        "kills_by_part_and_phase": {
            part: dict(collections.Counter(k.phase for k in kills if k.part == part)) for part in ("load", "stream")
        },
        "kills_by_target": dict(collections.Counter(k.target for k in kills)),
        "transform_kills_by_step": dict(
            collections.Counter(
                k.detail.split(":")[0] if ":" in k.detail else "?" for k in kills if k.phase == "transform"
            )
        ),
        "stack_and_markers_agree": sum(k.phase == k.marker_phase for k in kills if k.by == "stack"),
        "processes_started": tally.started,
        "restarts_after_a_kill": len(kills),
        "failed_attempts": tally.failures,
        "per_batch": per_batch,
        "reference_seconds": round(reference_seconds, 1),
        "reference_per_batch": timings,
        "chaos_seconds": round(chaos_seconds, 1),
        "stream_seconds": round(stream_seconds, 1) if stream_seconds else None,
        "checks": checks,
        "difference": difference,
        "stopped": stop,
        "result": "identical" if not problems else "FAILED",
        "problems": problems,
        "homes": {"reference": str(reference), "chaos": str(chaos), "logs": str(logs)},
        "kill_list": [asdict(k) for k in kills],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    print(f"\n{len(kills)} kills (SIGKILL), {tally.started} processes started, {len(tally.failures)} failed attempt(s)")
    if len(kills) < args.kills:
        print(f"  fewer kills than the {args.kills} asked: more batches (--batches) or a slower feed (--rate)")
    print("  by phase:  " + ", ".join(f"{p} {n}" for p, n in result["kills_by_phase"].items()))
    for part, counts in result["kills_by_part_and_phase"].items():
        if counts:
            print(f"  {part:<6}:   " + ", ".join(f"{p} {counts[p]}" for p in PHASES if p in counts))
    print("  by target: " + ", ".join(f"{p} {n}" for p, n in result["kills_by_target"].items()))
    print("  transform kills by steps in flight: " + json.dumps(result["transform_kills_by_step"]))
    stacked = sum(k.by == "stack" for k in kills)
    print(f"  where: {stacked} from the process's stack (markers agree on {result['stack_and_markers_agree']})")
    print(f"reference {reference_seconds:.0f} s; chaos run {chaos_seconds:.0f} s (wall)")
    if problems:
        print("RESULT: FAILED")
        for p in problems:
            print(f"  - {p}")
        print(f"homes kept for inspection: reference {reference}, chaos {chaos}, logs {logs}")
    else:
        micro = checks["micro_batches"]
        print(
            f"RESULT: identical -- every Delta warehouse table and PostgreSQL dw.* table equals the clean run; "
            f"no duplicate rows, {micro} micro-batches all done, nothing pending or halted, no commit made twice, "
            f"{checks['ledger_rows']} ledger rows without duplicates, nothing unmigrated"
        )
        if not args.keep:
            removed += [reference, chaos]
    print(f"written {args.out}")
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    app()
