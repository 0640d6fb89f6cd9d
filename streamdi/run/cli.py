"""The `streamdi` command line. Every command calls the same job functions the Airflow DAGs call."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import time
import traceback
from importlib import metadata
from importlib.resources import files as package_files
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table as RichTable

from streamdi.airflow_cli import airflow_command
from streamdi.errors import LakeDiskFull, LandingFileError, WarehouseUnavailable
from streamdi.generator.cli import generate_app as _generate_app
from streamdi.locks import LakeBusy, lake_lease
from streamdi.settings import Settings, SettingsError, load_settings

app = typer.Typer(
    help="streamdi: TPC-DI as a stream of ordered micro-batches (landing files -> Delta Lake -> PostgreSQL).",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(help="The embedded PostgreSQL server.", no_args_is_help=True)
app.add_typer(db_app, name="db")
batch_app = typer.Typer(help="Operator actions on one micro-batch (halted batches).", no_args_is_help=True)
app.add_typer(batch_app, name="batch")
quality_app = typer.Typer(help="Data-quality results of the validation suites.", no_args_is_help=True)
app.add_typer(quality_app, name="quality")
spark_app = typer.Typer(
    help="The embedded Spark Connect server (STREAMDI_SPARK_REMOTE=embedded: a warm Spark shared by processes).",
    no_args_is_help=True,
)
app.add_typer(spark_app, name="spark")
stream_app = typer.Typer(
    help="The always-on stream service: a warm process that runs each micro-batch as soon as it lands.",
)
app.add_typer(stream_app, name="stream")
app.add_typer(_generate_app, name="generate")
app.command("airflow")(airflow_command)
console = Console(soft_wrap=True)
err = Console(stderr=True)

SAMPLE = "sample"
HALTED_EXIT = 3  # exit code of a run stopped by a halted batch


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what every step does.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def config() -> None:
    """Print the effective settings (environment variables and defaults), secrets masked."""
    settings = load_settings()
    table = RichTable("setting", "value", title="streamdi settings")
    for key, value in settings.public_view().items():
        table.add_row(key, value)
    console.print(table)


# ---------------------------------------------------------------------------------------------- doctor
def _versions() -> str:
    names = ["pyspark", "deltalake", "psycopg", "pyarrow", "pandas", "apache-airflow", "great-expectations"]
    parts = [f"python {sys.version.split()[0]}"]
    for name in names:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} MISSING")
    return ", ".join(parts)


@app.command()
def doctor() -> None:
    """Check Java, Spark, the lake and PostgreSQL; print versions. Exits non-zero if any check fails."""
    from streamdi.java import JavaNotUsable, find_java

    settings = load_settings()
    results: list[tuple[str, bool, str]] = [("versions", True, _versions())]
    spark = None
    try:
        runtime = find_java()
        results.append(("java", True, f"Java {runtime.version} at {runtime.java}"))
        results.append(("jvm class archive", True, _class_archive(settings, runtime)))
    except JavaNotUsable as exc:
        results.append(("java", False, str(exc)))
    if results[-1][1]:
        try:
            from streamdi.spark import get_spark

            started = time.perf_counter()
            spark = get_spark(settings, app_name="streamdi-doctor")
            n = spark.range(1000).selectExpr("sum(id) AS s").first()["s"]
            if n != 499500:
                raise RuntimeError(f"sum of 0..999 came back as {n}")
            results.append(
                (
                    "spark",
                    True,
                    f"Spark {spark.version} on {_spark_where(spark, settings)} "
                    f"({time.perf_counter() - started:.1f}s to start and run a job)",
                )
            )
        except Exception as exc:  # noqa: BLE001 - doctor reports every failure
            results.append(("spark", False, f"Spark did not start: {exc}"))
    else:
        results.append(("spark", False, "skipped: no usable Java"))
    results.append(_check_lake(settings, spark))
    results.append(_check_postgres(settings))

    table = RichTable("check", "status", "detail", title="streamdi doctor", show_lines=True)
    for name, ok, detail in results:
        table.add_row(name, "[green]OK[/green]" if ok else "[red]FAIL[/red]", detail)
    console.print(table)
    if not all(ok for _, ok, _ in results):
        err.print("[red]streamdi doctor: some checks failed (see above).[/red]")
        raise typer.Exit(1)


def _spark_where(spark, settings: Settings) -> str:
    """Where the session runs: this process's Spark (its master) or a Spark Connect server (its address)."""
    from streamdi.spark import remote_address

    url = remote_address(spark)
    return f"the Spark Connect server at {url}" if url else settings.spark_master


