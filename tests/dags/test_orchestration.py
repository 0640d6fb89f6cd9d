"""The orchestration seams that need no Spark: halted batches stop processing, the airflow command's environment."""

from __future__ import annotations

import datetime as dt

import pytest

from streamdi.airflow_cli import airflow_environment, ensure_login
from streamdi.run import orchestration
from streamdi.settings import Settings

NOW = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def test_a_halted_batch_stops_processing_with_a_clear_message(tmp_path):
    from streamdi.batchlog import BatchLog, LandedFile
    from streamdi.lake import Lake

    settings = Settings(home=tmp_path)
    log = BatchLog(Lake(settings.lake_root))
    for name in ("a.txt", "b.txt"):
        log.register([LandedFile(name, 1, name, NOW, 1)], now=NOW)
    log.mark(1, "stage", "done", now=NOW)
    log.mark(1, "transform", orchestration.HALTED, now=NOW)
    assert orchestration.halted_steps(log) == [(1, "transform")]
    with pytest.raises(orchestration.BatchHalted, match=r"micro-batch 1 is HALTED at stage 'transform'"):
        orchestration.process_batches(None, "migrate", "push", settings)
    with pytest.raises(orchestration.BatchHalted):
        orchestration.validate_staged(None, settings)
    states = BatchLog(Lake(settings.lake_root)).states()  # nothing ran: no stage of either batch was marked done
    assert states == {(1, "stage"): "done", (1, "transform"): orchestration.HALTED}


def test_a_step_that_halts_its_batch_fails_the_task_right_there(tmp_path, monkeypatch):
    """process_batches raises as soon as a step returns `halted`, also when it was the last step asked for (the
    stage task of a load DAG must fail, not succeed); the message names the batch, the step, the reason and both
    operator commands."""
    from streamdi.batchlog import BatchLog, LandedFile
    from streamdi.lake import Lake
    from streamdi.run import pipeline

    settings = Settings(home=tmp_path)
    log = BatchLog(Lake(settings.lake_root))
    for name in ("a.txt", "b.txt"):
        log.register([LandedFile(name, 1, name, NOW, 1)], now=NOW)
    ran: list[tuple[int, str]] = []
    reason = "staging.taxrate: check rate_is_a_fraction (expect_column_values_to_be_between) failed on 1 of 8 rows"

    def stage_that_halts(ctx, batch_id: int) -> dict:  # what stage_job does when a halt check fails
        ran.append((batch_id, "stage"))
        BatchLog(ctx.lake).halt(batch_id, "stage", reason, now=NOW)
        return {"halted": reason}

    monkeypatch.setitem(pipeline.STAGE_JOBS, "stage", stage_that_halts)
    with pytest.raises(orchestration.BatchHalted) as raised:
        orchestration.process_batches(1, "stage", "push", settings)
    message = str(raised.value)
    assert message.startswith(f"micro-batch 1 is HALTED at stage 'stage' by a data-quality policy: {reason}.")
    assert "`streamdi batch resume 1`" in message and "`streamdi batch skip 1 --reason TEXT`" in message
    assert ran == [(1, "stage")]
    with pytest.raises(orchestration.BatchHalted, match="micro-batch 1 is HALTED"):  # batch 2 waits behind it
        orchestration.process_batches(2, "stage", "push", settings)
    assert ran == [(1, "stage")]


def test_airflow_environment(tmp_path):
    settings = Settings(home=tmp_path / "home")
    env = airflow_environment(settings, 8123, base={"AIRFLOW__CORE__PARALLELISM": "5", "PATH": "/usr/bin"})
    home = tmp_path / "home" / "airflow"
    assert env["AIRFLOW_HOME"] == str(home)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home / 'airflow.db'}"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__PORT"] == "8123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8123/execution/"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"].endswith("/dags")
    assert env["AIRFLOW__CORE__PARALLELISM"] == "5"  # what the environment sets wins
    assert env["STREAMDI_HOME"] == str((tmp_path / "home").absolute())
    password = ensure_login(home)
    assert len(password) >= 12 and ensure_login(home) == password


