"""The first run from the UI with the trigger forms' defaults: streamdi_setup and then streamdi_historical_load,
both with an empty data directory, on a fresh STREAMDI_HOME (`dag.test()`, real Spark, Delta and PostgreSQL).

Both DAGs then use the same demo data set, generated once into `<STREAMDI_HOME>/data/sf<scale_factor>`: setup
lands its reference files, the historical load the rest of its Batch1 (before, setup landed the bundled sample
and the load failed in `deliver` on a BatchDate.txt of other content, and was retried twice)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_dag_runs import batch_log, delta_counts, pg_counts, run_dag

from streamdi.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCALE = 0.001  # the smallest scale factor the form accepts
REFERENCE = ["BatchDate.txt", "Date.txt", "Industry.txt", "StatusType.txt", "TaxRate.txt", "Time.txt", "TradeType.txt"]


@pytest.fixture
def fresh_home(tmp_path: Path, airflow_db, monkeypatch):
    home = tmp_path / "home"
    for key, value in {
        "STREAMDI_HOME": str(home),
        "STREAMDI_SPARK_MASTER": "local[2]",
        "STREAMDI_SPARK_SHUFFLE_PARTITIONS": "2",
        "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
    }.items():
        monkeypatch.setenv(key, value)
    yield home
    if not os.environ.get("DATABASE_URL"):
        from streamdi import embedded_pg

        try:
            embedded_pg.stop_server(Settings(home=home))
        except RuntimeError as exc:  # cleanup only
            print(f"could not stop the embedded PostgreSQL server: {exc}")


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_bytes().splitlines() if line.strip())


def test_setup_then_historical_load_with_the_form_defaults(dagbag, fresh_home):
    state, tasks = run_dag(dagbag, "streamdi_setup", scale_factor=SCALE)  # data_dir: the form's empty default
    assert state == "success", tasks
    data = fresh_home / "data" / f"sf{SCALE:g}"
    assert sorted(p.name for p in (data / "Batch1").iterdir() if p.name in REFERENCE) == REFERENCE

    state, tasks = run_dag(dagbag, "streamdi_historical_load", scale_factor=SCALE)
    assert state == "success", tasks
    assert set(tasks.values()) == {"success"}, tasks
    files, _ = batch_log(fresh_home)
    assert sorted(files) == [1, 2]
    assert sorted(Path(f).name for f in files[1]) == REFERENCE
    assert not {Path(f).name for f in files[2]} & set(REFERENCE)  # landed once, with the same bytes
    assert "Batch1/CustomerMgmt.xml" in files[2]
    in_pg = pg_counts(fresh_home)
    assert in_pg == delta_counts(fresh_home)
    assert in_pg["dimdate"] == _lines(data / "Batch1" / "Date.txt")
    assert in_pg["dimtime"] == _lines(data / "Batch1" / "Time.txt") == 86400


def test_a_missing_data_directory_fails_deliver_without_retries(dagbag, fresh_home):
    state, tasks = run_dag(dagbag, "streamdi_historical_load", data_dir=str(fresh_home / "data" / "no-such-data"))
    assert state == "failed"
    assert tasks["deliver"] == "failed"  # not up_for_retry: AirflowFailException
