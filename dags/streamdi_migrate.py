"""streamdi_migrate: push every transformed batch to PostgreSQL on its own interval."""

from __future__ import annotations

from airflow.sdk import DAG
from streamdi_common import DEFAULT_ARGS, POSTGRES_WAREHOUSE, REPORT_LINK, START_DATE, TAGS, streamdi_task

from streamdi.run import orchestration

SCHEDULE = orchestration.dag_setting("STREAMDI_MIGRATE_SCHEDULE")

with DAG(
    dag_id="streamdi_migrate",
    description="Push migration: make every batch committed in Delta visible in PostgreSQL, in batch order",
    schedule=SCHEDULE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "migration"],
    doc_md=f"""
### streamdi migration (push, on an interval)
For deployments that decouple migration from the load (`migration_mode=none` in the load DAGs). Runs on
`{SCHEDULE}` (environment variable `STREAMDI_MIGRATE_SCHEDULE`); **migrate** makes every batch whose transform is
done visible in PostgreSQL, oldest first, each batch in one transaction; a run with nothing to migrate is
shown as skipped. Batch states: {REPORT_LINK}.
""",
) as dag:

    @streamdi_task(outlets=[POSTGRES_WAREHOUSE])
    def migrate() -> dict:
        return orchestration.migrate_transformed(skip_when_idle=True)

    migrate()
