"""`streamdi migrate` and `streamdi query`: the last hop of the data flow, Delta -> PostgreSQL. Push (migrate what
is committed in Delta, once or on an interval) and pull (`query --fresh`), and the read-only queries with their
staleness."""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer
from rich.table import Table as RichTable

from streamdi.run.cli.output import console, err
from streamdi.settings import Settings, load_settings


def _batch_ranges(batches: tuple[int, ...] | list[int]) -> str:
    """`1-3, 5` for batches 1, 2, 3 and 5."""
    parts: list[str] = []
    start = prev = None
    for b in sorted(batches):
        if prev is not None and b == prev + 1:
            prev = b
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = b
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def _migration_text(report) -> str:
    if not report.batches:
        return "nothing pending: every batch committed in Delta is visible in PostgreSQL"
    rows = ", ".join(f"{t} {n}" for t, n in sorted(report.tables.items()) if n) or "no row changes"
    plural = "es" if len(report.batches) > 1 else ""
    return f"batch{plural} {_batch_ranges(report.batches)} visible in {report.seconds:.3f}s: {rows}"


def open_migration(settings: Settings):
    from schemas.warehouse import WAREHOUSE_TABLES
    from streamdi.context import open_context

    ctx = open_context(settings)
    ctx.warehouse.ensure_objects(WAREHOUSE_TABLES)
    return ctx


def migrate(
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            metavar="SECONDS",
            min=0.01,
            help="Keep migrating every SECONDS (push loop) until Ctrl-C or SIGTERM; each round prints what it did.",
        ),
    ] = None,
) -> None:
    """Push mode: make every batch committed in Delta (transform done) but not yet visible in PostgreSQL visible,
    all in one transaction, and mark their migrate stage done in the batch log. Once, or on an interval."""
    import signal
    import threading

    from streamdi.batchlog import wall_clock
    from streamdi.migrator import mark_migrated, migrate_pending

    ctx = open_migration(load_settings())

    def one_round():
        report = migrate_pending(ctx.lake, ctx.warehouse, mode="push")
        mark_migrated(ctx.lake, report, now=wall_clock())
        return report

    if every is None:
        console.print(_migration_text(one_round()))
        return
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    rounds = 0
    try:
        while not stop.is_set():
            started = time.monotonic()
            rounds += 1
            console.print(f"round {rounds}: {_migration_text(one_round())}")
            stop.wait(max(0.0, every - (time.monotonic() - started)))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print(f"stopped after {rounds} round(s)")


def query_help() -> str:
    from streamdi.queries import NAMED_QUERIES

    names = "\n\n".join(f"{q.name}: {q.description}" for q in NAMED_QUERIES.values())
    return (
        "Run SQL (or a named query) on the PostgreSQL warehouse as the read-only role; print the rows, the run "
        "time and the staleness (query time minus the arrival of the newest batch visible to the query). "
        "With --fresh (pull mode), first migrate every batch committed in Delta but not yet visible.\n\n"
        f"Named queries:\n\n{names}"
    )


def query(
    sql_or_name: Annotated[
        str, typer.Argument(metavar="SQL_OR_NAMED_QUERY", help="A SELECT statement, or the name of a named query.")
    ],
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Pull mode: migrate everything pending (one transaction), then query.")
    ] = False,
) -> None:
    from streamdi.batchlog import wall_clock
    from streamdi.context import open_context
    from streamdi.errors import QueryFailed
    from streamdi.migrator import mark_migrated, migrate_pending
    from streamdi.queries import resolve

    settings = load_settings()
    # only a pull migrates, and so creates what is missing; a query reads as the reader and runs no DDL
    ctx = open_migration(settings) if fresh else open_context(settings)
    name, statement = resolve(sql_or_name)
    pulled = migrate_pending(ctx.lake, ctx.warehouse, mode="pull") if fresh else None
    try:
        result = ctx.warehouse.read_snapshot(statement, timeout=settings.query_timeout)
    except RuntimeError as exc:  # QueryFailed, WarehouseUnavailable, a role not created yet
        logging.getLogger(__name__).info("the query failed", exc_info=True)  # the traceback with --verbose
        message = " ".join(str(exc).split()) or type(exc).__name__
        if (isinstance(exc, QueryFailed) and exc.missing_relation) or "does not exist yet" in message:
            message += " (has anything been loaded yet? `streamdi load` creates the warehouse)"
        err.print(f"query failed: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    table = RichTable(*result.columns, title=name)
    for row in result.rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    if result.columns:
        console.print(table)
    if pulled is not None:
        console.print(f"pulled: {_migration_text(pulled)}")
    console.print(f"{len(result.rows)} row(s) in {result.seconds * 1000:.1f} ms")
    if result.newest_batch is None:
        console.print("staleness: no batch is visible yet")
    else:
        console.print(
            f"staleness: {result.staleness_seconds:.3f} s (newest visible batch {result.newest_batch}, "
            f"arrived {result.newest_arrived_at:%Y-%m-%d %H:%M:%S.%f %Z})"
        )
    if pulled is not None:
        mark_migrated(ctx.lake, pulled, now=wall_clock())
