"""The session's driver JVM runs with the options streamdi sets: UTC, and the JIT thresholds of the settings."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _jvm_arguments(spark) -> list[str]:
    return list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())


def test_driver_jvm_gets_the_configured_java_options(spark, settings):
    arguments = _jvm_arguments(spark)
    assert "-Duser.timezone=UTC" in arguments
    assert settings.spark_driver_java_options  # the default is not empty
    for option in settings.spark_driver_java_options.split():
        assert option in arguments
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_default_java_options_raise_the_c2_thresholds(monkeypatch, tmp_path):
    from streamdi.settings import Settings

    monkeypatch.delenv("STREAMDI_SPARK_DRIVER_JAVA_OPTIONS", raising=False)
    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    assert Settings().spark_driver_java_options.split() == [
        "-XX:Tier4InvocationThreshold=50000",
        "-XX:Tier4CompileThreshold=150000",
        "-XX:Tier4BackEdgeThreshold=400000",
    ]


def test_java_options_come_from_the_environment(monkeypatch, tmp_path):
    from streamdi.settings import Settings

    monkeypatch.setenv("STREAMDI_HOME", str(tmp_path))
    monkeypatch.setenv("STREAMDI_SPARK_DRIVER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
    settings = Settings()
    assert settings.spark_driver_java_options == "-XX:TieredStopAtLevel=1"
    assert settings.public_view()["STREAMDI_SPARK_DRIVER_JAVA_OPTIONS"] == "-XX:TieredStopAtLevel=1"
