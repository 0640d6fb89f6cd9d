"""streamdi_quality_report: regenerate the data-quality report whenever a warehouse changes (or when triggered)."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG
from streamdi_common import (
    DEFAULT_ARGS,
    DELTA_WAREHOUSE,
    POSTGRES_WAREHOUSE,
    REPORT_LINK,
    START_DATE,
    TAGS,
    streamdi_task,
)

from streamdi.run import orchestration

with DAG(
    dag_id="streamdi_quality_report",
    description="Regenerate the data-quality report and Data Docs (<STREAMDI_HOME>/reports/quality/)",
    schedule=DELTA_WAREHOUSE | POSTGRES_WAREHOUSE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    # unpaused from the start: the report follows every load without a manual step (the other DAGs start paused)
    is_paused_upon_creation=False,
    default_args={**DEFAULT_ARGS, "execution_timeout": dt.timedelta(minutes=10)},
    tags=[*TAGS, "quality"],
    doc_md=f"""
### streamdi quality report
Runs whenever the Delta or the PostgreSQL warehouse asset is updated (and on demand); it is the one streamdi DAG
that starts unpaused, so the report follows every load without a manual step. **write_report** reads the
validation results (Delta `quality.results`, `quality.quarantine`) and the batch log, and writes:

- `<STREAMDI_HOME>/reports/quality/index.html`, the {REPORT_LINK}: every micro-batch × validated table with the
  worst action of its checks (pass, warn, overridden, quarantined, halted) and the failing checks; a halted batch
  with its reason and the operator commands that apply (`streamdi batch resume K`, in staging also `batch skip`);
  failure rates per batch; quarantined rows per table and how to retrieve them;
- Great Expectations Data Docs in `reports/quality/data_docs/` (one validation page per micro-batch, attempt and
  table, rebuilt from the stored results; each cell of the report links to its page);
- the batch-log page `<STREAMDI_HOME>/reports/index.html` (micro-batch × stage states).

The same report from a shell: `streamdi quality report`. See docs/reports.md.
""",
) as dag:

    @streamdi_task()
    def write_report() -> dict:
        return orchestration.write_quality_report()

    write_report()
