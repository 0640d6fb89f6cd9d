"""Cost against history: does micro-batch 500 of a long drip cost what micro-batch 5 costs? (issue 25: within 1.2x)

Usage: .venv/bin/python bench/history.py [--sf 1] [--batches 501] [--data DIR] [--home DIR]

Generates the data set if DIR has none (`--batches` TPC-DI batches: Batch1 historical, the rest incremental, all of
one size), loads Batch1 with `streamdi load` (a process of its own, not timed), then in this one warm process
(Spark and PostgreSQL started before the clock) delivers each incremental batch whole into the landing zone and
runs it through stage -> transform -> migrate -> maintenance (`run_pending`): one micro-batch per TPC-DI batch, so
micro-batch N is TPC-DI batch N and every micro-batch has the same size. Lake maintenance follows the environment
(`STREAMDI_CHECKPOINT_EVERY`, `STREAMDI_VACUUM_RETENTION_HOURS`). Prints a line every 25 micro-batches and, at the
end, the medians of micro-batches 3-12 ("micro-batch 5"), of the last ten and of the last fifty (steadier: the
machine's slow and fast spells last tens of micro-batches), per stage and transform step, of the collect (landing
zone -> batch log), of what follows the last step ("after": the lake's maintenance) and of Python's garbage
collections ("gc", within the others), and the CPU time of this process (all its threads; Spark's JVM not counted;
steadier than the clock on a busy machine), with the ratio against the goal. Every micro-batch's times go to
bench/out/history.jsonl (or `--out`).

`--snapshot N` (repeatable) copies the whole home after micro-batch N to <home>-at-N (the embedded PostgreSQL server
stopped for the copy, the copy's replaced data files vacuumed), and `--start N --home <a copy of a snapshot>` goes on
from there: micro-batches N to `--batches`, nothing generated or loaded first. `bench/history_pair.py` times a few
micro-batches after two snapshots in turn, which the machine's slow and fast spells cannot favour.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from deltalake import DeltaTable

from streamdi.context import JobContext
from streamdi.delivery import deliver_batch
from streamdi.embedded_pg import stop_server
from streamdi.generator import Params, generate
from streamdi.run.pipeline import run_pending
from streamdi.scripts import script_app
from streamdi.settings import Settings

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "history.jsonl"
GOAL = 1.2  # issue 25: micro-batch 500 within 1.2x of micro-batch 5
EARLY = range(3, 13)  # micro-batch 2 is the warm process's first (cold JIT)

app = script_app()


class GcClock:
    """Seconds the process spent in Python's cyclic garbage collector (a collection of the oldest generation walks
    every live object: its cost grows with what the process keeps)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return round(seconds, 3)


def micro_batch(ctx: JobContext, data: Path, batch: int, gc_clock: GcClock) -> dict:
    deliver_batch(data, batch, ctx.settings.landing_dir)
    gc_clock.take()
    marks: dict[str, float] = {}
    cpu = time.process_time()
    started = time.perf_counter()
    report = run_pending(
        ctx,
        on_collect=lambda _: marks.setdefault("collected", time.perf_counter()),
        on_step=lambda _: marks.__setitem__("last_step", time.perf_counter()),
    )
    ended = time.perf_counter()
    row: dict = {"batch": batch, "seconds": round(ended - started, 3), "cpu": round(time.process_time() - cpu, 3)}
    # Besides the steps: the collect (landing zone -> batch log), and what follows the last step (the maintenance)
    row["collect"] = round(marks["collected"] - started, 3)
    row["after"] = round(ended - marks.get("last_step", ended), 3)
    row["gc"] = gc_clock.take()
    for step in report.steps:
        row[step.stage] = round(step.seconds, 3)
        for name, seconds in (step.detail.get("seconds") or {}).items():
            row[name] = seconds
    row["maintained"] = len(report.maintained)
    return row


def take_snapshot(ctx: JobContext, copy: Path, batch: int, data: Path) -> None:
    """The whole home copied to `copy` with the embedded server stopped (its files are then consistent; the next use of
    the warehouse starts it again), and in the copy each Delta table's data files it no longer uses deleted: the copy
    holds what a lake keeps in use, not the replaced files the retention keeps for readers in flight. The copy says
    which micro-batch and data set it follows (history-snapshot.json)."""
    stop_server(ctx.settings)
    ctx.reset_warehouse()
    shutil.rmtree(copy, ignore_errors=True)
    # -a: the server's files keep their owner
    subprocess.run(["cp", "-a", str(ctx.settings.home), str(copy)], check=True)
    for log_dir in sorted(copy.glob("lake/*/*/_delta_log")):
        DeltaTable(str(log_dir.parent)).vacuum(0, dry_run=False, enforce_retention_duration=False)
    (copy / "history-snapshot.json").write_text(json.dumps({"batch": batch, "data": str(data)}))
    ctx.warehouse.ensure_objects(())


def medians(rows: list[dict], keys: list[str]) -> dict[str, float]:
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}


