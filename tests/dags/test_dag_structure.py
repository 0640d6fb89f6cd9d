"""Every DAG imports without errors and has exactly the expected tasks, dependencies, schedule and parameters."""

from __future__ import annotations

import pytest

from streamdi.run import orchestration

STEPS = {f"transform.{name}" for name in ("T0", "T1", "T2", "T3", "T4", "AG", "DM")}
STEP_EDGES = {
    ("transform.T0", "transform.T1"),
    ("transform.T0", "transform.T2"),
    ("transform.T1", "transform.T3"),
    ("transform.T2", "transform.T3"),
    ("transform.T1", "transform.T4"),
    ("transform.T2", "transform.T4"),
    ("transform.T3", "transform.AG"),
    ("transform.T4", "transform.AG"),
    ("transform.AG", "transform.DM"),
}
EXPECTED_EDGES = {
    "streamdi_setup": {
        ("create_objects", "deliver_reference_data"),
        ("deliver_reference_data", "collect"),
        ("collect", "load_reference_data"),
        ("collect", "validate"),
        ("load_reference_data", "validate"),
    },
    "streamdi_historical_load": {
        ("deliver", "collect"),
        ("collect", "stage"),
        ("collect", "validate"),
        ("collect", "migrate"),
        ("stage", "validate"),
        ("validate", "transform.T0"),
        ("transform.DM", "migrate"),
        ("migrate", "audit"),
        *STEP_EDGES,
    },
    "streamdi_incremental": {
        ("collect", "stage"),
        ("collect", "migrate"),
        ("stage", "transform.T0"),
        ("transform.DM", "migrate"),
        *STEP_EDGES,
    },
    "streamdi_migrate": set(),
    "streamdi_quality_report": set(),
    "streamdi_stream": set(),
}
EXPECTED_TASKS = {
    "streamdi_setup": {"create_objects", "deliver_reference_data", "collect", "load_reference_data", "validate"},
    "streamdi_historical_load": {"deliver", "collect", "stage", "validate", *STEPS, "migrate", "audit"},
    "streamdi_incremental": {"collect", "stage", *STEPS, "migrate"},
    "streamdi_migrate": {"migrate"},
    "streamdi_quality_report": {"write_report"},
    "streamdi_stream": {"supervise"},
}


def edges(dag) -> set[tuple[str, str]]:
    return {(t.task_id, down) for t in dag.tasks for down in t.downstream_task_ids}


def test_every_dag_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == sorted(EXPECTED_TASKS)


