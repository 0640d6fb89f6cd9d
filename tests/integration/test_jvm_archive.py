"""The setup command's class-data-sharing archive: a new Spark driver maps its classes from it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamdi import jvm_archive
from streamdi.java import find_java

pytestmark = pytest.mark.integration

FROM_ARCHIVE = "source: shared objects file (top)"  # HotSpot's class+load log for the dynamic archive's classes

START_AND_RUN_A_JOB = (
    "from streamdi.settings import load_settings\n"
    "from streamdi.spark import get_spark\n"
    "spark = get_spark(load_settings())\n"
    "assert spark.range(100).selectExpr('sum(id) AS s').first()['s'] == 4950\n"
)


def loaded_classes(tmp_path, name: str, **env: str) -> list[str]:
    log = tmp_path / f"{name}.log"
    environment = {
        **os.environ,
        "STREAMDI_HOME": str(tmp_path / name),
        "STREAMDI_SPARK_DRIVER_JAVA_OPTIONS": f"-Xlog:class+load=info:file={log}",
        **env,
    }
    subprocess.run([sys.executable, "-c", START_AND_RUN_A_JOB], env=environment, check=True, timeout=300)
    return log.read_text().splitlines()


def test_a_new_driver_maps_spark_classes_from_the_archive(tmp_path):
    archive = jvm_archive.build()  # the setup command built it; a no-op then
    assert archive == jvm_archive.archive_path(find_java()) and archive.stat().st_size > 50 * 2**20
    mapped = [line for line in loaded_classes(tmp_path, "with") if FROM_ARCHIVE in line]
    assert len(mapped) > 5000
    assert any(" org.apache.spark.sql.catalyst.analysis.Analyzer " in line for line in mapped)
    without = loaded_classes(tmp_path, "without", STREAMDI_JVM_CLASS_ARCHIVE="false")
    assert len(without) > 5000 and not any(FROM_ARCHIVE in line for line in without)
