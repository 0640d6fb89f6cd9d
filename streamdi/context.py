"""What every job function receives: settings, the SparkSession, the lake and (lazily) the warehouse.

Jobs get all their inputs from here and from their arguments (batch id, files), never from globals or the
clock; the platform creates one context per process (`open_context`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamdi.lake import Lake
from streamdi.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamdi.warehouse import Warehouse


class JobContext:
    """Settings, lake and warehouse for one process; Spark and PostgreSQL start only when first used, so a
    run with nothing to do costs no JVM start."""

    def __init__(self, settings: Settings, spark: SparkSession | None = None, lake: Lake | None = None) -> None:
        self.settings = settings
        self._spark = spark
        self.lake = lake or Lake(settings.lake_root, spark, spark_factory=lambda: self.spark)
        self._warehouse: Warehouse | None = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from streamdi.spark import get_spark

            self._spark = get_spark(self.settings)
        return self._spark

    @property
    def warehouse(self) -> Warehouse:
        if self._warehouse is None:
            from streamdi.warehouse import open_warehouse

            self._warehouse = open_warehouse(self.settings)
        return self._warehouse


def open_context(settings: Settings) -> JobContext:
    """A context whose lake lives under `settings.lake_root`; nothing is started yet."""
    return JobContext(settings)