def _class_archive(settings: Settings, runtime) -> str:
    from streamdi.jvm_archive import archive_path

    path = archive_path(runtime)
    if not settings.jvm_class_archive:
        return "not used (STREAMDI_JVM_CLASS_ARCHIVE=false)"
    if not path.is_file():
        return "none for this JDK and these jars: `python -m streamdi.jvm_archive build` (faster new processes)"
    return f"{path.name} ({path.stat().st_size / 2**20:.0f} MB) in {path.parent}"


def _check_lake(settings: Settings, spark) -> tuple[str, bool, str]:
    import pyarrow as pa

    from schemas.model import Column, Table
    from streamdi.lake import Lake

    probe = Table(
        "doctor_probe",
        "platform",
        (Column("id", "int", False), Column("name", "string")),
        key=("id",),
        order_by=("id",),
    )
    root = settings.home / "doctor" / f"lake-{int(time.time() * 1000)}"
    try:
        lake = Lake(root, spark)
        rows = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]})
        first = lake.append(probe, rows, app_id="doctor", version=1)
        again = lake.append(probe, rows, app_id="doctor", version=1)
        back = lake.read(probe).orderBy("id").collect() if spark else lake.read_arrow(probe).to_pylist()
        got = [(r["id"], r["name"]) for r in back]
        if not first.committed or again.committed or got != [(1, "a"), (2, "b")]:
            return "lake", False, f"write/read mismatch at {root}: {got}"
        return (
            "lake",
            True,
            f"Delta write, idempotent retry and read back OK under {settings.lake_root.parent}",
        )
    except Exception as exc:  # noqa: BLE001
        return "lake", False, f"Delta write/read failed at {root}: {exc}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_postgres(settings: Settings) -> tuple[str, bool, str]:
    try:
        from streamdi.warehouse import open_warehouse

        warehouse = open_warehouse(settings)
        where = "DATABASE_URL" if settings.database_url else f"embedded server in {settings.pgdata}"
        return "postgres", True, f"PostgreSQL {warehouse.server_version()} ({where})"
    except Exception as exc:  # noqa: BLE001
        return "postgres", False, f"PostgreSQL not reachable: {exc}"


# ------------------------------------------------------------------------------------------------- run
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

    ctx = ctx or open_context(settings)

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
    return report


def _plan_text(plan: list[tuple[int, str]]) -> str:
    by_batch: dict[int, list[str]] = {}
    for batch_id, stage in plan:
        by_batch.setdefault(batch_id, []).append(stage)
    return ", ".join(f"batch {b} {'+'.join(stages)}" for b, stages in by_batch.items())


@app.command()
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


@app.command()
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


@app.command()
def audit(
    data: Annotated[
        Path | None,
        typer.Option(
            help="Read the expected figures from this data set's *_audit.csv files (default: the staged ones)."
        ),
    ] = None,
) -> None:
    """Run every check of the official TPC-DI audit script on the PostgreSQL warehouse (dw.*, read-only) and
    print each with OK or what was found and expected; exit 1 when a check failed or was skipped."""
    from streamdi.audit import run_audit
    from streamdi.context import open_context

    report = run_audit(open_context(load_settings()), data)
    report.render(console)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
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
    from streamdi.audit import run_audit
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


@app.command()
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


# ---------------------------------------------------------------------------------------- migrate / query
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


def _open_migration(settings: Settings):
    from schemas.warehouse import WAREHOUSE_TABLES
    from streamdi.context import open_context

    ctx = open_context(settings)
    ctx.warehouse.ensure_objects(WAREHOUSE_TABLES)
    return ctx


@app.command()
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

    ctx = _open_migration(load_settings())

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


