"""Wall time of each Airflow task as a user sees it in the grid: Spark in each task's process against the home's warm
embedded Spark Connect server (issue 22), and a new process's time to its first Spark result.

Usage:
    .venv/bin/python bench/airflow_tasks.py run --label embedded --remote embedded [--sf 0.1]
    .venv/bin/python bench/airflow_tasks.py run --label off --remote off
    .venv/bin/python bench/airflow_tasks.py run --label before --code /path/to/older/checkout --remote unset
    .venv/bin/python bench/airflow_tasks.py compare before off embedded
    .venv/bin/python bench/airflow_tasks.py first-result

`run` starts `streamdi airflow` (real `airflow standalone`: scheduler, a process per task) of the checkout `--code` on
a fresh STREAMDI_HOME with STREAMDI_SPARK_REMOTE=`--remote` (`unset`: not set), then through the REST API runs
streamdi_setup and streamdi_historical_load on a generated data set (`--sf`, Batch1), then streamdi_incremental on a
tiny delivery (the first lines of Batch2's BatchDate, Customer, Account and Trade files), and writes every task's
duration and each run's wall time (its start to its end, queueing included) to `bench/out/airflow_tasks-<label>.json`.
`compare` prints the labels side by side with ratios. `first-result` times a new Python process from its start to
the result of its first Spark job (`streamdi.spark.get_spark`, a count of 10 rows): Spark in the process, and on a
warm embedded server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import httpx
import typer

from streamdi.scripts import script_app

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
TINY = {"BatchDate.txt": None, "Customer.txt": 5, "Account.txt": 5, "Trade.txt": 20}  # file -> first lines (None: all)

app = script_app(no_args_is_help=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, check, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except httpx.HTTPError:
            pass
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


class Airflow:
    def __init__(self, code: Path, home: Path, remote: str, log_path: Path) -> None:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k != "STREAMDI_SPARK_REMOTE"}
        # streamdi_incremental once a year: unpausing it starts one scheduled run at once (catchup=False), which the
        # bench lets finish before it delivers files and triggers the run it times
        env.update(STREAMDI_HOME=str(home), PYTHONPATH=str(code), STREAMDI_INCREMENTAL_SCHEDULE="0 0 1 1 *")
        if remote != "unset":
            env["STREAMDI_SPARK_REMOTE"] = remote
        self.env = env
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streamdi.airflow_cli", "--port", str(port)],
                cwd=code,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        banner = _wait(
            "the login banner",
            lambda: re.search(r"Airflow UI: (\S+)\s+\(login: (\S+) / (\S+)\)", log_path.read_text()),
            60,
            0.5,
        )
        url, user, password = banner.groups()
        _wait("the API server", lambda: httpx.get(f"{url}/api/v2/monitor/health", timeout=5).is_success, 180)
        token = httpx.post(f"{url}/auth/token", json={"username": user, "password": password}, timeout=30).json()
        self.api = httpx.Client(
            base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token['access_token']}"}, timeout=60
        )

    def unpause(self, dag_id: str) -> None:
        """Unpause `dag_id` and let the runs this starts (a scheduled DAG's latest interval) finish."""
        _wait(f"{dag_id} to be registered", lambda: self.api.get(f"/dags/{dag_id}").is_success, 240)
        self.api.patch(f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
        time.sleep(5)  # the scheduler creates the scheduled run on its next loop

        def idle():
            runs = self.api.get(f"/dags/{dag_id}/dagRuns").json()["dag_runs"]
            return all(r["state"] in ("success", "failed") for r in runs)

        _wait(f"{dag_id}'s scheduled runs to finish", idle, 600, 2)

    def run(self, dag_id: str, conf: dict) -> dict:
        """Trigger `dag_id` (unpaused) with `conf`, wait for the end; the run's wall time and its tasks."""
        created = self.api.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        created.raise_for_status()
        run_id = created.json()["dag_run_id"]

        def finished():
            run = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()
            return run if run["state"] in ("success", "failed") else None

        run = _wait(f"{dag_id} to finish", finished, 3600, 2)
        listed = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        tasks = {t["task_id"]: {"state": t["state"], "seconds": t["duration"], "try": t["try_number"]} for t in listed}
        if run["state"] != "success":
            raise SystemExit(f"{dag_id} {run['state']}: {tasks}\n{self.log_path.read_text()[-3000:]}")
        return {"wall": _seconds(run["start_date"], run["end_date"]), "tasks": tasks}

    def stop(self, code: Path) -> None:
        import signal

        try:
            os.killpg(self.process.pid, signal.SIGINT)
            self.process.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
        for command in (["spark", "stop"], ["db", "stop"]):
            cli = [sys.executable, "-m", "streamdi.run.cli", *command]
            subprocess.run(cli, cwd=code, env=self.env, capture_output=True, timeout=120)


def _dataset(sf: float) -> Path:
    data = OUT / f"data-sf{sf:g}"
    if not (data / "Batch2" / "BatchDate.txt").exists():
        from streamdi.generator import Params, generate

        generate(Params(scale_factor=sf, batches=2), data)
    return data


def _deliver_tiny(data: Path, landing: Path) -> None:
    target = landing / "Batch2"
    target.mkdir(parents=True, exist_ok=True)
    for name, lines in TINY.items():
        text = (data / "Batch2" / name).read_bytes()
        if lines is not None:
            text = b"".join(text.splitlines(keepends=True)[:lines])
        (target / name).write_bytes(text)


@app.command()
def run(
    label: Annotated[str, typer.Option(help="Name of this configuration in the output.")],
    remote: Annotated[str, typer.Option(help="STREAMDI_SPARK_REMOTE of the tasks ('unset': not set).")] = "unset",
    code: Annotated[Path, typer.Option(help="The checkout whose Airflow, DAGs and jobs run.")] = REPO,
    sf: Annotated[float, typer.Option(help="Scale factor of the historical load.")] = 0.1,
) -> None:
    """One configuration: setup, historical load, a tiny incremental run; per-task seconds to bench/out."""
    OUT.mkdir(parents=True, exist_ok=True)
    data = _dataset(sf)
    home = Path(tempfile.mkdtemp(prefix=f"streamdi-bench-{label}-"))
    airflow = Airflow(code.resolve(), home, remote, OUT / f"airflow_tasks-{label}.log")
    try:
        for dag_id in ("streamdi_setup", "streamdi_historical_load", "streamdi_incremental"):
            airflow.unpause(dag_id)
        runs = {
            "streamdi_setup": airflow.run("streamdi_setup", {"data_dir": str(data)}),
            "streamdi_historical_load": airflow.run(
                "streamdi_historical_load", {"data_dir": str(data), "batch": 1, "migration_mode": "push"}
            ),
        }
        _deliver_tiny(data, home / "landing")
        runs["streamdi_incremental"] = airflow.run("streamdi_incremental", {"migration_mode": "push"})
    finally:
        airflow.stop(code.resolve())
        shutil.rmtree(home, ignore_errors=True)
    result = {"label": label, "remote": remote, "code": str(code), "sf": sf, "runs": runs}
    (OUT / f"airflow_tasks-{label}.json").write_text(json.dumps(result, indent=1))
    _print([result])


def _print(results: list[dict]) -> None:
    labels = [r["label"] for r in results]
    print(f"{'run / task':44s}" + "".join(f"{label:>12s}" for label in labels))
    for dag_id in results[0]["runs"]:
        walls = [r["runs"].get(dag_id, {}).get("wall") for r in results]
        print(f"{dag_id + ' (run wall)':44s}" + "".join(f"{w:12.1f}" if w else f"{'-':>12s}" for w in walls))
        tasks: list[str] = []
        for r in results:
            tasks += [t for t in r["runs"].get(dag_id, {}).get("tasks", {}) if t not in tasks]
        for task in tasks:
            cells = []
            for r in results:
                t = r["runs"].get(dag_id, {}).get("tasks", {}).get(task)
                cells.append(f"{t['seconds']:12.1f}" if t and t["seconds"] is not None else f"{'-':>12s}")
            print(f"  {task:42s}" + "".join(cells))
    if len(results) > 1:
        base = results[0]
        for r in results[1:]:
            for dag_id, run_ in r["runs"].items():
                if base["runs"].get(dag_id, {}).get("wall"):
                    ratio = run_["wall"] / base["runs"][dag_id]["wall"]
                    print(f"{dag_id}: {r['label']} / {base['label']} = {ratio:.2f}")


@app.command()
def compare(labels: list[str]) -> None:
    """Print the saved results of `labels` side by side (the first is the base of the ratios)."""
    _print([json.loads((OUT / f"airflow_tasks-{label}.json").read_text()) for label in labels])


# pandas is imported by every task anyway (Great Expectations, the report); the Spark Connect client's own modules
# (gRPC, protobuf, the client) count as Spark's cost
FIRST_RESULT = """
import time
started = time.perf_counter()
import pandas
from streamdi.settings import load_settings
from streamdi.spark import get_spark
imported = time.perf_counter()
assert get_spark(load_settings()).range(10).count() == 10
print(f"{imported - started:.3f} {time.perf_counter() - imported:.3f}")
"""


@app.command("first-result")
def first_result(runs: Annotated[int, typer.Option(help="Processes per configuration.")] = 3) -> None:
    """A new process's seconds from its start to its first Spark result, Spark in the process and on a warm
    embedded server (medians of `runs`)."""
    home = Path(tempfile.mkdtemp(prefix="streamdi-bench-first-"))
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_SPARK_REMOTE"}
    env["STREAMDI_HOME"] = str(home)
    streamdi = [sys.executable, "-m", "streamdi.run.cli"]
    try:
        subprocess.run([*streamdi, "spark", "stop"], env=env, capture_output=True)
        for remote in ("off", "embedded"):
            if remote == "embedded":  # started and warmed by one client first
                subprocess.run([*streamdi, "spark", "start"], env=env, check=True, capture_output=True)
                subprocess.run([sys.executable, "-c", FIRST_RESULT], env={**env, "STREAMDI_SPARK_REMOTE": remote})
            walls, parts = [], []
            for _ in range(runs):
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", FIRST_RESULT],
                    env={**env, "STREAMDI_SPARK_REMOTE": remote},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                walls.append(time.perf_counter() - started)
                parts.append([float(x) for x in done.stdout.split()])
            imports = statistics.median(p[0] for p in parts)
            spark = statistics.median(p[1] for p in parts)
            print(
                f"Spark {'in the process' if remote == 'off' else 'on a warm embedded server':26s}: process start to "
                f"first result {statistics.median(walls):.2f} s (median of {runs}); of it, streamdi's and pandas' "
                f"imports {imports:.2f} s, Spark (its client's imports, the session, the first job) {spark:.2f} s"
            )
    finally:
        subprocess.run([*streamdi, "spark", "stop"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    app()
