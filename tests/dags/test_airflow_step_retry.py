"""A failure injected in the T3 task retries T3 alone, and the warehouse equals an uninjected load's.

Real Airflow (`streamdi airflow`: scheduler, a process per task):
streamdi_setup, then streamdi_historical_load of a generated SF 0.001 data set, with the T3 task's process killed
(SIGKILL) right after its DimTrade commit, before FactHoldings and FactCashBalances
(`STREAMDI_FAULT_AT=lake.after_commit:T3/dimtrade`, which a retry no longer reaches: its DimTrade commit is recorded
and skipped). Airflow retries the task; the other tasks run once. The reference is the same Batch1 loaded by one
`streamdi load` with Spark in the process: every warehouse table, in Delta and in PostgreSQL, holds the same rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import airflow_server
import pytest
from chromium import wait_for
from snapshots import delta_warehouse

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]

SCALE = 0.001
STEPS = [f"transform.{step}" for step in ("T0", "T1", "T2", "T3", "T4", "AG", "DM")]
HISTORICAL = ["deliver", "collect", "stage", "validate", *STEPS, "migrate", "audit"]


@pytest.fixture
def airflow(tmp_path: Path):
    server = airflow_server.start(
        tmp_path / "home",
        tmp_path / "airflow.log",
        {"STREAMDI_FAULT_AT": "lake.after_commit:T3/dimtrade", "STREAMDI_TASK_RETRY_DELAY": "1"},
    )
    try:
        yield server
    finally:
        airflow_server.stop(server)


def _postgres(home: Path) -> dict[str, list[str]]:
    from schemas.warehouse import WAREHOUSE_TABLES
    from streamdi import embedded_pg
    from streamdi.settings import Settings
    from streamdi.warehouse import open_warehouse
    from streamdi.warehouse_model import pg_qualified_name

    settings = Settings(home=home)
    warehouse = open_warehouse(settings)
    try:
        return {
            t.name: sorted(map(repr, warehouse.query(f"SELECT * FROM {pg_qualified_name(t)}")[1]))
            for t in WAREHOUSE_TABLES
        }
    finally:
        embedded_pg.stop_server(settings)


def test_a_killed_t3_task_is_retried_alone_and_the_warehouse_equals_an_uninjected_load(airflow, tmp_path):
    airflow.login()
    setup = airflow.trigger("streamdi_setup", {"data_dir": None, "scale_factor": SCALE})
    assert airflow.wait_for_run("streamdi_setup", setup) == "success", airflow.log_tail()

    run = airflow.trigger("streamdi_historical_load", {"data_dir": None, "batch": 1, "scale_factor": SCALE})
    assert airflow.wait_for_run("streamdi_historical_load", run) == "success", airflow.log_tail()
    tasks = airflow.task_instances("streamdi_historical_load", run)
    assert {t: tasks[t]["state"] for t in HISTORICAL} == dict.fromkeys(HISTORICAL, "success")
    tries = {t: tasks[t]["try_number"] for t in HISTORICAL}
    assert tries == {t: 2 if t == "transform.T3" else 1 for t in HISTORICAL}  # T3 was retried, nothing else
    assert all(tasks[t]["duration"] > 0 for t in STEPS)  # each step has its own duration in the grid

    # The reference: the same data set's Batch1 with one `streamdi load`, Spark in the process, no fault.
    reference = tmp_path / "reference"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "STREAMDI_FAULT"))}
    env.update(STREAMDI_HOME=str(reference), STREAMDI_SPARK_REMOTE="off", STREAMDI_SPARK_MASTER="local[2]")
    data = airflow.home / "data" / f"sf{SCALE:g}"
    loaded = subprocess.run(
        [sys.executable, "-m", "streamdi.run.cli", "load", "--data", str(data), "--batch", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr

    got = wait_for("Delta tables readable", lambda: delta_warehouse(airflow.home), 30, 1)
    expected = delta_warehouse(reference)
    assert set(got) == set(expected)
    assert got["dimtrade"] and got["factholdings"] and got["factcashbalances"]  # the tables T3 commits
    for table, rows in expected.items():
        assert got[table] == rows, f"{table} differs from the uninjected load"
    assert _postgres(airflow.home) == _postgres(reference)
