"""streamdi on a Spark standalone cluster against `local[2]`: whole `streamdi load` processes, and the warehouse each
run ends with (issue 25's "2 workers against 1").

Usage: .venv/bin/python bench/cluster.py [--sf 3] [--data DIR] [--batches 2] [--executor-memory 2g]

Generates the data set if DIR has none, then, for each Spark: `local[2]` (the default), a loopback cluster of one
1-core worker, and one of two 1-core workers (`streamdi.spark_standalone`: master and workers started from the
pyspark wheel, as tests/e2e/test_cluster.py does): `streamdi load --batch 1`, then `--batch 2` (...), each a new
process on a fresh home, timed from outside with the peak memory of the driver's process tree (the executors' JVMs
are the workers' children, not the driver's). Prints the seconds per batch, the ratio of 2 workers to 1, and whether
each run's warehouse (every Delta warehouse table, row for row) equals the local one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from load import run_sampled

from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.generator import Params, generate
from streamdi.lake import Lake
from streamdi.scripts import script_app
from streamdi.spark_standalone import loopback_cluster

REPO = Path(__file__).resolve().parents[1]
STREAMDI = [sys.executable, "-m", "streamdi.run.cli"]

app = script_app()


def warehouse_digest(home: Path) -> str:
    """A digest of every Delta warehouse table's rows (sorted, as text): equal warehouses, equal digests."""
    lake = Lake(home / "lake")
    digest = hashlib.sha256()
    for table in WAREHOUSE_TABLES:
        if lake.exists(table):
            digest.update(table.name.encode())
            for row in sorted(map(repr, lake.read_arrow(table).to_pylist())):
                digest.update(row.encode())
    return digest.hexdigest()[:16]


def load_batches(data: Path, home: Path, batches: int, master: str, conf_dir: Path) -> list[tuple[float, int]]:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {**os.environ, "STREAMDI_HOME": str(home), "STREAMDI_SPARK_MASTER": master, "STREAMDI_SPARK_REMOTE": "off"}
    env["SPARK_CONF_DIR"] = str(conf_dir)
    env.pop("DATABASE_URL", None)
    figures = []
    try:
        for batch in range(1, batches + 1):
            command = [*STREAMDI, "load", "--data", str(data), "--batch", str(batch)]
            done, seconds, peak = run_sampled(command, env)
            if done.returncode != 0:
                raise SystemExit(f"streamdi load --batch {batch} on {master} failed:\n{done.stdout[-6000:]}")
            print(f"  {master:<28} Batch{batch}: {seconds:6.1f} s, driver peak memory {peak / 2**30:.2f} GiB")
            figures.append((seconds, peak))
    finally:
        subprocess.run([*STREAMDI, "db", "stop"], cwd=REPO, env=env, capture_output=True)
    return figures


@app.command(help=__doc__.splitlines()[0])
def main(
    sf: Annotated[float, typer.Option(help="scale factor of the generated data set")] = 3.0,
    data: Annotated[Path | None, typer.Option(help="data set (generated here when it has no Batch1)")] = None,
    batches: Annotated[int, typer.Option(help="TPC-DI batches to load, Batch1 first")] = 2,
    executor_memory: Annotated[str, typer.Option(help="spark.executor.memory of each worker's executor")] = "2g",
) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="streamdi-cluster-bench-"))
    data = data or scratch / f"sf{sf:g}"
    if not (data / "Batch1").is_dir():
        print(f"generating SF {sf:g} ({batches} batches) into {data}")
        generate(Params(scale_factor=sf, batches=max(batches, 2)), data)
    conf_dir = scratch / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"spark.executor.memory {executor_memory}\n")
    runs: dict[str, list[tuple[float, int]]] = {}
    digests: dict[str, str] = {}
    try:
        runs["local[2]"] = load_batches(data, scratch / "local", batches, "local[2]", conf_dir)
        digests["local[2]"] = warehouse_digest(scratch / "local")
        shutil.rmtree(scratch / "local")  # one home on disk at a time (SF 10: ~7 GB each)
        for workers in (1, 2):
            name = f"{workers} worker(s) x 1 core"
            cluster_dir = scratch / f"cluster-{workers}"
            with loopback_cluster(cluster_dir, workers=workers, cores=1, memory=executor_memory) as cluster:
                runs[name] = load_batches(data, scratch / f"home-{workers}", batches, cluster.url, conf_dir)
                ran = cluster.workers_that_ran_tasks()
            digests[name] = warehouse_digest(scratch / f"home-{workers}")
            shutil.rmtree(scratch / f"home-{workers}")
            print(f"  workers that ran tasks: {', '.join(ran) or 'none'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # homes, clusters' logs, a generated data set
    print(f"\nSF {sf:g}, whole `streamdi load` processes (seconds; driver peak GiB); warehouse digest")
    for name, figures in runs.items():
        cells = "  ".join(f"Batch{b + 1} {s:6.1f} s ({p / 2**30:.2f})" for b, (s, p) in enumerate(figures))
        same = "same as local" if digests[name] == digests["local[2]"] else "DIFFERS from local"
        print(f"  {name:<22} {cells}  {digests[name]} {same}")
    one, two = runs["1 worker(s) x 1 core"], runs["2 worker(s) x 1 core"]
    for b in range(batches):
        print(f"  Batch{b + 1}: 2 workers / 1 worker = {two[b][0] / one[b][0]:.2f} of the time")


if __name__ == "__main__":
    app()
