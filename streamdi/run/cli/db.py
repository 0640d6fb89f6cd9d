"""`streamdi db start|stop`: the embedded PostgreSQL server, kept running for psql and BI tools."""

from __future__ import annotations

import typer

from streamdi.run.cli.migrate import open_migration
from streamdi.run.cli.output import console
from streamdi.settings import Settings, load_settings

db_app = typer.Typer(help="The embedded PostgreSQL server.", no_args_is_help=True)


@db_app.command("start")
def db_start() -> None:
    """Start the embedded PostgreSQL server and keep it running (for psql and BI tools) until `db stop`."""
    from streamdi.embedded_pg import keep_running

    settings = load_settings()
    if settings.database_url:
        console.print("DATABASE_URL is set: streamdi uses that server, not an embedded one.")
        return
    keep_running(settings)
    console.print(f"embedded PostgreSQL in {settings.pgdata} is running until `streamdi db stop`.")
    console.print(f"read-only access:  psql '{_reader_url(settings)}'")


def _reader_url(settings: Settings) -> str:
    """The reader's conninfo, once the roles and tables exist (empty before a load), so that it logs in at once."""
    return open_migration(settings).warehouse.display_conninfo("reader")


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL server (no effect with DATABASE_URL)."""
    from streamdi.embedded_pg import stop_server

    settings = load_settings()
    if settings.database_url:
        console.print("DATABASE_URL is set: no embedded server to stop.")
        return
    stop_server(settings)
    console.print(f"embedded PostgreSQL in {settings.pgdata} stopped.")