@pytest.mark.parametrize("dag_id", sorted(EXPECTED_TASKS))
def test_tasks_and_dependencies(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert {t.task_id for t in dag.tasks} == EXPECTED_TASKS[dag_id]
    assert edges(dag) == EXPECTED_EDGES[dag_id]
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert "streamdi" in dag.tags
    assert dag.doc_md and orchestration.REPORT_URL_PATH in dag.doc_md
    for t in dag.tasks:
        assert t.retries == 2, t.task_id
        assert t.execution_timeout is not None, t.task_id


def test_schedules(dagbag):
    from airflow.sdk.definitions.timetables.simple import NullTimetable

    assert isinstance(dagbag.dags["streamdi_setup"].timetable, NullTimetable)
    assert isinstance(dagbag.dags["streamdi_historical_load"].timetable, NullTimetable)
    assert dagbag.dags["streamdi_incremental"].timetable.expression == "* * * * *"
    assert dagbag.dags["streamdi_migrate"].timetable.expression == "*/5 * * * *"
    assert dagbag.dags["streamdi_stream"].timetable.expression == "*/5 * * * *"
    assert dagbag.dags["streamdi_stream"].is_paused_upon_creation is True  # never beside streamdi_incremental
    report = dagbag.dags["streamdi_quality_report"].timetable.asset_condition
    assert {a.uri for a in report.objects} == {"streamdi://warehouse/delta", "streamdi://warehouse/postgres"}


def test_assets_are_outlets_of_the_committing_tasks(dagbag):
    def outlets(dag_id: str, task_id: str) -> set[str]:
        return {a.uri for a in dagbag.dags[dag_id].get_task(task_id).outlets}

    delta, pg = "streamdi://warehouse/delta", "streamdi://warehouse/postgres"
    for dag_id in ("streamdi_historical_load", "streamdi_incremental"):
        assert outlets(dag_id, "transform.DM") == {delta}  # the step that marks the transform done
        for step in STEPS - {"transform.DM"}:
            assert outlets(dag_id, step) == set(), (dag_id, step)
        assert outlets(dag_id, "migrate") == {pg}
        assert outlets(dag_id, "stage") == set()
    assert outlets("streamdi_migrate", "migrate") == {pg}
    assert outlets("streamdi_setup", "load_reference_data") == {delta, pg}


def test_audit_runs_when_migration_is_skipped(dagbag):
    audit = dagbag.dags["streamdi_historical_load"].get_task("audit")
    assert audit.trigger_rule == "none_failed"


def test_ui_parameters_are_validated_and_described(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    params = dagbag.dags["streamdi_historical_load"].params
    assert set(params) == {"data_dir", "batch", "scale_factor", "migration_mode"}
    for name in params:
        assert params.get_param(name).description, name
    # the trigger form's defaults are valid as they are: an empty data directory is null, not "required"
    assert params.validate() == {"data_dir": None, "batch": 1, "scale_factor": 0.01, "migration_mode": "push"}
    assert params.get_param("data_dir").resolve("/data/tpcdi") == "/data/tpcdi"
    for name, bad in (("batch", 0), ("batch", "one"), ("migration_mode", "pull"), ("scale_factor", 0)):
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(bad)
    assert params.get_param("batch").resolve(3) == 3
    setup = dagbag.dags["streamdi_setup"].params
    assert set(setup) == {"data_dir", "scale_factor", "migration_mode"}
    assert setup.validate() == {"data_dir": None, "scale_factor": 0.01, "migration_mode": "push"}
    assert set(dagbag.dags["streamdi_incremental"].params) == {"migration_mode"}


@pytest.mark.parametrize("dag_id", sorted(EXPECTED_TASKS))
def test_every_task_pushes_one_xcom(dagbag, dag_id):
    """A dict result is the task's `return_value`, not also one XCom per key."""
    for t in dagbag.dags[dag_id].tasks:
        assert t.multiple_outputs is False, t.task_id


def test_only_the_report_dag_starts_unpaused(dagbag):
    unpaused = {d for d in EXPECTED_TASKS if dagbag.dags[d].is_paused_upon_creation is False}
    assert unpaused == {"streamdi_quality_report"}


def test_errors_a_retry_cannot_fix_fail_the_task_at_once(dagbag):
    """FailFast (wrong input, a halted batch) becomes AirflowFailException, which Airflow does not retry; any
    other error stays as it is (retried)."""
    from airflow.sdk.exceptions import AirflowFailException

    deliver = dagbag.dags["streamdi_historical_load"].get_task("deliver")
    with pytest.raises(AirflowFailException, match="data_dir /nonexistent/tpcdi is outside the data roots"):
        deliver.python_callable(params={"data_dir": "/nonexistent/tpcdi", "batch": 1, "scale_factor": 0.01})
    with pytest.raises(TypeError):
        deliver.python_callable(params={"data_dir": 42, "batch": 1, "scale_factor": 0.01})


def test_schedule_is_configurable(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import BundleDagBag
    from dagdata import DAGS

    monkeypatch.setenv("STREAMDI_INCREMENTAL_SCHEDULE", "*/2 * * * *")
    monkeypatch.setenv("STREAMDI_MIGRATE_SCHEDULE", "0 * * * *")
    bag = BundleDagBag(dag_folder=DAGS, bundle_path=DAGS, bundle_name="dags-folder")
    assert bag.dags["streamdi_incremental"].timetable.expression == "*/2 * * * *"
    assert bag.dags["streamdi_migrate"].timetable.expression == "0 * * * *"


def test_stages_match_the_batch_log():
    from streamdi.batchlog import STAGES

    assert orchestration.STAGES == STAGES


def test_transform_tasks_match_the_transaction_graph():
    """The DAGs' step tasks (built from orchestration.TRANSFORM_GRAPH without importing the jobs) are the steps
    of jobs.transform, with the same dependencies; the DM task is last."""
    from jobs.transform import STEPS as JOB_STEPS

    assert {s.name: s.after for s in JOB_STEPS} == orchestration.TRANSFORM_GRAPH
    assert set(orchestration.TRANSFORM_STEP_DOCS) == set(orchestration.TRANSFORM_GRAPH)


def test_dag_files_hold_no_data_logic():
    """DAG files only build the graph: no Spark, SQL, delta-rs or psycopg in them."""
    from dagdata import DAGS

    for path in sorted(DAGS.glob("*.py")):
        text = path.read_text()
        for word in ("pyspark", "deltalake", "psycopg", "SELECT ", "spark.", "streamdi.run.pipeline"):
            assert word not in text, f"{path.name} contains {word!r}"
