"""streamdi_setup: create the Delta and PostgreSQL objects, load the reference data, validate."""

from __future__ import annotations

from airflow.sdk import DAG, task
from streamdi_common import (
    DEFAULT_ARGS,
    DELTA_WAREHOUSE,
    POSTGRES_WAREHOUSE,
    REPORT_LINK,
    SHORT,
    START_DATE,
    TAGS,
    data_dir_param,
    migration_mode_param,
)

from streamdi import orchestration

with DAG(
    dag_id="streamdi_setup",
    description="Create Delta and PostgreSQL objects, load TPC-DI reference data, validate",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "setup"],
    params={
        "data_dir": data_dir_param(
            "A TPC-DI data set (folders Batch1, Batch2, ...) whose Batch1 reference files (Date, Time, Industry, "
            "StatusType, TaxRate, TradeType, BatchDate) are loaded. Empty: the reference sample bundled with streamdi."
        ),
        "migration_mode": migration_mode_param(),
    },
    doc_md=f"""
### streamdi setup
Run once per environment, before any load (running it again changes nothing):

1. **create_objects**: the Delta batch log and every PostgreSQL object (schemas, roles, ledger, `dw.*` tables);
2. **deliver_reference_data**: the reference files of `data_dir/Batch1` (or the bundled sample) into the landing zone;
3. **collect** them as a micro-batch, **load_reference_data** (stage → transform → migrate, in batch-log order);
4. **validate**: staged counts reconcile (lines read = staged + rejected) and no batch is halted.

Then trigger **streamdi_historical_load**. Batch states: {REPORT_LINK}.
""",
) as dag:

    @task(execution_timeout=SHORT)
    def create_objects() -> dict:
        return orchestration.create_objects()

    @task(execution_timeout=SHORT)
    def deliver_reference_data(params: dict | None = None) -> dict:
        return orchestration.deliver_reference_data(params["data_dir"])

    @task(execution_timeout=SHORT)
    def collect() -> dict:
        return orchestration.collect_landed()

    @task(outlets=[DELTA_WAREHOUSE, POSTGRES_WAREHOUSE])
    def load_reference_data(collected: dict, params: dict | None = None) -> dict:
        return orchestration.process_batches(collected["last_batch"], "migrate", params["migration_mode"])

    @task(execution_timeout=SHORT)
    def validate(collected: dict) -> dict:
        return orchestration.validate_staged(collected["last_batch"])

    collected = collect()
    create_objects() >> deliver_reference_data() >> collected
    load_reference_data(collected) >> validate(collected)
