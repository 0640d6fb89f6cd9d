"""`streamdi spark start|stop`: the embedded Spark Connect server that processes share (a warm Spark)."""

from __future__ import annotations

import typer

from streamdi.run.cli.output import console
from streamdi.settings import load_settings

spark_app = typer.Typer(
    help="The embedded Spark Connect server (STREAMDI_SPARK_REMOTE=embedded: a warm Spark shared by processes).",
    no_args_is_help=True,
)


@spark_app.command("start")
def spark_start() -> None:
    """Start (or find) this home's embedded Spark Connect server and print its address."""
    from streamdi.spark_connect import ensure_server

    console.print(f"embedded Spark Connect server: {ensure_server(load_settings())}", markup=False)


@spark_app.command("stop")
def spark_stop() -> None:
    """Stop this home's embedded Spark Connect server."""
    from streamdi.spark_connect import stop_server

    stopped = stop_server(load_settings())
    console.print("embedded Spark Connect server stopped." if stopped else "no embedded Spark Connect server running.")
