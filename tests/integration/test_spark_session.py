"""The session's driver JVM runs with the options streamdi sets: UTC, and `spark_driver_java_options`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_driver_jvm_gets_the_configured_java_options(spark, settings):
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-Duser.timezone=UTC" in arguments
    assert settings.spark_driver_java_options  # the default is not empty
    for option in settings.spark_driver_java_options.split():
        assert option in arguments
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
