"""Browser test of the first run from the Airflow UI: `streamdi airflow` (real `airflow standalone`) on a fresh
STREAMDI_HOME, driven by headless Chromium as a user drives it, through the UI's own trigger forms:

1. log in through the UI's login form;
2. streamdi_setup: its DAG page's Trigger button and trigger form, the data directory left empty (the form's
   default: the demo data set) and the scale factor typed in (0.001, to keep the run short); the form unpauses the
   DAG (its default). Before the fix, the form refused the empty data directory ("This field is required") and its
   Trigger button stayed disabled;
3. streamdi_historical_load the same way (empty data directory, the same scale factor, batch 1): every task
   succeeds, the transaction steps transform.T0 .. transform.DM among them, shown with their durations on the run
   page;
4. streamdi_incremental (scheduled once a year here, `STREAMDI_INCREMENTAL_SCHEDULE`, see `YEARLY`): unpaused with the
   DAG page's toggle (the scheduled run that unpausing starts finds nothing new and skips what follows collect),
   then the demo data set's Batch2 is delivered into the landing zone and the trigger form starts the run that
   processes it (micro-batch 3); paused again with the toggle; those two are its only runs;
5. streamdi_quality_report (unpaused from the start, scheduled on the warehouse assets) rewrites the report after
   the loads: the report page and the batch-log page (its `batch-log` link, and the Browse menu's entries) list
   micro-batches 1..3, done in every stage; the pages are served to the logged-in browser and to a token, and send
   anyone else to the login page;
6. PostgreSQL holds the data set: DimBroker exactly the brokers (job code 314) of the generated HR.csv, DimCustomer
   a version per Customer.txt record of Batch2.

Chromium is driven through the DevTools protocol (a websocket; no extra test dependency). Screenshots are kept in
`test-artifacts/`: each filled trigger form before its Trigger click (`airflow_trigger_form_<dag>.png`), the
historical load's run page with its tasks and their durations (`airflow_historical_load_run.png`), the incremental
run (`airflow_incremental_run.png`), the report (`airflow_quality_report.png`) and the batch log
(`airflow_batch_log.png`); `airflow_ui_failure.png` shows the page at a failure.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import re
from pathlib import Path
from urllib.parse import unquote

import airflow_server
import httpx
import pytest
from chromium import Chromium, wait_for
from dagdata import REPO

from streamdi.run.orchestration import BATCH_LOG_URL_PATH, REPORT_URL_PATH, WINDOWS_URL_PATH

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = REPO / "test-artifacts"
FAILURE = ARTIFACTS / "airflow_ui_failure.png"
SETUP, LOAD, INCREMENTAL, REPORT = (
    "streamdi_setup",
    "streamdi_historical_load",
    "streamdi_incremental",
    "streamdi_quality_report",
)
SCALE = "0.001"  # typed into the form: the smallest scale factor it accepts (the default, 0.01, takes longer)
STEPS = [f"transform.{step}" for step in ("T0", "T1", "T2", "T3", "T4", "AG", "DM")]
# streamdi_incremental's schedule here: once a year, so that its runs are exactly the ones the test expects. Unpausing
# a DAG makes the scheduler start a run for the schedule's latest point at once (catchup=False), and that run comes
# before a manual run queued with it; with the default, every minute, more would follow, and any of them could collect
# Batch2 instead of the run the trigger form starts.
YEARLY = "0 0 1 1 *"


@pytest.fixture
def airflow(tmp_path: Path):
    """`streamdi airflow` on a free port with its own STREAMDI_HOME (`airflow_server`): the tasks run with their
    defaults, as for a user (Spark on the home's embedded Spark Connect server)."""
    server = airflow_server.start(
        tmp_path / "home", tmp_path / "airflow.log", {"STREAMDI_INCREMENTAL_SCHEDULE": YEARLY}
    )
    try:
        yield server
    finally:
        airflow_server.stop(server)


class Airflow:
    """The REST API (the UI's own backend) for what the test checks and waits for; the browser does the rest."""

    def __init__(self, server: airflow_server.AirflowServer) -> None:
        self.api = server.login()
        self.bearer = {"Authorization": self.api.headers["Authorization"]}
        self.log_path = server.log_path

    def get(self, path: str, **params) -> dict:
        response = self.api.get(path, params=params)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def dag(self, dag_id: str) -> dict:
        return self.get(f"/dags/{dag_id}")

    def runs(self, dag_id: str) -> list[dict]:
        return self.get(f"/dags/{dag_id}/dagRuns", order_by="run_after")["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")

    def tasks(self, dag_id: str, run_id: str) -> dict[str, dict]:
        listed = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in listed}

    def xcom(self, dag_id: str, run_id: str, task_id: str):
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")["value"]

    def wait_for_success(self, dag_id: str, run_id: str, timeout: float = 900) -> None:
        def finished():
            state = self.run(dag_id, run_id)["state"]
            return state if state in ("success", "failed") else None

        state = wait_for(f"{dag_id} run {run_id} to finish", finished, timeout, 3)
        states = {task: t["state"] for task, t in self.tasks(dag_id, run_id).items()}
        assert state == "success", (dag_id, states, self.log_path.read_text(errors="replace")[-3000:])


