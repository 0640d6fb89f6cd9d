"""streamdi_quality_report: regenerate the report page whenever a warehouse changes (or when triggered)."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task
from streamdi_common import DEFAULT_ARGS, DELTA_WAREHOUSE, POSTGRES_WAREHOUSE, REPORT_LINK, START_DATE, TAGS

from streamdi import orchestration

with DAG(
    dag_id="streamdi_quality_report",
    description="Regenerate the streamdi report page (<STREAMDI_HOME>/reports/index.html)",
    schedule=DELTA_WAREHOUSE | POSTGRES_WAREHOUSE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args={**DEFAULT_ARGS, "execution_timeout": dt.timedelta(minutes=10)},
    tags=[*TAGS, "quality"],
    doc_md=f"""
### streamdi quality report
Runs whenever the Delta or the PostgreSQL warehouse asset is updated (and on demand). **write_report**
renders the batch log (every micro-batch × stage with its state) as `<STREAMDI_HOME>/reports/index.html`:
open the {REPORT_LINK}. The data-quality suites will add their results to this page.
""",
) as dag:

    @task
    def write_report() -> dict:
        return orchestration.write_quality_report()

    write_report()
