"""`dag.test()` runs of the real DAGs on real Spark, Delta and PostgreSQL (embedded), at a tiny scale.

One STREAMDI_HOME for the module, used in order: streamdi_setup loads the reference sample, then
streamdi_historical_load loads the rest of Batch1 (HR.csv: 3 brokers), then streamdi_incremental picks up Batch2
dripped as two pieces, one per run. Expected rows are the known figures of the tiny data set, and every other
table is compared with its row count read directly from the Delta log (delta-rs), not through streamdi.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from dagdata import BROKERS, CUSTOMER_IDS

from schemas.warehouse import WAREHOUSE_TABLES
from streamdi.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEP_TASKS = [f"transform.{step}" for step in ("T0", "T1", "T2", "T3", "T4", "AG", "DM")]
INCREMENTAL_TASKS = ["collect", "stage", *STEP_TASKS, "migrate"]

# Known figures of the bundled reference sample (streamdi/sample/Batch1).
REFERENCE_ROWS = {"dimdate": 14, "dimtime": 120, "industry": 12, "statustype": 6, "taxrate": 8, "tradetype": 5}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, airflow_db):
    home = tmp_path_factory.mktemp("dags-home")
    env = {
        "STREAMDI_HOME": str(home),
        "STREAMDI_SPARK_MASTER": "local[2]",
        "STREAMDI_SPARK_SHUFFLE_PARTITIONS": "2",
        "STREAMDI_SPARK_DRIVER_MEMORY": "1g",
    }
    mp = pytest.MonkeyPatch()
    for key, value in env.items():
        mp.setenv(key, value)
    yield home
    mp.undo()
    if not os.environ.get("DATABASE_URL"):
        from streamdi import embedded_pg

        try:
            embedded_pg.stop_server(Settings(home=home))
        except RuntimeError as exc:  # cleanup only; the tests' assertions are made by then
            print(f"could not stop the embedded PostgreSQL server: {exc}")


def settings_for(home: Path) -> Settings:
    return Settings(home=home, database_url=os.environ.get("DATABASE_URL") or None)


def pg_counts(home: Path) -> dict[str, int]:
    from streamdi.warehouse import open_warehouse

    _, rows = open_warehouse(settings_for(home)).query(
        " UNION ALL ".join(f"SELECT '{t.name}', count(*) FROM dw.{t.name}" for t in WAREHOUSE_TABLES)
    )
    return dict(rows)


def delta_counts(home: Path) -> dict[str, int]:
    """Row counts straight from each Delta table's log (0 for a table not created yet)."""
    from deltalake import DeltaTable

    from streamdi.lake import Lake

    lake = Lake(settings_for(home).lake_root)
    return {
        t.name: DeltaTable(str(lake.path(t))).to_pyarrow_table().num_rows if lake.exists(t) else 0
        for t in WAREHOUSE_TABLES
    }


def batch_log(home: Path) -> tuple[dict[int, list[str]], list[dict]]:
    """Files per micro-batch and the stage events (in commit order), read straight from the Delta tables."""
    from deltalake import DeltaTable

    lake = settings_for(home).lake_root
    files: dict[int, list[str]] = {}
    for r in sorted(
        DeltaTable(str(lake / "platform" / "batch_files")).to_pyarrow_table().to_pylist(),
        key=lambda r: (r["batch_id"], r["file_seq"]),
    ):
        files.setdefault(r["batch_id"], []).append(r["file"])
    events = sorted(
        DeltaTable(str(lake / "platform" / "batch_events")).to_pyarrow_table().to_pylist(), key=lambda r: r["at"]
    )
    return files, events


def run_dag(dagbag, dag_id: str, **conf):
    dagrun = dagbag.dags[dag_id].test(run_conf=conf or None)
    states = {ti.task_id: ti.state for ti in dagrun.get_task_instances()}
    return dagrun.state, states


def test_setup_then_historical_load(dagbag, home, tiny_data):
    state, tasks = run_dag(dagbag, "streamdi_setup", data_dir=str(tiny_data))
    assert state == "success", tasks
    files, _ = batch_log(home)
    assert sorted(files) == [1]
    assert sorted(Path(f).name for f in files[1]) == sorted(
        ["BatchDate.txt", "Date.txt", "Time.txt", "Industry.txt", "StatusType.txt", "TaxRate.txt", "TradeType.txt"]
    )
    in_pg = pg_counts(home)
    assert in_pg == delta_counts(home)
    assert {k: v for k, v in in_pg.items() if v and k != "dimessages"} == REFERENCE_ROWS

    state, tasks = run_dag(dagbag, "streamdi_historical_load", data_dir=str(tiny_data), batch=1)
    assert state == "success", tasks
    assert set(tasks.values()) == {"success"}
    files, _ = batch_log(home)
    assert sorted(files) == [1, 2]
    assert [Path(f).name for f in files[2]] == ["HR.csv"]  # the reference files were not registered twice
    in_pg, in_delta = pg_counts(home), delta_counts(home)
    assert in_pg == in_delta
    expected = {t.name: 0 for t in WAREHOUSE_TABLES} | REFERENCE_ROWS | {"dimbroker": BROKERS}
    assert {k: v for k, v in in_pg.items() if k != "dimessages"} == {
        k: v for k, v in expected.items() if k != "dimessages"
    }
    assert in_pg["dimessages"] > 0
    audit = (home / "reports" / "audit.txt").read_text()
    assert "DimBroker" in audit


