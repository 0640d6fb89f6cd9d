"""streamdi_historical_load: Batch1 (or any batch folder) through staging, validation, T0-T4, migration, audit."""

from __future__ import annotations

from airflow.sdk import DAG, TriggerRule
from streamdi_common import (
    DEFAULT_ARGS,
    POSTGRES_WAREHOUSE,
    REPORT_LINK,
    SHORT,
    START_DATE,
    TAGS,
    batch_param,
    data_dir_param,
    migration_mode_param,
    scale_factor_param,
    streamdi_task,
    transform_group,
)

from streamdi.run import orchestration

with DAG(
    dag_id="streamdi_historical_load",
    description="Deliver a TPC-DI batch folder and load it: stage, validate, transform (T0-T4), migrate, audit",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "load"],
    params={
        "data_dir": data_dir_param(
            "A TPC-DI data set directory with folders Batch1, Batch2, ... (from `streamdi generate` or the official "
            "generator), as seen by the Airflow workers. Empty: a demo data set of the scale factor below."
        ),
        "batch": batch_param(),
        "scale_factor": scale_factor_param(),
        "migration_mode": migration_mode_param(),
    },
    doc_md=f"""
### streamdi historical load
Loads one batch folder of a TPC-DI data set (Batch1 by default: the historical load) as micro-batches of the
batch log. Run **streamdi_setup** first.

| task | job |
|---|---|
| deliver | `data_dir/Batch<batch>` into the landing zone (empty `data_dir`: the demo data set of `scale_factor`) |
| collect | registers the new files as the next micro-batch |
| stage | parses every file into Delta staging (`staging.*`, rejects with reasons) |
| validate | staged counts reconcile, no batch halted (data-quality suites replace this check) |
| transform.T0 | reference: DimDate, DimTime, StatusType, TradeType, Industry, TaxRate, DimBroker |
| transform.T1 ‖ T2 | securities (DimCompany, DimSecurity, Financial) ‖ accounts (DimCustomer, DimAccount, Prospect) |
| transform.T3 ‖ T4 | trades (DimTrade, FactHoldings, FactCashBalances) ‖ market (FactMarketHistory, FactWatches) |
| transform.DM | DImessages (validation rows, phase complete); marks the micro-batch's transform done |
| migrate | PostgreSQL, one transaction per batch (`migration_mode=push`); skipped with `none` |
| audit | TPC-DI audit checks on the Delta warehouse against the staged audit figures |

`batch` is the TPC-DI batch folder; the micro-batch numbers in logs and reports count every collection (after
streamdi_setup, Batch1 is micro-batch 2). Errors a retry cannot fix (a missing folder, a file that clashes with
another data set's, a halted batch) fail their task at once with what to do. An empty `data_dir` means the demo
data set of `scale_factor`, generated once, as in streamdi_setup: give both DAGs the same one.

Each transaction step is its own task in the `transform` group, with its own state, duration, log, retries and
XCom; a step retried or cleared redoes only the commits it had not made (app transactions in Delta). Each task
runs every earlier pending step of the batch log first, in its order, so a retry or a rerun resumes where the last
one stopped. Batch states: {REPORT_LINK}; the latest audit: [audit.txt](/streamdi/reports/audit.txt).
""",
) as dag:

    @streamdi_task(execution_timeout=SHORT)
    def deliver(params: dict | None = None) -> dict:
        return orchestration.deliver_data_batch(params["data_dir"], params["batch"], params["scale_factor"])

    @streamdi_task(execution_timeout=SHORT)
    def collect() -> dict:
        return orchestration.collect_landed()

    @streamdi_task()
    def stage(collected: dict) -> dict:
        return orchestration.process_batches(collected["last_batch"], "stage", "none")

    @streamdi_task(execution_timeout=SHORT)
    def validate(collected: dict) -> dict:
        return orchestration.validate_staged(collected["last_batch"])

    @streamdi_task(outlets=[POSTGRES_WAREHOUSE])
    def migrate(collected: dict, params: dict | None = None) -> dict:
        return orchestration.migrate_batches(collected["last_batch"], params["migration_mode"])

    @streamdi_task(trigger_rule=TriggerRule.NONE_FAILED)
    def audit() -> dict:
        return orchestration.audit_warehouse()

    collected = collect()
    deliver() >> collected
    stage(collected) >> validate(collected) >> transform_group() >> migrate(collected) >> audit()
