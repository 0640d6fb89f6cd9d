"""The build load of the JVM class archive (`streamdi.jvm_archive`).

Run as `python -m streamdi.run.jvm_archive_load FILE` by `jvm_archive.build`, it loads a tiny data set (SF 0.01,
Batch1 and Batch2 staged and transformed) in a driver JVM that writes the classes it loaded to FILE when it exits.
The transform runs on Arrow, so what Spark does in streamdi is the stage's parse of large files on the executors
(`jobs.stage_executors`): the load parses every file that way (`STREAMDI_EXECUTOR_PARSE_BYTES=0`), and the archive
holds the classes of those jobs.

A module of its own so that `streamdi.jvm_archive`, which every Spark start imports for the archive's options,
does not import the jobs it runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from streamdi.jvm_archive import BUILD_SCALE_FACTOR, QUIET


def dump(into: Path) -> None:
    """The build load, in a JVM that writes its loaded classes to `into` when it exits."""
    from streamdi.settings import DRIVER_JIT_OPTIONS

    os.environ["STREAMDI_SPARK_DRIVER_JAVA_OPTIONS"] = f"{DRIVER_JIT_OPTIONS} -XX:ArchiveClassesAtExit={into} {QUIET}"
    os.environ["STREAMDI_JVM_CLASS_ARCHIVE"] = "false"  # not the archive being replaced
    os.environ["STREAMDI_EXECUTOR_PARSE_BYTES"] = "0"  # the Spark jobs streamdi runs: the executors' parse
    from pyspark import SparkContext

    from jobs import transform
    from streamdi.context import JobContext
    from streamdi.delivery import deliver_batch
    from streamdi.generator import Params, generate
    from streamdi.run.pipeline import collect_job, stage_job
    from streamdi.settings import Settings

    home = Path(tempfile.mkdtemp(prefix="streamdi-jvm-archive-"))
    try:
        generate(Params(scale_factor=BUILD_SCALE_FACTOR), home / "data")
        settings = Settings(home=home)
        ctx = JobContext(settings)
        for batch in (1, 2):
            deliver_batch(home / "data", batch, settings.landing_dir)
            for batch_id in collect_job(ctx).batch_ids:
                stage_job(ctx, batch_id)
                transform.run(ctx, batch_id)
        gateway = SparkContext._gateway
        ctx.spark.stop()
        # The JVM writes the archive on exit, which it does when its stdin closes; wait for it.
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=600)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    dump(Path(sys.argv[1]))
