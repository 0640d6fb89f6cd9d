"""streamdi_incremental: on a schedule, collect new landing files into micro-batches and process every pending one."""

from __future__ import annotations

from airflow.sdk import DAG
from streamdi_common import (
    DEFAULT_ARGS,
    POSTGRES_WAREHOUSE,
    REPORT_LINK,
    SHORT,
    START_DATE,
    TAGS,
    migration_mode_param,
    streamdi_task,
    transform_group,
)

from streamdi.run import orchestration

SCHEDULE = orchestration.dag_setting("STREAMDI_INCREMENTAL_SCHEDULE")

with DAG(
    dag_id="streamdi_incremental",
    description="Collect new landing files into micro-batches and process every pending batch in order",
    schedule=SCHEDULE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "incremental"],
    params={"migration_mode": migration_mode_param()},
    doc_md=f"""
### streamdi incremental micro-batches
Runs on `{SCHEDULE}` (environment variable `STREAMDI_INCREMENTAL_SCHEDULE`, a cron expression; unpause the DAG
to start it). One run at a time (`max_active_runs=1`): **collect** registers the files that landed since the
last run as new micro-batches; **stage** runs every pending batch of the batch log before the newest, oldest
first and whole, then stages the newest; the **transform** group runs its transaction steps as tasks
(T0 → T1 ‖ T2 → T3 ‖ T4 → DM); **migrate** makes it visible in PostgreSQL (`migration_mode=push`; with `none` the
**streamdi_migrate** DAG migrates).

A run with nothing new shows *stage* and the tasks after it as skipped (no asset event). A **halted** batch fails
the task that meets it with a log line naming the batch; nothing after it runs until an operator resolves it.
Batch states: {REPORT_LINK}.
""",
) as dag:

    @streamdi_task(execution_timeout=SHORT)
    def collect() -> dict:
        return orchestration.collect_landed()

    @streamdi_task()
    def stage(collected: dict, params: dict | None = None) -> dict:
        return orchestration.process_batches(
            collected["last_batch"], "stage", params["migration_mode"], skip_when_idle=True
        )

    @streamdi_task(outlets=[POSTGRES_WAREHOUSE])
    def migrate(collected: dict, params: dict | None = None) -> dict:
        return orchestration.migrate_batches(collected["last_batch"], params["migration_mode"])

    collected = collect()
    stage(collected) >> transform_group() >> migrate(collected)