def trigger_from_form(browser: Chromium, url: str, dag_id: str, typed: dict[str, str]) -> str:
    """On `dag_id`'s page: the Trigger button, the trigger form with `typed` typed into its parameter fields (the
    others keep their defaults), a screenshot of the filled form, then the form's Trigger; returns the new run's id
    (the UI opens the run's page)."""
    browser.goto(f"{url}/dags/{dag_id}")
    browser.wait_for_selector('button[aria-label="Trigger Dag"]', 120, f"{dag_id}'s Trigger button")
    browser.click('button[aria-label="Trigger Dag"]')
    submit = "[role=dialog] [data-testid=trigger-dag-submit]"
    browser.wait_for_selector(submit, 60, f"{dag_id}'s trigger form")
    dialog = "[role=dialog][data-state=open]"
    wait_for(f"the form's title {dag_id}", lambda: f"Trigger Dag - {dag_id}" in browser.text(dialog), 30, 0.5)
    browser.wait_for_selector(f"{dialog} input[name^=element_]", 60, f"{dag_id}'s parameter fields")
    required = browser.on(dialog, "return [...e.querySelectorAll('label[data-required]')].map(l => l.innerText);")
    if browser.exists(f"{dialog} input[name=element_data_dir]"):  # left empty: the demo data set
        assert browser.on(f"{dialog} input[name=element_data_dir]", "return e.value;") == ""
        # The fix: an empty data directory is a valid value (null), so the field is not marked required ...
        assert not [label for label in required if label.startswith("Data directory")], required
    for param, value in typed.items():
        browser.fill(f"{dialog} input[name=element_{param}]", value)
    try:  # ... and the form's Trigger button is enabled, with no "This field is required"
        wait_for(
            f"{dag_id}'s Trigger button to be enabled",
            lambda: browser.on(submit, "return !e.disabled;") and "This field is required" not in browser.text(dialog),
            30,
            0.5,
        )
    except TimeoutError as e:
        raise AssertionError(f"the trigger form of {dag_id} does not accept its values (required: {required})") from e
    browser.screenshot(ARTIFACTS / f"airflow_trigger_form_{dag_id}.png")
    browser.click(submit)
    try:
        wait_for(f"{dag_id}'s new run page", lambda: f"/dags/{dag_id}/runs/" in browser.eval("location.href"), 60, 0.5)
    except TimeoutError as e:
        raise AssertionError(f"the trigger form did not start a run: {browser.text(dialog)}") from e
    return unquote(browser.eval("location.pathname").split("/runs/", 1)[1])


