"""What every streamdi DAG shares: the two warehouse assets, default task arguments, UI parameters and doc links.

Not a DAG file (listed in `.airflowignore`); the DAG files import it. It builds no data logic: tasks call
`streamdi.orchestration`, which calls the pipeline's job functions.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable

from airflow.sdk import Asset, Param, task
from airflow.sdk.exceptions import AirflowFailException

from streamdi.orchestration import MIGRATION_MODES, REPORT_URL_PATH, FailFast

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
    "retry_delay": dt.timedelta(seconds=30),
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
    """May stay empty (null): the form's Trigger button accepts it."""
    return Param(None, type=["null", "string"], title="Data directory", description=description)


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
