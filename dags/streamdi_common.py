"""What every streamdi DAG shares: the two warehouse assets, default task arguments, UI parameters and doc links.

Not a DAG file (listed in `.airflowignore`); the DAG files import it. It builds no data logic: tasks call
`streamdi.run.orchestration`, which calls the pipeline's job functions.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable

from airflow.sdk import Asset, Param, TaskGroup, task
from airflow.sdk.exceptions import AirflowFailException

from streamdi.run import orchestration
from streamdi.run.orchestration import MIGRATION_MODES, REPORT_URL_PATH, TRANSFORM_GRAPH, TRANSFORM_STEP_DOCS, FailFast

# The Delta warehouse (every warehouse table in the lake) and the PostgreSQL warehouse (schema dw). Tasks that
# commit to them declare them as outlets, so a DAG can be scheduled on "the warehouse changed".
DELTA_WAREHOUSE = Asset(name="streamdi_delta_warehouse", uri="streamdi://warehouse/delta", group="streamdi")
POSTGRES_WAREHOUSE = Asset(name="streamdi_postgres_warehouse", uri="streamdi://warehouse/postgres", group="streamdi")

START_DATE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
TAGS = ["streamdi"]

# Every job is exactly-once (app transactions in Delta, a ledger in PostgreSQL), so a retry after a crash redoes
# only what did not commit.
DEFAULT_ARGS = {
    "owner": "streamdi",
    "retries": 2,
    "retry_delay": dt.timedelta(seconds=float(orchestration.dag_setting("STREAMDI_TASK_RETRY_DELAY"))),
    "execution_timeout": dt.timedelta(hours=2),
}
SHORT = dt.timedelta(minutes=10)  # execution_timeout of tasks that start neither Spark nor a load

REPORT_LINK = f"[quality report]({REPORT_URL_PATH}) (also in the menu: *Browse → streamdi quality report*)"


def streamdi_task(**kwargs) -> Callable:
    """`@task` for streamdi's job functions: its result is one XCom (`return_value`; a dict result is not also
    split into one XCom per key), and an error retrying cannot fix (`orchestration.FailFast`: wrong input, a
    halted batch) fails the task at once instead of after its retries, with the message that says what to do."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def run(*args, **kw):
            try:
                return function(*args, **kw)
            except FailFast as e:
                raise AirflowFailException(str(e)) from e

        return task(multiple_outputs=False, **kwargs)(run)

    return decorate


def migration_mode_param(default: str = "push") -> Param:
    return Param(
        default,
        type="string",
        enum=list(MIGRATION_MODES),
        title="Migration mode",
        description="push: migrate each batch to PostgreSQL in this run, right after its transform. "
        "none: leave PostgreSQL to the streamdi_migrate DAG (for deployments that decouple migration).",
    )


def data_dir_param(description: str) -> Param:
    """May stay empty (null): the form's Trigger button accepts it. `description` is Markdown (the form renders
    `description_md`; `description`, plain text, keeps it without backticks for the API)."""
    return Param(
        None,
        type=["null", "string"],
        title="Data directory",
        description=description.replace("`", ""),
        description_md=description,
    )


def batch_param() -> Param:
    return Param(
        1,
        type="integer",
        minimum=1,
        title="Batch to load",
        description="The TPC-DI batch folder of the data directory to deliver (1 = historical load, 2.. incremental). "
        "This is the TPC-DI batch, not streamdi's micro-batch number: micro-batches count every collection, so after "
        "streamdi_setup (whose reference files are micro-batch 1) Batch1 becomes micro-batch 2.",
    )


def scale_factor_param() -> Param:
    return Param(
        0.01,
        type="number",
        minimum=0.001,
        maximum=100,
        title="Scale factor (demo)",
        description="Only used when the data directory is empty: a TPC-DI data set of this scale factor is generated "
        "into <STREAMDI_HOME>/data/sf<SCALE> (once) and loaded. Use the same one in streamdi_setup and the loads.",
    )


def transform_group() -> TaskGroup:
    """The transform of the newest micro-batch (`collect`'s XCom `last_batch`) as one task per transaction step
    (task group `transform`: T0 → T1 ‖ T2 → T3 ‖ T4 → DM, `orchestration.TRANSFORM_GRAPH`), each with its own
    state, duration, log, retries and XCom. The batch log and the steps' app transactions decide what is left, so
    a retried or cleared step redoes only what it did not commit; DM marks the transform done and updates the
    Delta warehouse asset. The steps read `collect`'s XCom themselves, so the graph shows only their order."""
    last = list(TRANSFORM_GRAPH)[-1]

    @streamdi_task()
    def step(params: dict | None = None, ti=None) -> dict:
        group_id, _, name = ti.task_id.rpartition(".")
        last_batch = ti.xcom_pull(task_ids="collect")["last_batch"]
        earlier = []
        if name == last:  # DM records every step's result in the batch log with the transform's state
            earlier = ti.xcom_pull(task_ids=[f"{group_id}.{s}" for s in TRANSFORM_GRAPH if s != last]) or []
        return orchestration.transform_step(last_batch, name, params["migration_mode"], earlier=earlier)

    with TaskGroup(group_id="transform", tooltip="the micro-batch's transaction steps, in dependency order") as group:
        tasks = {
            name: step.override(
                task_id=name, doc_md=TRANSFORM_STEP_DOCS[name], outlets=[DELTA_WAREHOUSE] if name == last else []
            )()
            for name in TRANSFORM_GRAPH
        }
        for name, after in TRANSFORM_GRAPH.items():
            for before in after:
                tasks[before] >> tasks[name]
    return group
