"""The orchestration seams that need no Spark: halted batches stop processing, the airflow command's environment."""

from __future__ import annotations

import datetime as dt

import pytest

from streamdi import orchestration
from streamdi.airflow_cli import airflow_environment, ensure_login
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
