"""`streamdi run`, `streamdi load` and `streamdi demo`: deliver files into the landing zone (the bundled sample, a
batch folder of a generated data set, whole or as a drip), collect them into micro-batches and run every pending
one through stage -> transform -> migrate (`streamdi.run.pipeline`), printing each step."""

from __future__ import annotations

import shutil
import time
from importlib.resources import files as package_files
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable

from streamdi.run.cli.output import console, err
from streamdi.settings import Settings, load_settings

SAMPLE = "sample"
HALTED_EXIT = 3  # exit code of a run stopped by a halted batch


def deliver_sample(landing: Path) -> list[str]:
    """Copy the bundled sample into the landing zone; files already there with the same bytes are left alone."""
    sample_root = Path(str(package_files("streamdi") / SAMPLE))
    delivered = []
    for source in sorted(p for p in sample_root.rglob("*") if p.is_file()):
        relative = source.relative_to(sample_root)
        target = landing / relative
        if target.exists() and target.read_bytes() == source.read_bytes():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
        delivered.append(relative.as_posix())
    return delivered


def _process(settings: Settings, ctx=None, *, quiet_when_idle: bool = False):
    """Collect what arrived in the landing zone and run every pending (batch, stage), printing each step."""
    from streamdi.context import open_context
    from streamdi.run.pipeline import run_pending

    ctx = ctx or open_context(settings, one_run=True)  # (a context of its own: one run, then the process ends)

    def show_plan(plan: list[tuple[int, str]]) -> None:
        if plan:
            console.print(f"{len(plan)} step(s) to run: " + _plan_text(plan))

    def show_step(step) -> None:
        d = step.detail
        if step.stage == "stage":
            text = f"read {d['read']} lines: staged {d['staged']}, rejected {d['rejected']}"
            if d.get("quarantined"):
                text += f", quarantined {d['quarantined']}"
            if d.get("held"):
                text += f", held back {d['held']} (halted)"
            failed = {a: n for a, n in d.get("checks", {}).items() if a != "passed"}
            if failed:
                text += "; checks: " + ", ".join(f"{n} {a}" for a, n in sorted(failed.items()))
            if d.get("duplicates"):
                text += f"; {len(d['duplicates'])} duplicate file(s) not staged"
            if d["audit_files"]:
                text += f"; {d['audit_files']} audit file(s)"
            if d["unknown_files"]:
                shown = ", ".join(d["unknown_files"][:5])
                more = len(d["unknown_files"]) - 5
                text += f"; not staged (no declared source): {shown}" + (f" and {more} more" if more > 0 else "")
        else:
            text = ", ".join(f"{t} {n}" for t, n in sorted(d["rows"].items())) or "no changes"
            failed = {a: n for a, n in d.get("checks", {}).items() if a != "passed"}
            if failed:
                text += "; warehouse checks: " + ", ".join(f"{n} {a}" for a, n in sorted(failed.items()))
            if d.get("compacted"):
                text += f"; compacted {len(d['compacted'])} table(s)"
        verb = "HALTED after" if d.get("halted") else "done in"
        console.print(f"  batch {step.batch_id} {step.stage:<9} {verb} {step.seconds:5.1f}s: {text}")

    def show_collected(collected) -> None:
        for batch_id in collected.batch_ids:
            console.print(f"collected micro-batch {batch_id} from {settings.landing_dir}")

    report = run_pending(ctx, on_collect=show_collected, on_plan=show_plan, on_step=show_step)
    for halt in report.halted:
        options = " or ".join(f"`{command}` ({what})" for command, what in halt.commands())
        err.print(
            f"[red]micro-batch {halt.batch_id} is HALTED (its {halt.stage} step): {halt.reason}[/red]\n"
            f"  it and every later batch wait; after checking the data: {options}.\n"
            f"  Details: `streamdi quality report`."
        )
    if report.halted:
        raise typer.Exit(HALTED_EXIT)
    if report.nothing_to_do and not quiet_when_idle:
        console.print(f"nothing new arrived in {settings.landing_dir}; every batch is already done.")
    for name in report.collected.changed:
        err.print(f"[yellow]warning: {name} changed after it was collected; ignored[/yellow]")
    if report.maintained.get("landing"):
        hours = f"{settings.landing_retention_hours:g}"
        console.print(
            f"landing zone: deleted {report.maintained['landing']} file(s) of micro-batches migrated more than "
            f"{hours} h ago (STREAMDI_LANDING_RETENTION_HOURS)"
        )
    return report


def _plan_text(plan: list[tuple[int, str]]) -> str:
    by_batch: dict[int, list[str]] = {}
    for batch_id, stage in plan:
        by_batch.setdefault(batch_id, []).append(stage)
    return ", ".join(f"batch {b} {'+'.join(stages)}" for b, stages in by_batch.items())


def run(
    sample: Annotated[
        bool,
        typer.Option("--sample", help="First deliver the bundled TPC-DI reference sample into the landing zone."),
    ] = False,
    landing: Annotated[
        Path | None, typer.Option(help="Landing directory to collect from (default: STREAMDI_LANDING).")
    ] = None,
) -> None:
    """Collect new landing files into micro-batches and run every pending batch: stage -> transform -> migrate."""
    settings = Settings(landing=landing) if landing is not None else load_settings()
    if sample:
        delivered = deliver_sample(settings.landing_dir)
        console.print(f"sample: delivered {len(delivered)} file(s) into {settings.landing_dir}")
    started = time.perf_counter()
    _process(settings)
    console.print(f"finished in {time.perf_counter() - started:.1f}s")


