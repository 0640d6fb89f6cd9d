"""`streamdi config` and `streamdi doctor`: the effective settings, and a check of Java, Spark, the lake and
PostgreSQL before anything is loaded (nothing here touches the landing zone or the warehouse's data)."""

from __future__ import annotations

import shutil
import sys
import time
from importlib import metadata

import typer
from rich.table import Table as RichTable

from streamdi.run.cli.output import console, err
from streamdi.settings import Settings, load_settings


def config() -> None:
    """Print the effective settings (environment variables and defaults), secrets masked."""
    settings = load_settings()
    table = RichTable("setting", title="streamdi settings")
    table.add_column("value", overflow="fold")  # a long path folds over lines instead of ending in an ellipsis
    for key, value in settings.public_view().items():
        table.add_row(key, value)
    console.print(table)


def _versions() -> str:
    names = ["pyspark", "deltalake", "psycopg", "pyarrow", "pandas", "apache-airflow", "great-expectations"]
    parts = [f"python {sys.version.split()[0]}"]
    for name in names:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} MISSING")
    return ", ".join(parts)


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

    table = RichTable("check", "status", title="streamdi doctor", show_lines=True)
    table.add_column("detail", overflow="fold")  # a long path folds over lines instead of ending in an ellipsis
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
