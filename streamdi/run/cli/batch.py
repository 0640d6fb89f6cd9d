"""`streamdi batches` and `streamdi batch resume|skip`: the batch log, and the operator's two answers to a halted
micro-batch (let it go on, or drop it before its transform)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table as RichTable

from streamdi.locks import lake_lease
from streamdi.run.cli.output import console, err
from streamdi.settings import load_settings

batch_app = typer.Typer(help="Operator actions on one micro-batch (halted batches).", no_args_is_help=True)


def batches() -> None:
    """Show the batch log: every micro-batch, its files, the state of each stage, and the seconds from its arrival
    (its last file) until the migrate stage was marked done (visible in PostgreSQL)."""
    from streamdi.batchlog import STAGES, BatchLog
    from streamdi.lake import Lake

    settings = load_settings()
    rows = BatchLog(Lake(settings.lake_root)).summary()
    table = RichTable("batch", "files", "TPC-DI batch", "arrived", *STAGES, "visible after (s)", title="batch log")
    for r in rows:
        visible = r.get("migrate_at")
        table.add_row(
            str(r["batch_id"]),
            str(r["files"]),
            ",".join(map(str, r["source_batches"])),
            r["arrived_at"].strftime("%Y-%m-%d %H:%M:%S"),
            *(r[s] for s in STAGES),
            f"{(visible - r['arrived_at']).total_seconds():.2f}" if visible is not None else "",
        )
    console.print(table if rows else "the batch log is empty")


@batch_app.command("resume")
def batch_resume(
    batch_id: Annotated[int, typer.Argument(metavar="K", help="The halted micro-batch (see `streamdi batches`).")],
    note: Annotated[str | None, typer.Option(help="Why it may go on (kept in the batch log).")] = None,
) -> None:
    """Let halted micro-batch K go on: its halted stage runs again at the next `run`/`load`, and the policy that
    halted it only warns for this batch."""
    from streamdi.batchlog import BatchLog, BatchLogError, wall_clock
    from streamdi.lake import Lake

    try:
        root = load_settings().lake_root
        with lake_lease(root):
            stage = BatchLog(Lake(root)).resume(batch_id, now=wall_clock(), note=note)
    except BatchLogError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"micro-batch {batch_id}: stage {stage} resumed; the next `streamdi run` continues from it")


@batch_app.command("skip")
def batch_skip(
    batch_id: Annotated[int, typer.Argument(metavar="K", help="The micro-batch to drop (see `streamdi batches`).")],
    reason: Annotated[str, typer.Option(help="Why the batch is dropped (required; kept in the batch log).")],
) -> None:
    """Drop micro-batch K before its transform: its remaining stages never run, its staged rows never reach the
    warehouse, and later batches go on. Refused once K's transform has committed to the Delta warehouse (done,
    or halted by a warehouse check): resume it instead."""
    from streamdi.batchlog import BatchLog, BatchLogError, wall_clock
    from streamdi.lake import Lake

    try:
        root = load_settings().lake_root
        with lake_lease(root):
            stages = BatchLog(Lake(root)).skip(batch_id, reason, now=wall_clock())
    except BatchLogError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    if stages:
        console.print(f"micro-batch {batch_id}: skipped {', '.join(stages)} ({reason})")
    else:
        console.print(f"micro-batch {batch_id} was already skipped")
