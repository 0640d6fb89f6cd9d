"""Micro-batch N against micro-batch 5, in turn: a few micro-batches after two snapshots of one long drip (issue 25)

Usage: .venv/bin/python bench/history_pair.py --early HOME-at-12 --late HOME-at-490 [--rounds 6] [--batches 6]

`bench/history.py --snapshot N` leaves copies of a long drip's home after micro-batch N (the lake, the batch log, the
embedded PostgreSQL server's files). Each round copies the early snapshot and the late one to a scratch home in turn
(the order alternating from round to round) and goes on in each with `bench/history.py --start`: `--batches`
micro-batches of the same data set in one warm process, the first not counted (the process's cold start). The two
histories are thus timed minutes apart, many times over, instead of 500 micro-batches apart in one run, so the
machine's slow and fast spells, which last tens of micro-batches, fall on both alike. Prints the medians of the early
and the late micro-batches per stage and step, the ratio against issue 25's 1.2x and the ratio round by round; every
micro-batch's times go to bench/out/history_pair.jsonl.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from history import GOAL, medians  # bench/history.py, beside this script (its directory is first on sys.path)

from streamdi.scripts import script_app

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "history_pair.jsonl"
KEYS = ["seconds", "cpu", "collect", "stage", "transform", "migrate", "after", "T2", "T3", "T4", "AG", "DM"]

app = script_app()


def snapshot_of(home: Path) -> tuple[int, Path | None]:
    """The micro-batch a snapshot follows, and its data set (history-snapshot.json; else the directory's -at-N)."""
    marker = home / "history-snapshot.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        return int(meta["batch"]), Path(meta["data"])
    found = re.search(r"-at-(\d+)$", home.name)
    if not found:
        raise SystemExit(f"{home} is not a snapshot of bench/history.py --snapshot (no history-snapshot.json)")
    return int(found.group(1)), None


def go_on(snapshot: Path, batch: int, count: int, data: Path, scratch: Path, out: Path) -> list[dict]:
    """Micro-batches batch+1 .. batch+count in a copy of `snapshot`, one process; their rows, the first left out."""
    home = scratch / "home"
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run(["cp", "-a", str(snapshot), str(home)], check=True)  # -a: the server's files keep their owner
    subprocess.run(["sync"], check=True)  # the copy's writes not in the first micro-batch's time
    command = [sys.executable, str(REPO / "bench" / "history.py"), "--home", str(home), "--data", str(data)]
    command += ["--start", str(batch + 1), "--batches", str(batch + count), "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"micro-batches after {snapshot} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    shutil.rmtree(home, ignore_errors=True)
    return rows[1:]


@app.command(help=__doc__.splitlines()[0])
def main(
    early: Annotated[Path, typer.Option(help="the snapshot after an early micro-batch (e.g. <home>-at-12)")],
    late: Annotated[Path, typer.Option(help="the snapshot after a late micro-batch (e.g. <home>-at-490)")],
    rounds: Annotated[int, typer.Option(help="rounds, each timing both snapshots")] = 6,
    batches: Annotated[int, typer.Option(help="micro-batches per process, the first not counted")] = 6,
    data: Annotated[Path | None, typer.Option(help="the data set of the drip (default: the snapshot's)")] = None,
) -> None:
    (early_batch, early_data), (late_batch, late_data) = snapshot_of(early), snapshot_of(late)
    data = data or early_data or late_data
    if data is None or not (data / f"Batch{late_batch + batches}" / "BatchDate.txt").exists():
        raise SystemExit(f"give --data: the drip's data set, with batches up to {late_batch + batches}")
    scratch = Path(tempfile.mkdtemp(prefix="streamdi-history-pair-"))
    kept: dict[str, list[dict]] = {"early": [], "late": []}
    ratios: list[float] = []
    started = time.perf_counter()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as lines:
        for round_ in range(rounds):
            order = [("early", early, early_batch), ("late", late, late_batch)]
            got: dict[str, list[dict]] = {}
            for which, snapshot, batch in order if round_ % 2 == 0 else order[::-1]:
                got[which] = go_on(snapshot, batch, batches, data, scratch, scratch / f"{which}.jsonl")
                kept[which] += got[which]
                for row in got[which]:
                    lines.write(json.dumps({"round": round_, "history": which, **row}) + "\n")
            late_s, early_s = (statistics.median(r["seconds"] for r in got[w]) for w in ("late", "early"))
            ratios.append(late_s / early_s)
            print(
                f"round {round_ + 1}: micro-batch {late_batch + 2}.. {late_s:.3f} s, "
                f"{early_batch + 2}.. {early_s:.3f} s: {late_s / early_s:.2f}x "
                f"({time.perf_counter() - started:.0f} s so far)",
                flush=True,
            )
    shutil.rmtree(scratch, ignore_errors=True)
    first, last = medians(kept["early"], KEYS), medians(kept["late"], KEYS)
    count = len(kept["early"])
    print(f"\nmedians of {count} micro-batches each, after micro-batch {early_batch} and after {late_batch} (seconds)")
    print(f"{'':<10} {'early':>8} {'late':>8} {'ratio':>7}")
    for key in KEYS:
        ratio = last[key] / first[key] if first[key] else float("nan")
        print(f"{key:<10} {first[key]:8.3f} {last[key]:8.3f} {ratio:7.2f}")
    ratio = last["seconds"] / first["seconds"]
    verdict = "within" if ratio <= GOAL else "above"
    print(f"\nafter micro-batch {late_batch} against after {early_batch}: {ratio:.2f}x, {verdict} issue 25's {GOAL}x")
    print(f"round by round: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    app()