def load_batch1(data: Path, home: Path) -> None:
    """Batch1 loaded into a new home by `streamdi load` (a process of its own)."""
    env = {**os.environ, "STREAMDI_HOME": str(home), "STREAMDI_SPARK_REMOTE": "off"}
    env.pop("DATABASE_URL", None)
    load = [sys.executable, "-m", "streamdi.run.cli", "load", "--data", str(data), "--batch", "1"]
    done = subprocess.run(load, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"Batch1 did not load:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


@app.command(help=__doc__.splitlines()[0])
def main(
    sf: Annotated[float, typer.Option(help="scale factor of the generated data set")] = 1.0,
    batches: Annotated[int, typer.Option(help="TPC-DI batches, Batch1 included")] = 501,
    data: Annotated[Path | None, typer.Option(help="data set (generated here when it lacks the last batch)")] = None,
    home: Annotated[Path | None, typer.Option(help="scratch STREAMDI_HOME (default: temporary)")] = None,
    snapshot: Annotated[
        list[int] | None, typer.Option(help="copy the home after this micro-batch to <home>-at-N (repeatable)")
    ] = None,
    start: Annotated[
        int, typer.Option(help="the first micro-batch; above 2: go on in --home (a snapshot's copy), no load first")
    ] = 2,
    out: Annotated[Path, typer.Option(help="every micro-batch's times, one JSON line each")] = OUT,
) -> None:
    data = data or Path(tempfile.gettempdir()) / f"streamdi-history-sf{sf:g}x{batches}"
    if not (data / f"Batch{batches}" / "BatchDate.txt").exists():
        if start > 2:
            raise SystemExit(f"{data} lacks Batch{batches}: give the data set the snapshot was made with")
        started = time.perf_counter()
        generate(Params(scale_factor=sf, batches=batches), data)
        print(f"generated SF {sf:g} with {batches} batches into {data} in {time.perf_counter() - started:.1f}s")
    if start > 2:
        if home is None or not (home / "lake").is_dir():
            raise SystemExit("--start above 2 goes on in an existing home: give --home (a copy of a snapshot)")
    else:
        home = home or Path(tempfile.mkdtemp(prefix="streamdi-history-home-"))
        shutil.rmtree(home, ignore_errors=True)
        load_batch1(data, home)
    settings = Settings(home=home, spark_remote="off")
    ctx = JobContext(settings)
    ctx.spark  # noqa: B018 - start the JVM before the clock
    ctx.warehouse.ensure_objects(())  # and the embedded PostgreSQL server
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    gc_clock = GcClock()
    started = time.perf_counter()
    with out.open("w") as lines:
        for batch in range(start, batches + 1):
            row = micro_batch(ctx, data, batch, gc_clock)
            rows.append(row)
            lines.write(json.dumps(row) + "\n")
            lines.flush()
            if batch in (snapshot or []):
                copy = home.with_name(f"{home.name}-at-{batch}")
                take_snapshot(ctx, copy, batch, data)
                print(f"micro-batch {batch}: home copied to {copy}", flush=True)
            if batch % 25 == 0 or batch == batches:
                recent = statistics.median(r["seconds"] for r in rows[-25:])
                print(
                    f"micro-batch {batch}: {row['seconds']:.2f} s (median of the last 25: {recent:.2f} s), "
                    f"{time.perf_counter() - started:.0f} s so far",
                    flush=True,
                )
    if start > 2:
        return  # a few micro-batches after a snapshot: bench/history_pair.py compares them
    keys = ["seconds", "cpu", "collect", "stage", "transform", "migrate", "after", "gc"]
    keys += ["T0", "T1", "T2", "T3", "T4", "AG", "DM"]
    early = medians([r for r in rows if r["batch"] in EARLY], keys)
    late = medians(rows[-10:], keys)
    wide = medians(rows[-50:], keys)  # the machine's slow and fast spells last tens of micro-batches
    last = rows[-1]["batch"]
    print(f"\nSF {sf:g}, {len(rows)} incremental micro-batches, one TPC-DI batch each (medians, seconds)")
    since = rows[-50:][0]["batch"]
    print(f"{'':<12} {'3-12':>8} {f'{last - 9}-{last}':>10} {'ratio':>7} {f'{since}-{last}':>10} {'ratio':>7}")
    for key in keys:
        ratio = late[key] / early[key] if early[key] else float("nan")
        wide_ratio = wide[key] / early[key] if early[key] else float("nan")
        print(f"{key:<12} {early[key]:8.3f} {late[key]:10.3f} {ratio:7.2f} {wide[key]:10.3f} {wide_ratio:7.2f}")
    ratio = late["seconds"] / early["seconds"]
    verdict = "within" if ratio <= GOAL else "above"
    print(f"\nmicro-batch {last} against micro-batch 5: {ratio:.2f}x, {verdict} issue 25's {GOAL}x")
    print(f"the last 50 against micro-batch 5: {wide['seconds'] / early['seconds']:.2f}x")


if __name__ == "__main__":
    app()
