"""The options of Spark's driver and sessions, shared by a session in the process (`streamdi.spark`) and the embedded
Spark Connect server (`streamdi.spark_connect`), so both run Spark the same way."""

from __future__ import annotations

from pathlib import Path

from streamdi import jvm_archive
from streamdi.java import JavaRuntime
from streamdi.settings import Settings


def jvm_options(settings: Settings, runtime: JavaRuntime) -> str:
    """The driver JVM's options: UTC, streamdi's log4j configuration, `spark_driver_java_options`, and the class
    archive when there is one."""
    log_config = Path(__file__).with_name("log4j2.properties")
    options = f"-Duser.timezone=UTC -Dlog4j2.configurationFile=file:{log_config} {settings.spark_driver_java_options}"
    if settings.jvm_class_archive:
        options += " " + jvm_archive.driver_options(runtime)
    return options


def server_options(settings: Settings) -> dict[str, str]:
    """Options fixed when the driver JVM starts (a local session's or a Spark Connect server's)."""
    options = {
        "spark.ui.enabled": str(settings.spark_ui).lower(),
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.ui.showConsoleProgress": "false",
        # A micro-batch compiles ~235 generated classes; the default cache of 100 evicted them before the next
        # micro-batch could reuse them (measured at SF 3: 235 -> ~30 compilations, 18.0 s -> 15.7 s per micro-batch).
        "spark.sql.codegen.cache.maxEntries": "1000",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if settings.spark_master.startswith("local"):
        options.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    return options


def session_options(settings: Settings) -> dict[str, str]:
    """SQL options of every session (set per session on a Spark Connect server)."""
    return {
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Files the executors write for a Delta table (`Lake._commit_files`) store timestamps as Parquet's
        # microsecond timestamps, as delta-rs does, not Spark's legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Runtime bloom filters size a bit array for a million rows per join task; our joins meet small
        # micro-batches, where building them cost a third of a step (measured: T2 10 s -> 7 s per micro-batch).
        "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
        # Below this size, `createDataFrame` of Arrow data makes a local relation, and the optimizer then evaluates
        # every expression over it in the driver, interpreted, on one thread (measured when Spark still parsed the
        # staged files: FINWIRE at SF 3, 40 MB, 13-16 s of "optimization"). Small frames still stay local.
        "spark.sql.execution.arrow.localRelationThreshold": str(256 * 1024),
    }


def spark_submit() -> str:
    """The `spark-submit` script of the installed pyspark."""
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit")