def test_the_plugin_serves_the_quality_report_and_its_data_docs_to_logged_in_users(tmp_path, monkeypatch):
    """The menu entry (REPORT_URL_PATH) and a link into a sub-folder of data_docs are served by the plugin to a
    logged-in user; without a valid token the plugin sends to Airflow's login page; nothing outside reports/.
    (Here Airflow's `get_user` dependency is replaced by a user; the browser test logs in for real.)"""
    import importlib.util

    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.core_api.security import get_user
    from dagdata import DAGS
    from fastapi.testclient import TestClient

    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    init_auth_manager()
    spec = importlib.util.spec_from_file_location(
        "streamdi_reports_under_test", DAGS / "plugins" / "streamdi_reports.py"
    )
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)  # writes the placeholders under the (new) STREAMDI_HOME
    page = tmp_path / "reports" / "quality" / "data_docs" / "validations" / "staging" / "trade" / "batch-1" / "p.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>a GX page</html>")
    (tmp_path / "secret.txt").write_text("not a report")
    client = TestClient(plugin.app)
    assert orchestration.REPORT_URL_PATH == "/streamdi/reports/quality/index.html"
    quality_path = orchestration.REPORT_URL_PATH.removeprefix("/streamdi")
    for cookies in ({}, {"_token": "forged"}):
        anonymous = client.get(quality_path, follow_redirects=False, cookies=cookies)
        assert anonymous.status_code == 307 and anonymous.headers["location"].startswith("/auth/login?next=")
        assert "streamdi" not in anonymous.text

    plugin.app.dependency_overrides[get_user] = lambda: "a logged-in user"
    quality = client.get(quality_path)
    assert quality.status_code == 200 and "streamdi data-quality report" in quality.text
    docs = client.get("/reports/quality/data_docs/validations/staging/trade/batch-1/p.html")
    assert docs.status_code == 200 and docs.text == "<html>a GX page</html>"
    assert client.get("/reports/quality", follow_redirects=False).headers["location"] == "quality/"
    assert client.get("/reports/%2e%2e/secret.txt").status_code == 404
    assert client.get("/", follow_redirects=False).headers["location"] == orchestration.REPORT_URL_PATH


def test_a_dag_reads_data_sets_only_inside_the_data_roots(tmp_path):
    """`data_dir` is a DAG parameter anyone who may trigger the DAG sets: a path outside the data roots, a relative
    one, or a data set with a symbolic link leading out of them is refused before anything is read or delivered."""
    home, outside = tmp_path / "home", tmp_path / "elsewhere"
    secret = outside / "Batch1" / "Date.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("not for the landing zone\n")
    data = tmp_path / "datasets" / "sf3"
    (data / "Batch1").mkdir(parents=True)
    settings = Settings(home=home, data_roots=f"{tmp_path / 'datasets'}:{home / 'more'}")
    assert settings.data_root_dirs == (home / "data", tmp_path / "datasets", home / "more")
    assert orchestration.allowed_data_dir(str(data), settings) == data
    assert orchestration.allowed_data_dir(home / "data" / "sf1", settings) == home / "data" / "sf1"
    for refused in (outside, "datasets/sf3", data / ".." / ".." / "elsewhere", tmp_path / "datasets-other"):
        with pytest.raises(orchestration.FailFast, match="is outside the data roots"):
            orchestration.allowed_data_dir(refused, settings)
    (data / "Batch1" / "Date.txt").symlink_to(secret)
    with pytest.raises(orchestration.FailFast, match="Date.txt is a symbolic link that leads outside the data roots"):
        orchestration.deliver_reference_data(data, settings)
    with pytest.raises(orchestration.FailFast, match="is outside the data roots"):
        orchestration.deliver_data_batch(outside, 1, 0.01, settings)
    assert not settings.landing_dir.exists()
