"""The `streamdi` command line. Every command calls the same job functions the Airflow DAGs call.

It sits in the entry layer (`streamdi.run`): each command opens the settings and the context, then hands the work to
the pipeline (`streamdi.run.pipeline`), the stream service (`streamdi.run.stream`) or a platform module. This
package only assembles the `app` and runs it (`main`, the console script `streamdi`, and `python -m
streamdi.run.cli`); the commands live in one module per group:

- `load`: `run`, `load`, `demo` (deliver into the landing zone, then stage -> transform -> migrate);
- `batch`: `batches`, `batch resume|skip` (the batch log, halted batches);
- `migrate`: `migrate`, `query` (Delta -> PostgreSQL, push and pull);
- `report`: `audit`, `quality report`;
- `doctor`: `config`, `doctor`;
- `db`, `spark`, `stream`: the embedded PostgreSQL server, the embedded Spark Connect server, the stream service;
- `generate` comes from `streamdi.generator.cli`, `airflow` from `streamdi.airflow_cli`;
- `output`: the consoles every command prints to.

The order of registration below is the order of `streamdi --help`.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import traceback
from typing import Annotated

import typer

from streamdi.airflow_cli import airflow_command
from streamdi.errors import LakeDiskFull, LandingFileError, WarehouseUnavailable
from streamdi.generator.cli import generate_app
from streamdi.locks import LakeBusy
from streamdi.run.cli import batch, db, doctor, load, migrate, report, spark, stream
from streamdi.run.cli.output import err
from streamdi.settings import SettingsError

app = typer.Typer(
    help="streamdi: TPC-DI as a stream of ordered micro-batches (landing files -> Delta Lake -> PostgreSQL).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(db.db_app, name="db")
app.add_typer(batch.batch_app, name="batch")
app.add_typer(report.quality_app, name="quality")
app.add_typer(spark.spark_app, name="spark")
app.add_typer(stream.stream_app, name="stream")
app.add_typer(generate_app, name="generate")
app.command("airflow")(airflow_command)
app.command()(doctor.config)
app.command()(doctor.doctor)
app.command()(load.run)
app.command()(load.load)
app.command()(report.audit)
app.command()(load.demo)
app.command()(batch.batches)
app.command()(migrate.migrate)
app.command(help=migrate.query_help())(migrate.query)


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what every step does.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main() -> None:
    """Run the CLI, then leave without interpreter finalization.

    delta-rs (and the Arrow/JVM threads around it) can abort a process during interpreter shutdown
    ("terminate called without an active exception", delta-io/delta-rs#2184) after all work is done. So
    exit handlers (embedded PostgreSQL cleanup, Spark shutdown) run explicitly, output is flushed, and the
    process ends with `os._exit` and the command's exit code.
    """
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (LakeBusy, SettingsError) as exc:  # another runner works on the lake, a refused setting: one line
        err.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        code = 2
    except (WarehouseUnavailable, LakeDiskFull, LandingFileError) as exc:  # one line (the traceback with -v)
        logging.getLogger(__name__).info("the run failed", exc_info=True)
        err.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        code = 1
    except BaseException:  # noqa: BLE001 - report it, then exit like Python would
        traceback.print_exc()
        _explain_jvm_exit()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _explain_jvm_exit() -> None:
    """After a failed run: if the driver JVM died under it, say so and how (its calls failed with "Connection
    refused", which names no cause)."""
    if "streamdi.spark" not in sys.modules:  # no Spark in this process
        return
    from streamdi.spark import driver_jvm_exit, jvm_exit_text

    code = driver_jvm_exit()
    if code is not None:
        err.print(
            f"The Spark driver JVM exited during the run: {jvm_exit_text(code)}. Run the command again: the steps "
            "that finished are not redone.",
            style="red",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