def load(
    data: Annotated[
        Path | None, typer.Option(help="A TPC-DI data set (folders Batch1, Batch2, ...), e.g. from `generate`.")
    ] = None,
    batch: Annotated[
        int | None, typer.Option(help="The batch folder of --data to load (1 historical, 2.. incremental).")
    ] = None,
    drip: Annotated[
        int | None,
        typer.Option(help="Deliver the batch as this many micro-batches (drip mode) instead of whole.", min=1),
    ] = None,
    landing: Annotated[
        Path | None,
        typer.Option(help="Instead of --data: collect every new file of this landing directory and process it."),
    ] = None,
) -> None:
    """Load one batch folder of a data set (`--data DIR --batch K`), or everything new in a landing directory
    (`--landing DIR`): collect into micro-batches, then stage, transform and migrate every pending one in order."""
    from streamdi.delivery import deliver_batch, drip_batch

    if landing is not None and (data is not None or batch is not None or drip is not None):
        raise typer.BadParameter("use either --landing DIR, or --data DIR --batch K [--drip N]")
    if landing is None and (data is None or batch is None):
        raise typer.BadParameter("give --data DIR and --batch K (or --landing DIR)")
    settings = Settings(landing=landing) if landing is not None else load_settings()
    started = time.perf_counter()
    if landing is not None:
        if not landing.is_dir():
            raise typer.BadParameter(f"landing directory {landing} does not exist")
        _process(settings)
    else:
        from streamdi.context import open_context
        from streamdi.quality import warm_up

        warm_up()  # the batch will be staged: Great Expectations imports while its files are delivered
        try:
            if drip:
                ctx = open_context(settings)

                def group_done(group: int, groups: int) -> None:
                    console.print(f"[bold]drip {group}/{groups}[/bold] of Batch{batch}")
                    _process(settings, ctx, quiet_when_idle=True)

                drip_batch(data, batch, settings.landing_dir, drip, group_done)
            else:
                delivered = deliver_batch(data, batch, settings.landing_dir)
                console.print(f"Batch{batch}: delivered {len(delivered)} file(s) into {settings.landing_dir}")
                _process(settings)
        except (FileNotFoundError, FileExistsError) as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    console.print(f"finished in {time.perf_counter() - started:.1f}s")


def demo(
    scale_factor: Annotated[
        float, typer.Option("--scale-factor", "--sf", help="TPC-DI scale factor to generate.")
    ] = 0.1,
    drip: Annotated[
        int, typer.Option(help="Deliver the last incremental batch as this many micro-batches.", min=1)
    ] = 7,
    data: Annotated[
        Path | None, typer.Option(help="Where the data set is generated (default: <STREAMDI_HOME>/data/sf<SF>).")
    ] = None,
) -> None:
    """The whole story on the embedded defaults: generate a TPC-DI data set, load Batch1 and Batch2 whole and
    Batch3 as a drip of micro-batches (each: stage -> transform -> migrate to PostgreSQL), audit, summarise."""
    from jobs.audit import run_audit
    from streamdi.context import open_context
    from streamdi.delivery import deliver_batch, drip_batch
    from streamdi.generator import Params, generate

    settings = load_settings()
    data = data or settings.home / "data" / f"sf{scale_factor:g}"
    timings: dict[str, float] = {}
    started = time.perf_counter()
    if not (data / "Batch3" / "BatchDate.txt").exists():
        console.print(f"[bold]generate[/bold] TPC-DI SF {scale_factor:g} into {data}")
        generate(Params(scale_factor=scale_factor), data)
    timings["generate"] = time.perf_counter() - started
    ctx = open_context(settings)
    for batch in (1, 2):
        t0 = time.perf_counter()
        delivered = deliver_batch(data, batch, settings.landing_dir)
        console.print(f"[bold]load Batch{batch}[/bold]: {len(delivered)} new file(s)")
        _process(settings, ctx, quiet_when_idle=True)
        timings[f"Batch{batch}"] = time.perf_counter() - t0
    t0 = time.perf_counter()

    def group_done(group: int, groups: int) -> None:
        console.print(f"[bold]load Batch3[/bold] drip {group}/{groups}")
        _process(settings, ctx, quiet_when_idle=True)

    drip_batch(data, 3, settings.landing_dir, drip, group_done)
    timings[f"Batch3 ({drip} micro-batches)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = run_audit(ctx, data)
    timings["audit"] = time.perf_counter() - t0
    report.render(console)
    _summary(ctx, timings)
    console.print(f"finished in {time.perf_counter() - started:.1f}s; audit {'OK' if report.ok else 'FAILED'}")
    if not report.ok:
        raise typer.Exit(1)


def _summary(ctx, timings: dict[str, float]) -> None:
    from schemas.warehouse import WAREHOUSE_TABLES

    in_pg = ctx.warehouse.row_counts(WAREHOUSE_TABLES)
    table = RichTable("table", "Delta rows", "PostgreSQL rows", title="warehouse")
    for t in WAREHOUSE_TABLES:
        delta_rows = ctx.lake.read_arrow(t).num_rows if ctx.lake.exists(t) else 0
        table.add_row(t.name, f"{delta_rows:,}", f"{in_pg.get(t.name, 0):,}")
    console.print(table)
    times = RichTable("phase", "seconds", title="timings")
    for name, seconds in timings.items():
        times.add_row(name, f"{seconds:.1f}")
    console.print(times)