def _query_help() -> str:
    from streamdi.queries import NAMED_QUERIES

    names = "\n\n".join(f"{q.name}: {q.description}" for q in NAMED_QUERIES.values())
    return (
        "Run SQL (or a named query) on the PostgreSQL warehouse as the read-only role; print the rows, the run "
        "time and the staleness (query time minus the arrival of the newest batch visible to the query). "
        "With --fresh (pull mode), first migrate every batch committed in Delta but not yet visible.\n\n"
        f"Named queries:\n\n{names}"
    )


@app.command(help=_query_help())
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
    ctx = _open_migration(settings) if fresh else open_context(settings)
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


@quality_app.command("report")
def quality_report() -> None:
    """Write the data-quality report and its Great Expectations Data Docs; print the path and a one-line summary.

    Reads Delta quality.results, quality.quarantine and the batch log (no Spark) and writes
    <STREAMDI_HOME>/reports/quality/index.html: micro-batches x validated tables with the worst check of each,
    the failing checks, halted and skipped batches, failure rates per batch and the quarantined rows per table.
    Each cell links to its validation page in reports/quality/data_docs/ (rebuilt on every run). Also writes the
    batch-log page, <STREAMDI_HOME>/reports/index.html: every micro-batch with the state of each stage."""
    from streamdi.batchlog import wall_clock
    from streamdi.quality_report import describe
    from streamdi.run.orchestration import write_report_pages

    outcome, page, batches = write_report_pages(load_settings(), wall_clock())
    for line in describe(outcome):
        console.print(line, markup=False, highlight=False)
    console.print(f"batch log: {page} ({batches} micro-batch(es))", markup=False, highlight=False)


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
    return _open_migration(settings).warehouse.display_conninfo("reader")


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


@stream_app.callback(invoke_without_command=True)
def stream(
    context: typer.Context,
    interval: Annotated[
        float,
        typer.Option(
            help="Cut a micro-batch this many seconds after the first waiting file was seen (0: at once).", min=0
        ),
    ] = 0.5,
    max_bytes: Annotated[
        int, typer.Option(help="Cut as soon as this many bytes wait, before the interval ends (0: never).", min=0)
    ] = 0,
    poll: Annotated[float, typer.Option(help="Seconds between two listings of the landing zone.", min=0.001)] = 0.05,
    cut: Annotated[
        Literal["time", "round"],
        typer.Option(
            help="'time': cut whatever waits when the trigger fires; 'round': one round of parts per micro-batch "
            "(every source's part N of a TPC-DI batch), cut when the feed's manifest says it is complete, so the "
            "micro-batches do not depend on timing (see docs/stream.md).",
        ),
    ] = "time",
    idle_exit: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds with nothing waiting or pending (default: run until stopped)."),
    ] = None,
    feed: Annotated[
        Path | None,
        typer.Option(
            help="Also drip this generated batch directory (e.g. DATA/Batch2) into the landing zone beside the "
            "service, as `streamdi generate drip` would: a demo of the warehouse catching up."
        ),
    ] = None,
    files: Annotated[int, typer.Option(help="With --feed: pieces each data file is cut into.", min=1)] = 20,
    rate: Annotated[float, typer.Option(help="With --feed: files delivered per second.", min=0.01)] = 5.0,
) -> None:
    """Run the stream service: watch the landing zone, cut micro-batches by the trigger (--interval, --max-bytes)
    and run each through stage -> transform -> migrate on one warm Spark, printing each micro-batch's latency from
    arrival to visible in PostgreSQL. SIGTERM or Ctrl-C finishes the micro-batch in flight, then stops (twice:
    abandon it; a restart resumes it exactly once). `streamdi stream status` shows what it does."""
    if context.invoked_subcommand is not None:
        return
    import threading

    from streamdi.context import open_context
    from streamdi.run.stream import ServiceRunning, StreamService, install_signals
    from streamdi.run.stream_cuts import Trigger

    settings = load_settings()
    settings.landing_dir.mkdir(parents=True, exist_ok=True)

    def show(latency) -> None:
        seconds = " ".join(f"{s} {t:.2f}s" for s, t in latency.seconds.items())
        visible = "?" if latency.visible is None else f"{latency.visible:.2f}"
        console.print(
            f"micro-batch {latency.batch_id}: visible {visible} s after arrival, {latency.rows} rows ({seconds}); "
            f"waiting files {service.status.waiting_files}"
        )

    service = StreamService(
        open_context(settings),
        Trigger(interval=interval, max_bytes=max_bytes, poll=poll, cut=cut),
        idle_exit=idle_exit,
        on_batch=show,
    )
    install_signals(service)
    if feed is not None:
        from streamdi.generator.drip import DripOptions, drip

        if not feed.is_dir():
            raise typer.BadParameter(f"{feed} is not a directory (give a generated batch folder, e.g. DATA/Batch2)")
        threading.Thread(
            target=drip,
            args=(feed, settings.landing_dir, DripOptions(parts=files)),
            kwargs={"rate": rate},
            name="feed",
            daemon=True,
        ).start()
        console.print(f"feeding {feed} into {settings.landing_dir}: {files} pieces per file, {rate:g} file(s)/s")
    how = (
        "one round of parts per micro-batch, cut when complete"
        if cut == "round"
        else f"cut {interval:g} s after a file arrives" + (f" or at {max_bytes} bytes" if max_bytes else "")
    )
    console.print(f"streaming {settings.landing_dir} ({how}); Ctrl-C finishes the micro-batch in flight and stops")
    try:
        service.run()
    except ServiceRunning as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err.print("[yellow]abandoned the micro-batch in flight; the next start resumes it[/yellow]")
        raise typer.Exit(130) from None
    console.print(f"stream stopped: {service.status.batches_done} micro-batch(es), {service.status.rows_done} rows")


