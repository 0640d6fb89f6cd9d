"""What every job function receives: settings, the SparkSession, the lake and (lazily) the warehouse.

Jobs get all their inputs from here and from their arguments (batch id, files), never from globals or the
clock; the platform creates one context per process (`open_context`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamdi.lake import Lake
from streamdi.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamdi.warehouse import Warehouse


@dataclass
class JobContext:
    settings: Settings
    spark: SparkSession
    lake: Lake
    _warehouse: Warehouse | None = field(default=None, repr=False)

    @property
    def warehouse(self) -> Warehouse:
        if self._warehouse is None:
            from streamdi.warehouse import open_warehouse

            self._warehouse = open_warehouse(self.settings)
        return self._warehouse


def open_context(settings: Settings) -> JobContext:
    """Start (or reuse) the process's SparkSession and open the lake under `settings.lake_root`."""
    from streamdi.spark import get_spark

    spark = get_spark(settings)
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))
