"""Real Airflow for the tests that need its scheduler, task processes and API server: `streamdi airflow` (`airflow
standalone` with streamdi's DAGs) on a free port and its own STREAMDI_HOME, and a REST client logged in as its user.

Its tasks run as Airflow runs them for a user: each in a process of its own, with Spark on the home's embedded Spark
Connect server (the tasks' default), which `stop` stops with the embedded PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from chromium import free_port, stop_group, wait_for


@dataclass
class AirflowServer:
    url: str
    user: str
    password: str
    home: Path
    log_path: Path
    process: subprocess.Popen
    api: httpx.Client | None = None

    def login(self) -> httpx.Client:
        """A REST client of `/api/v2` with a bearer token of the admin user, once the API server answers."""
        wait_for("the API server", lambda: httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).is_success, 180)
        token = httpx.post(
            f"{self.url}/auth/token", json={"username": self.user, "password": self.password}, timeout=30
        )
        assert token.status_code == 201, token.text
        headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
        self.api = httpx.Client(base_url=f"{self.url}/api/v2", headers=headers, timeout=30)
        return self.api

    def wait_for_dag(self, dag_id: str) -> None:
        wait_for(f"the DAG processor to register {dag_id}", lambda: self.api.get(f"/dags/{dag_id}").is_success, 240)

    def trigger(self, dag_id: str, conf: dict) -> str:
        """Unpause `dag_id` and start a run with `conf`; returns the run id."""
        self.wait_for_dag(dag_id)
        unpaused = self._unlocked(lambda: self.api.patch(f"/dags/{dag_id}", json={"is_paused": False}))
        assert unpaused.is_success, unpaused.text
        created = self._unlocked(
            lambda: self.api.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        )
        assert created.status_code == 200, created.text
        return created.json()["dag_run_id"]

    @staticmethod
    def _unlocked(call, attempts: int = 6) -> httpx.Response:
        """`call()` again while it fails with a server error: Airflow's SQLite metadata database answers a write
        with 500 after 5 s when the scheduler holds it (seen right after a run ends, as its last task is recorded);
        such a write was rolled back, so a new attempt does it once."""
        for _ in range(attempts - 1):
            response = call()
            if response.status_code < 500:
                return response
            time.sleep(2)
        return call()

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900) -> str:
        def finished():
            state = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
            return state if state in ("success", "failed") else None

        return wait_for(f"{dag_id} run {run_id} to finish", finished, timeout, 3)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        listed = self.api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        return {t["task_id"]: t for t in listed}

    def busy_runs(self) -> list[str]:
        """The DAG runs queued or running, of every DAG (e.g. the quality report an asset event triggered)."""
        listed = self.api.get("/dags/~/dagRuns", params={"state": ["queued", "running"]}).json()["dag_runs"]
        return [f"{r['dag_id']} {r['dag_run_id']}" for r in listed]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def start(home: Path, log_path: Path, extra_env: dict[str, str] | None = None) -> AirflowServer:
    """`streamdi airflow` on a free port for `home`; returns once it printed its URL and login."""
    port = free_port()
    env = {
        **os.environ,
        "STREAMDI_HOME": str(home),
        "STREAMDI_SPARK_MASTER": "local[2]",
        "STREAMDI_SPARK_SHUFFLE_PARTITIONS": "2",
        "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
    }
    # The airflow command chooses its own Airflow configuration (under STREAMDI_HOME); drop the test session's, and
    # the in-process setting of the dag.test() runs: tasks here use the embedded Spark Connect server, their default.
    for key in [k for k in env if k.startswith("AIRFLOW") or k in ("STREAMDI_SPARK_REMOTE", "STREAMDI_FAULT_AT")]:
        del env[key]
    env.update(extra_env or {})
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamdi.airflow_cli", "--port", str(port)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    banner = wait_for(
        "the URL and login banner",
        lambda: re.search(r"Airflow UI: (\S+)\s+\(login: (\S+) / (\S+)\)", log_path.read_text()),
        60,
        0.5,
    )
    return AirflowServer(banner.group(1), banner.group(2), banner.group(3), home, log_path, process)


def stop(server: AirflowServer) -> None:
    """Stop Airflow as Ctrl-C in a terminal does (SIGINT to the process group of `streamdi airflow`), then the home's
    embedded Spark Connect and PostgreSQL servers its tasks started. Airflow must have stopped cleanly: exit status 0,
    not the 137 of the kill that follows a hang (`streamdi.airflow_cli.supervise`). A user stops it once it is idle:
    first the runs still queued or running finish (an asset-triggered quality report may start as a test ends; Airflow
    waits for a running task on Ctrl-C, up to the supervisor's 60 s on a busy machine)."""
    if server.api is not None and server.process.poll() is None:
        with contextlib.suppress(TimeoutError):
            wait_for("Airflow's runs to finish", lambda: not server.busy_runs(), 300, 3)
    stop_group(server.process, 120)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["STREAMDI_HOME"] = str(server.home)
    for command in (["spark", "stop"], [] if os.environ.get("DATABASE_URL") else ["db", "stop"]):
        if command:
            subprocess.run(
                [sys.executable, "-m", "streamdi.run.cli", *command],
                env=env,
                timeout=120,
                check=False,
                capture_output=True,
            )
    assert server.process.returncode == 0, f"Airflow did not stop cleanly on Ctrl-C: {server.log_tail()}"