@stream_app.command("status")
def stream_status() -> None:
    """Whether the stream service runs, what it does, its lag, its last micro-batches' latency (arrival -> staged
    -> committed in Delta -> visible in PostgreSQL), rows/s and any halt."""
    from streamdi.run.stream_status import read_status, summary

    status, running = read_status(load_settings())
    if status is None:
        console.print("the stream service has never run for this home (start it with `streamdi stream`)")
        raise typer.Exit(1)
    brief = summary(status, running)
    console.print(f"stream service: {brief['state']}; pid {status['pid']}, started {status['started_at']}")
    console.print(f"  updated {status['updated_at']}; landing {status['landing']}")
    console.print(
        f"  waiting: {status['waiting_files']} file(s), {status['waiting_bytes']} bytes; "
        f"lag {status['lag_seconds']:.3f} s"
    )
    if status.get("processing") is not None:
        console.print(f"  processing micro-batch {status['processing']}")
    recent = status.get("recent") or []
    console.print(
        f"  done: {status['batches_done']} micro-batch(es), {status['rows_done']} rows; last visible micro-batch "
        f"{status.get('last_batch')}"
    )
    if recent:
        last = recent[-1]
        if brief["warm_batches"]:
            console.print(
                f"  latency, arrival -> visible, last {brief['warm_batches']} warm: p50 "
                f"{brief['visible_p50_seconds']:.3f} s, p99 {brief['visible_p99_seconds']:.3f} s; "
                f"rows/s {brief['rows_per_second']}"
            )
        else:
            console.print("  latency: not measured yet on a warm service")
        if brief["cold_visible_seconds"] is not None:
            console.print(
                f"  first micro-batch of the service (cold Spark, left out above): visible "
                f"{brief['cold_visible_seconds']:.3f} s after arrival"
            )
        console.print(
            f"  last micro-batch {last['batch_id']}: staged {last.get('staged')} s, "
            f"committed {last.get('committed')} s, visible {last.get('visible')} s after arrival; "
            + ", ".join(f"{stage} {t:.3f} s" for stage, t in last["seconds"].items())
        )
    if status.get("halt"):
        err.print(f"[red]  HALTED: {status['halt']}[/red] (see `streamdi batches`; `streamdi batch resume|skip`)")
    if status.get("error"):
        err.print(f"[red]  error: {status['error']}[/red]")


@stream_app.command("stop")
def stream_stop() -> None:
    """Ask the running stream service to finish its micro-batch in flight and stop (SIGTERM)."""
    import signal

    from streamdi.run.stream_status import read_status

    status, running = read_status(load_settings())
    if not running or status is None:
        console.print("no stream service runs for this home.")
        return
    os.kill(status["pid"], signal.SIGTERM)
    console.print(f"asked the stream service (pid {status['pid']}) to stop after its micro-batch in flight.")


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
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
