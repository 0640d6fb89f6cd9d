"""streamdi_setup: create the Delta and PostgreSQL objects, load the reference data, validate."""

from __future__ import annotations

from airflow.sdk import DAG
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
    scale_factor_param,
    streamdi_task,
)

from streamdi.run import orchestration

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
            "StatusType, TaxRate, TradeType, BatchDate) are loaded. Empty: those of the demo data set of the scale "
            "factor below, the data set streamdi_historical_load loads when its data directory is empty."
        ),
        "scale_factor": scale_factor_param(),
        "migration_mode": migration_mode_param(),
    },
    doc_md=f"""
### streamdi setup
Run once per environment, before any load (running it again changes nothing):

1. **create_objects**: the Delta batch log and every PostgreSQL object (schemas, roles, ledger, `dw.*` tables);
2. **deliver_reference_data**: the reference files of `data_dir/Batch1` into the landing zone (with an empty
   `data_dir`: of the demo data set of `scale_factor`, generated once into `<STREAMDI_HOME>/data/sf<scale_factor>`;
   give the historical load the same `data_dir` or `scale_factor`);
3. **collect** them as a micro-batch, **load_reference_data** (stage → transform → migrate, in batch-log order);
4. **validate**: staged counts reconcile (lines read = staged + rejected) and no batch is halted.

Its reference files are micro-batch 1; a historical load after it is micro-batch 2. Errors that a retry cannot
fix (a missing folder, a file that clashes with another data set's) fail the task at once and say what to do.
Then trigger **streamdi_historical_load**. Batch states: {REPORT_LINK}.
""",
) as dag:

    @streamdi_task(execution_timeout=SHORT)
    def create_objects() -> dict:
        return orchestration.create_objects()

    @streamdi_task(execution_timeout=SHORT)
    def deliver_reference_data(params: dict | None = None) -> dict:
        return orchestration.deliver_reference_data(params["data_dir"], scale_factor=params["scale_factor"])

    @streamdi_task(execution_timeout=SHORT)
    def collect() -> dict:
        return orchestration.collect_landed()

    @streamdi_task(outlets=[DELTA_WAREHOUSE, POSTGRES_WAREHOUSE])
    def load_reference_data(collected: dict, params: dict | None = None) -> dict:
        return orchestration.process_batches(collected["last_batch"], "migrate", params["migration_mode"])

    @streamdi_task(execution_timeout=SHORT)
    def validate(collected: dict) -> dict:
        return orchestration.validate_staged(collected["last_batch"])

    collected = collect()
    create_objects() >> deliver_reference_data() >> collected
    load_reference_data(collected) >> validate(collected)