def set_paused(browser: Chromium, airflow: Airflow, url: str, dag_id: str, paused: bool) -> None:
    """The pause toggle of `dag_id`'s page (a Chakra UI switch: checked = active)."""
    browser.goto(f"{url}/dags/{dag_id}")
    toggle = "[data-testid=toggle-pause]"
    now = "checked" if paused else "unchecked"  # the state it shows before the click
    wait_for(
        f"{dag_id}'s pause toggle",
        lambda: browser.exists(toggle) and browser.attribute(toggle, "data-state") == now,
        120,
        0.5,
    )
    browser.click(toggle)
    wait_for(
        f"{dag_id} to be {'paused' if paused else 'active'}", lambda: airflow.dag(dag_id)["is_paused"] == paused, 30, 1
    )


def test_first_runs_from_the_ui_trigger_forms(airflow, tmp_path):
    url, user, password, home = airflow.url, airflow.user, airflow.password, airflow.home
    assert url.startswith("http://127.0.0.1:")
    FAILURE.unlink(missing_ok=True)
    rest = Airflow(airflow)
    for dag_id in (SETUP, LOAD, INCREMENTAL, REPORT):
        wait_for(f"the DAG processor to register {dag_id}", lambda d=dag_id: rest.api.get(f"/dags/{d}").is_success, 240)
    assert [rest.dag(d)["is_paused"] for d in (SETUP, LOAD, INCREMENTAL, REPORT)] == [True, True, True, False]
    data = home / "data" / f"sf{SCALE}"  # where an empty data directory generates the demo data set

    browser = Chromium(tmp_path / "chromium", height=1400)
    try:
        # 1. Log in through the UI's login form.
        browser.goto(f"{url}/")
        wait_for("the login form", lambda: browser.exists("input[name=username]"), 60, 1)
        browser.type_into("input[name=username]", user)
        browser.type_into("input[name=password]", password)
        browser.click("button[type=submit]")
        wait_for("the UI after login", lambda: "/auth/login" not in browser.eval("location.href"), 60, 1)
        browser.goto(f"{url}/dags")
        wait_for("the DAG list", lambda: SETUP in browser.text() and LOAD in browser.text(), 120, 2)

        # 2. streamdi_setup from its trigger form: empty data directory, the scale factor typed in.
        setup = trigger_from_form(browser, url, SETUP, {"scale_factor": SCALE})
        run = rest.run(SETUP, setup)
        assert run["conf"] == {"data_dir": None, "scale_factor": float(SCALE), "migration_mode": "push"}
        assert (run["run_type"], run["triggered_by"], run["triggering_user_name"]) == ("manual", "ui", user)
        # the form's "Unpause streamdi_setup on trigger" (checked): the UI sends it beside the trigger, not before
        wait_for("the form to unpause streamdi_setup", lambda: not rest.dag(SETUP)["is_paused"], 60, 1)
        rest.wait_for_success(SETUP, setup)
        assert (data / "Batch1" / "HR.csv").is_file()

        # 3. streamdi_historical_load the same way: the same demo data set, Batch1.
        load = trigger_from_form(browser, url, LOAD, {"scale_factor": SCALE})
        run = rest.run(LOAD, load)
        assert run["conf"] == {"data_dir": None, "batch": 1, "scale_factor": float(SCALE), "migration_mode": "push"}
        assert (run["run_type"], run["triggered_by"]) == ("manual", "ui")
        rest.wait_for_success(LOAD, load)
        tasks = {task: t["state"] for task, t in rest.tasks(LOAD, load).items()}
        assert tasks == {t: "success" for t in ("deliver", "collect", "stage", "validate", *STEPS, "migrate", "audit")}
        assert rest.xcom(LOAD, load, "collect")["batch_ids"] == [2]  # setup's reference files are micro-batch 1

        # Its run page lists every task with its state and duration.
        browser.goto(f"{url}/dags/{LOAD}/runs/{load}")
        wait_for("the run page's task instances", lambda: all(s in browser.text() for s in STEPS), 60, 1)
        page = browser.text()
        assert "13 Task Instances" in page and "Success" in page
        assert len(re.findall(r"\b\d\d:\d\d:\d\d\.\d{3}\b", page)) >= len(tasks)  # a duration per task (and the run's)
        browser.screenshot(ARTIFACTS / "airflow_historical_load_run.png")

        # 4. streamdi_incremental: unpaused with its toggle, its first scheduled run finds nothing new ...
        set_paused(browser, rest, url, INCREMENTAL, paused=False)
        idle = wait_for("streamdi_incremental's first scheduled run", lambda: rest.runs(INCREMENTAL), 120, 2)
        assert [r["run_type"] for r in idle] == ["scheduled"]
        rest.wait_for_success(INCREMENTAL, idle[0]["dag_run_id"])
        tasks = {task: t["state"] for task, t in rest.tasks(INCREMENTAL, idle[0]["dag_run_id"]).items()}
        assert tasks == {"collect": "success"} | {t: "skipped" for t in ("stage", *STEPS, "migrate")}

        # ... then Batch2 lands and the trigger form starts the run that processes it, as micro-batch 3.
        from streamdi.delivery import deliver_batch
        from streamdi.settings import Settings

        settings = Settings(home=home, database_url=os.environ.get("DATABASE_URL") or None)
        assert "Batch2/Customer.txt" in deliver_batch(data, 2, settings.landing_dir)
        incremental = trigger_from_form(browser, url, INCREMENTAL, {})
        run = rest.run(INCREMENTAL, incremental)
        assert (run["conf"], run["run_type"], run["triggered_by"]) == ({"migration_mode": "push"}, "manual", "ui")
        rest.wait_for_success(INCREMENTAL, incremental)
        tasks = rest.tasks(INCREMENTAL, incremental)
        assert {task: t["state"] for task, t in tasks.items()} == {
            t: "success" for t in ("collect", "stage", *STEPS, "migrate")
        }
        assert rest.xcom(INCREMENTAL, incremental, "collect")["batch_ids"] == [3]
        browser.goto(f"{url}/dags/{INCREMENTAL}/runs/{incremental}")
        wait_for("the incremental run page", lambda: "transform.DM" in browser.text(), 60, 1)
        browser.screenshot(ARTIFACTS / "airflow_incremental_run.png")
        set_paused(browser, rest, url, INCREMENTAL, paused=True)
        assert [r["dag_run_id"] for r in rest.runs(INCREMENTAL)] == [idle[0]["dag_run_id"], incremental]

        # 5. The report, rewritten by streamdi_quality_report after the incremental run's migration.
        migrated = dt.datetime.fromisoformat(tasks["migrate"]["end_date"])

        def report_after_migration():
            runs = rest.runs(REPORT)
            return [
                r for r in runs if r["state"] == "success" and dt.datetime.fromisoformat(r["start_date"]) >= migrated
            ]

        wait_for("a streamdi_quality_report run after the incremental run", report_after_migration, 600, 3)
        assert "failed" not in {r["state"] for r in rest.runs(REPORT)}

        # The Browse menu links the three pages.
        browser.goto(f"{url}/dags")
        browser.wait_for_selector("button[aria-label=Browse]", 60)
        browser.click("button[aria-label=Browse]")
        entries = {}
        for name in ("streamdi quality report", "streamdi batch log", "streamdi live windows"):
            entry = f'[role=menuitem][aria-label="{name}"]'
            browser.wait_for_selector(entry, 30, f"the Browse menu's {name!r}")
            entries[name] = browser.attribute(entry, "href")
        assert entries == {
            "streamdi quality report": REPORT_URL_PATH,
            "streamdi batch log": BATCH_LOG_URL_PATH,
            "streamdi live windows": WINDOWS_URL_PATH,
        }

        browser.goto(f"{url}{REPORT_URL_PATH}")
        wait_for("the quality report", lambda: "streamdi data-quality report" in browser.text(), 60, 1)
        assert browser.eval("document.title") == "streamdi data-quality report"
        assert browser.text("#summary").startswith("3 micro-batch(es), 3 with results")
        assert browser.eval("[...document.querySelectorAll('#grid tr[data-batch]')].map(r => r.dataset.batch)") == [
            "1",
            "2",
            "3",
        ]
        assert browser.text("#halts") == "No micro-batch is halted."
        browser.screenshot(ARTIFACTS / "airflow_quality_report.png", full_page=True)

        browser.click("a#batch-log")
        browser.wait_loaded(BATCH_LOG_URL_PATH)
        wait_for("the batch log", lambda: browser.exists("table#batches"), 60, 1)
        assert browser.eval("document.title") == "streamdi batch report"
        assert browser.text("#summary").startswith("3 micro-batch(es), 3 done in every stage")
        rows = browser.eval(
            "[...document.querySelectorAll('table#batches tbody tr')].map(r => [...r.cells].map(c => c.innerText))"
        )
        # batch, files, TPC-DI batch, arrived, then stage / transform / migrate, then seconds after arrival to each
        assert [(r[0], r[2], *r[4:7]) for r in rows] == [
            ("1", "1", "done", "done", "done"),
            ("2", "1", "done", "done", "done"),
            ("3", "2", "done", "done", "done"),
        ]
        for r in rows:
            staged, committed, visible = map(float, r[7:10])
            assert staged <= committed <= visible, r
        browser.screenshot(ARTIFACTS / "airflow_batch_log.png")

        # The live windows, plotted: a panel per sector for each plot, and the late records.
        browser.goto(f"{url}{WINDOWS_URL_PATH}")
        wait_for("the live windows page", lambda: browser.exists("#late"), 60, 1)
        assert browser.eval("document.title") == "streamdi live windows"
        panels = browser.eval("[...document.querySelectorAll('#trades_day-sector ~ .panels')].length")
        assert panels >= 1 and browser.eval("document.querySelectorAll('svg.panel').length") >= 3
        assert browser.text("#late-count").startswith("No late record")
        browser.screenshot(ARTIFACTS / "airflow_live_windows.png", full_page=True)

        # The pages are served to logged-in users only: the browser above (session cookie) and a token; anyone else
        # is sent to the login page.
        report = httpx.get(f"{url}{BATCH_LOG_URL_PATH}", headers=rest.bearer, timeout=30)
        assert report.status_code == 200 and "streamdi batch report" in report.text
        for page in (BATCH_LOG_URL_PATH, REPORT_URL_PATH, WINDOWS_URL_PATH, "/streamdi/reports/quality/data_docs/"):
            anonymous = httpx.get(f"{url}{page}", timeout=30)
            assert anonymous.status_code in (302, 307), (page, anonymous.status_code)
            assert "/auth/" in anonymous.headers["location"] and "login" in anonymous.headers["location"]
            assert "streamdi" not in anonymous.text.lower()
    except BaseException:
        browser.screenshot(FAILURE)
        raise
    finally:
        browser.close()

    # 6. The loads reached PostgreSQL: DimBroker holds exactly the brokers of the generated HR.csv (job code 314), and
    # DimCustomer a version for each Customer.txt record of Batch2.
    from streamdi.warehouse import open_warehouse

    with (data / "Batch1" / "HR.csv").open(newline="") as hr:
        brokers = sum(1 for row in csv.reader(hr) if row[5] == "314")
    customers_batch2 = sum(1 for line in (data / "Batch2" / "Customer.txt").read_bytes().splitlines() if line.strip())
    assert brokers > 0 and customers_batch2 > 0
    warehouse = open_warehouse(settings)
    counts = {
        table: warehouse.query(f"SELECT count(*) FROM dw.{table}")[1][0][0]
        for table in ("dimbroker", "dimcustomer", "dimaccount", "dimtrade")
    }
    assert counts["dimbroker"] == brokers, counts
    assert min(counts.values()) > 0, counts
    _, rows = warehouse.query("SELECT count(*) FROM dw.dimcustomer WHERE batchid = 2")
    assert rows[0][0] == customers_batch2, (rows, counts)
