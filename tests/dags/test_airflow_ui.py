"""Browser test: `streamdi airflow` (real `airflow standalone`), headless Chromium logs in through the UI, the REST
API triggers streamdi_historical_load with parameters, and the UI shows the run's success; the report pages are
served to the logged-in browser and to a token, and send anyone else to the login page.

Chromium is driven through the DevTools protocol (a websocket; no extra test dependency). The screenshot of the
finished run is kept as `test-artifacts/airflow_historical_load_run.png`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from chromium import Chromium, free_port, stop_group, wait_for
from dagdata import BROKERS, REPO

from streamdi.orchestration import REPORT_URL_PATH

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = REPO / "test-artifacts"
DAG_ID = "streamdi_historical_load"


@pytest.fixture
def airflow(tmp_path: Path):
    """`streamdi airflow` on a free port with its own STREAMDI_HOME; yields (url, user, password, home, log)."""
    home = tmp_path / "home"
    port = free_port()
    log_path = tmp_path / "airflow.log"
    env = {
        **os.environ,
        "STREAMDI_HOME": str(home),
        "STREAMDI_SPARK_MASTER": "local[2]",
        "STREAMDI_SPARK_SHUFFLE_PARTITIONS": "2",
        "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
    }
    # The airflow command chooses its own Airflow configuration (under STREAMDI_HOME); drop the test session's.
    for key in [k for k in env if k.startswith("AIRFLOW")]:
        del env[key]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamdi.airflow_cli", "--port", str(port)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        banner = wait_for(
            "the URL and login banner",
            lambda: re.search(r"Airflow UI: (\S+)\s+\(login: (\S+) / (\S+)\)", log_path.read_text()),
            60,
            0.5,
        )
        yield banner.group(1), banner.group(2), banner.group(3), home, log_path
    finally:
        stop_group(proc)
        if not os.environ.get("DATABASE_URL"):
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from streamdi import embedded_pg as e; from streamdi.settings import "
                    f"Settings; e.stop_server(Settings(home={str(home)!r}))",
                ],
                env=env,
                timeout=120,
                check=False,
            )


def test_trigger_historical_load_from_the_ui(airflow, tiny_data, tmp_path):
    url, user, password, home, log_path = airflow
    assert url.startswith("http://127.0.0.1:")
    wait_for("the API server", lambda: httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200, 180)

    token = httpx.post(f"{url}/auth/token", json={"username": user, "password": password}, timeout=30)
    assert token.status_code == 201, token.text
    api = httpx.Client(base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token.json()['access_token']}"})
    wait_for("the DAG processor to register the DAG", lambda: api.get(f"/dags/{DAG_ID}").status_code == 200, 240)

    browser = Chromium(tmp_path / "chromium")
    try:
        # Log in through the UI's login form.
        browser.goto(f"{url}/")
        wait_for("the login form", lambda: browser.eval("!!document.querySelector('input[name=username]')"), 60, 1)
        browser.type_into("input[name=username]", user)
        browser.type_into("input[name=password]", password)
        browser.eval("document.querySelector('button[type=submit]').click()")
        wait_for("the UI after login", lambda: "/auth/login" not in browser.eval("location.href"), 60, 1)
        browser.goto(f"{url}/dags")
        wait_for("the DAG list", lambda: DAG_ID in browser.text(), 120, 2)

        # Trigger the run with parameters through the REST API (the UI's own backend).
        assert api.patch(f"/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
        conf = {"data_dir": str(tiny_data), "batch": 1, "migration_mode": "push"}
        created = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
        assert created.status_code == 200, created.text
        run_id = created.json()["dag_run_id"]
        assert created.json()["conf"] == conf

        def finished():
            state = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
            return state if state in ("success", "failed") else None

        state = wait_for("the historical load to finish", finished, 900, 5)
        tasks = {
            t["task_id"]: t["state"]
            for t in api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        }
        assert state == "success", (tasks, log_path.read_text()[-3000:])
        steps = [f"transform.{step}" for step in ("T0", "T1", "T2", "T3", "T4", "DM")]
        assert tasks == {t: "success" for t in ("deliver", "collect", "stage", "validate", *steps, "migrate", "audit")}

        # The run's page in the UI shows it finished successfully.
        browser.goto(f"{url}/dags/{DAG_ID}/runs/{run_id}")
        wait_for("the run page to show its state", lambda: "success" in browser.text().lower(), 60, 2)
        page = browser.text()
        assert run_id in page or DAG_ID in page
        browser.screenshot(ARTIFACTS / "airflow_historical_load_run.png")
        assert (ARTIFACTS / "airflow_historical_load_run.png").stat().st_size > 10_000

        # The quality report is linked from the UI and served by it, to logged-in users only: the browser (session
        # cookie) and an API client with a token get the pages; anyone else is sent to the login page.
        browser.goto(f"{url}{REPORT_URL_PATH}")  # the menu entry: served from reports/quality/
        wait_for("the quality report", lambda: "streamdi data-quality report" in browser.text(), 60, 1)
        bearer = {"Authorization": api.headers["Authorization"]}
        report = httpx.get(f"{url}/streamdi/reports/index.html", headers=bearer, timeout=30)
        assert report.status_code == 200 and "streamdi batch report" in report.text
        for page in ("/streamdi/reports/index.html", REPORT_URL_PATH, "/streamdi/reports/quality/data_docs/"):
            anonymous = httpx.get(f"{url}{page}", timeout=30)
            assert anonymous.status_code in (302, 307), (page, anonymous.status_code)
            assert "/auth/" in anonymous.headers["location"] and "login" in anonymous.headers["location"]
            assert "streamdi" not in anonymous.text.lower()
    except BaseException:
        browser.screenshot(ARTIFACTS / "airflow_ui_failure.png")
        raise
    finally:
        browser.close()

    # The load reached PostgreSQL: DimBroker holds exactly the 3 brokers of the tiny HR.csv.
    from streamdi.settings import Settings
    from streamdi.warehouse import open_warehouse

    _, rows = open_warehouse(Settings(home=home, database_url=os.environ.get("DATABASE_URL") or None)).query(
        "SELECT count(*) FROM dw.dimbroker"
    )
    assert rows[0][0] == BROKERS
