"""`streamdi generate`: write a TPC-DI data set; `streamdi generate drip`: trickle a batch into a landing zone.

`generate_app` is a Typer app meant to be mounted as a sub-command group (`app.add_typer(generate_app,
name="generate")`); without a sub-command it generates, so `streamdi generate --scale-factor 1 --out DIR` works.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

generate_app = typer.Typer(
    help="Generate TPC-DI source files (Batch1 historical, Batch2..N incremental) in the official formats.",
    add_completion=False,
)
console = Console(soft_wrap=True)


@generate_app.callback(invoke_without_command=True)
def generate_command(
    ctx: typer.Context,
    scale_factor: Annotated[
        float | None, typer.Option("--scale-factor", "--sf", help="TPC-DI scale factor; fractions such as 0.1 work.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output directory (Batch1/, Batch2/, ... go here).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed: same seed and scale factor, same bytes.")] = 0,
    batches: Annotated[int, typer.Option(help="Number of batches, the historical one included.")] = 3,
) -> None:
    """Generate a TPC-DI data set (without a sub-command); see `drip` for trickling one batch into a landing zone."""
    if ctx.invoked_subcommand is not None:
        return
    if scale_factor is None or out is None:
        raise typer.BadParameter("--scale-factor and --out are required", ctx=ctx)
    from streamdi.generator import STEPS, Params, generate  # numpy/pyarrow only when generating

    params = Params(scale_factor=scale_factor, seed=seed, batches=batches)
    started = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("generating", total=len(STEPS), detail="")
        seen: list[str] = []

        def on_step(name: str) -> None:
            if seen:
                progress.advance(task)
            seen.append(name)
            progress.update(task, description=f"generating: {name}")

        def on_file(written) -> None:
            progress.update(task, detail=f"{written.path} ({written.rows:,} rows)")

        result = generate(params, out, on_file=on_file, on_step=on_step)
        progress.update(task, completed=len(STEPS), description="generated", detail="")
    seconds = time.perf_counter() - started
    table = RichTable("files", "rows", "bytes", "seconds", "rows/s", title=f"TPC-DI SF {scale_factor} seed {seed}")
    table.add_row(
        f"{len(result.files):,}",
        f"{result.rows:,}",
        f"{result.bytes:,}",
        f"{seconds:.1f}",
        f"{result.rows / seconds:,.0f}" if seconds > 0 else "-",
    )
    console.print(table)
    console.print(f"written to {out}")


@generate_app.command("drip")
def drip_command(
    from_dir: Annotated[Path, typer.Option("--from", help="A generated batch directory, e.g. DIR/Batch2.")],
    to: Annotated[Path, typer.Option("--to", help="The landing directory to deliver into.")],
    files: Annotated[int, typer.Option("--files", help="Pieces each data file is cut into.")] = 10,
    rate: Annotated[float | None, typer.Option("--rate", help="At most this many files per second.")] = None,
    disorder: Annotated[float, typer.Option(help="Probability that a piece swaps places with the next.")] = 0.0,
    late: Annotated[float, typer.Option(help="Probability that a piece arrives after all others.")] = 0.0,
    duplicates: Annotated[float, typer.Option(help="Probability that a piece is delivered twice.")] = 0.0,
    malformed: Annotated[float, typer.Option(help="Probability that a piece has one damaged line.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault draws.")] = 0,
) -> None:
    """Trickle one generated batch into a landing zone as many small files (with optional faults)."""
    from streamdi.generator.drip import DripOptions, drip

    if not from_dir.is_dir():
        raise typer.BadParameter(f"{from_dir} is not a directory", param_hint="--from")
    try:
        options = DripOptions(files, disorder, late, duplicates, malformed, seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    started = time.perf_counter()
    with Progress(TextColumn("[bold]dripping"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:  # fmt: skip
        task = progress.add_task("drip", total=None)
        deliveries = drip(from_dir, to, options, rate=rate, on_delivery=lambda _d: progress.advance(task))
        progress.update(task, total=len(deliveries))
    seconds = time.perf_counter() - started
    faults = {
        "late": sum(d.late for d in deliveries),
        "duplicates": sum(d.kind == "duplicate" for d in deliveries),
        "malformed lines": sum(len(d.malformed) for d in deliveries if d.kind == "original"),
    }
    summary = ", ".join(f"{v} {k}" for k, v in faults.items())
    console.print(f"delivered {len(deliveries)} files into {to} in {seconds:.1f}s ({summary}); manifest in {to}/_drip")
