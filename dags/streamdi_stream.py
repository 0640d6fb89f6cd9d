"""streamdi_stream: supervise the always-on stream service (`streamdi stream`) from Airflow."""

from __future__ import annotations

from airflow.sdk import DAG, Param
from streamdi_common import DEFAULT_ARGS, REPORT_LINK, SHORT, START_DATE, TAGS, streamdi_task

from streamdi.run import orchestration

SCHEDULE = orchestration.dag_setting("STREAMDI_STREAM_CHECK_SCHEDULE")

with DAG(
    dag_id="streamdi_stream",
    description="The always-on stream service: start it, check it on a schedule (lag, latency, halts), or stop it",
    schedule=SCHEDULE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=True,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "stream"],
    params={
        "action": Param(
            "ensure",
            enum=list(orchestration.STREAM_ACTIONS),
            title="Action",
            description="ensure: start the service if it does not run; check: only look; stop: finish the "
            "micro-batch in flight and stop",
        )
    },
    doc_md=f"""
### streamdi stream service
The always-on alternative to the scheduled `streamdi_incremental` DAG: one warm process (`streamdi stream`) watches
the landing zone and runs every micro-batch through stage → transform → migrate as soon as it lands, with Spark,
Great Expectations and PostgreSQL kept warm. This DAG supervises it: every run (on `{SCHEDULE}`,
`STREAMDI_STREAM_CHECK_SCHEDULE`, once unpaused; or triggered with an action) **supervise** starts the service if it
does not run (`ensure`), and returns its state, lag, last micro-batch, arrival → visible latency (p50, p99) and rows/s
as its XCom. The task fails when a micro-batch is halted (the message says what to do) or the service is not running.
Use either this DAG or `streamdi_incremental`, not both (keep the other paused). Batch states: {REPORT_LINK}.
""",
) as dag:

    @streamdi_task(execution_timeout=SHORT)
    def supervise(params: dict | None = None) -> dict:
        return orchestration.supervise_stream((params or {}).get("action", "ensure"))

    supervise()