def test_incremental_processes_drip_files_in_order(dagbag, home, tiny_data, tmp_path):
    from streamdi.generator.drip import DripOptions, plan

    assert sorted(batch_log(home)[0]) == [1, 2], "needs the setup and historical load of the test before"
    deliveries, contents = plan(tiny_data / "Batch2", DripOptions(parts=2))
    pieces = [[d.file for d in deliveries if d.part == part] for part in (0, 1)]
    assert pieces == [["BatchDate_batch2_0000.txt", "Customer_batch2_0000.txt"], ["Customer_batch2_0001.txt"]]
    landing = settings_for(home).landing_dir
    customers_after = []
    for piece in pieces:
        for name in piece:
            (landing / name).parent.mkdir(parents=True, exist_ok=True)
            (landing / name).write_bytes(contents[name])
        state, tasks = run_dag(dagbag, "streamdi_incremental")
        assert state == "success", tasks
        assert tasks == dict.fromkeys(INCREMENTAL_TASKS, "success")
        customers_after.append(pg_counts(home)["dimcustomer"])

    files, events = batch_log(home)
    assert sorted(files) == [1, 2, 3, 4]
    assert [[Path(f).name for f in files[b]] for b in (3, 4)] == pieces
    # every stage of micro-batch 3 finished before any stage of micro-batch 4 began, in stage order
    done = [(e["batch_id"], e["stage"]) for e in events if e["state"] == "done" and e["batch_id"] >= 3]
    assert done == [(3, "stage"), (3, "transform"), (3, "migrate"), (4, "stage"), (4, "transform"), (4, "migrate")]
    assert customers_after == [2, len(CUSTOMER_IDS)]
    assert pg_counts(home) == delta_counts(home)

    # a third run with nothing new skips the processing (no asset event) and still succeeds
    state, tasks = run_dag(dagbag, "streamdi_incremental")
    assert state == "success" and tasks == {"collect": "success"} | dict.fromkeys(INCREMENTAL_TASKS[1:], "skipped")


def test_quality_report_renders_the_batch_log(dagbag, home):
    state, tasks = run_dag(dagbag, "streamdi_quality_report")
    assert state == "success", tasks
    page = (home / "reports" / "index.html").read_text()
    assert "4 micro-batch(es), 4 done in every stage" in page
    assert page.count("<tr><td>") == 4
    quality = (home / "reports" / "quality" / "index.html").read_text()  # the page REPORT_URL_PATH serves
    assert "streamdi data-quality report" in quality and "No micro-batch is halted." in quality
    assert quality.count('<tr class="" data-batch=') == 4
    assert (home / "reports" / "quality" / "data_docs" / "index.html").is_file()


def done_events(home: Path, batch_id: int, stage: str) -> list[dict]:
    return [e for e in batch_log(home)[1] if e["batch_id"] == batch_id and e["stage"] == stage and e["state"] == "done"]


def test_stream_dag_starts_checks_and_stops_the_service(dagbag, home):
    """streamdi_stream's supervise task starts a real `streamdi stream` (a process of its own that outlives the task),
    which then runs a file that lands (a piece delivered a second time under a new name: a duplicate, not staged);
    `check` reports it; `stop` ends the service."""
    from streamdi.run.stream_status import read_status

    assert sorted(batch_log(home)[0]) == [1, 2, 3, 4], "needs the runs of the tests before"
    before = pg_counts(home)
    state, tasks = run_dag(dagbag, "streamdi_stream", action="ensure")
    try:
        assert state == "success", tasks
        status, running = read_status(settings_for(home))
        assert running and status["state"] in ("idle", "waiting", "processing")
        landing = settings_for(home).landing_dir
        (landing / "Customer_batch2_0001_again.txt").write_bytes((landing / "Customer_batch2_0001.txt").read_bytes())
        deadline = time.monotonic() + 300
        while not done_events(home, 5, "migrate"):
            assert time.monotonic() < deadline, read_status(settings_for(home))
            time.sleep(0.5)
        assert json.loads(done_events(home, 5, "stage")[0]["detail"])["duplicates"] == {
            "Customer_batch2_0001_again.txt": "Customer_batch2_0001.txt"
        }
        state, tasks = run_dag(dagbag, "streamdi_stream", action="check")
        assert state == "success", tasks
        status, running = read_status(settings_for(home))
        assert running and status["last_batch"] == 5 and status["batches_done"] == 1
    finally:
        state, tasks = run_dag(dagbag, "streamdi_stream", action="stop")
    assert state == "success", tasks
    assert read_status(settings_for(home))[1] is False
    assert pg_counts(home) == before
    # with the service stopped, `check` fails at once and says how to start it
    state, tasks = run_dag(dagbag, "streamdi_stream", action="check")
    assert state == "failed" and tasks == {"supervise": "failed"}
