"""What every job function receives: settings, the SparkSession, the lake and (lazily) the warehouse.

Jobs get all their inputs from here and from their arguments (batch id, files), never from globals or the
clock; the platform creates one context per process (`open_context`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from streamdi.collector import Listing
from streamdi.lake import Lake
from streamdi.landing_cleanup import Cleanup
from streamdi.memory import MIB, keep_giving_back, use_returning_pool
from streamdi.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamdi.warehouse import Warehouse


class JobContext:
    """Settings, lake and warehouse for one process; Spark and PostgreSQL start only when first used, so a
    run with nothing to do costs no JVM start."""

    def __init__(
        self,
        settings: Settings,
        spark: SparkSession | None = None,
        lake: Lake | None = None,
        *,
        one_run: bool = False,
    ) -> None:
        self.settings = settings
        self._spark = spark
        # One run and the process ends (`streamdi load`): Spark is stopped once the run needs it no more
        # (`spark_done`). A session given here is the caller's, never stopped.
        self._stops_spark = one_run and spark is None
        self._own_jvm = False  # the JVM of `spark` was started by this context
        self.lake = lake or Lake(
            settings.lake_root, spark, spark_factory=lambda: self.spark, resident_bytes=settings.resident_mb * MIB
        )
        self._warehouse: Warehouse | None = None
        self.landing = Listing()  # what the process remembers of the landing zone between its collects
        self.landing_cleanup = Cleanup()  # where its cleanups of finished micro-batches' files stopped
        use_returning_pool()  # Arrow's freed memory back to the system (`streamdi.memory`)
        keep_giving_back(settings.malloc_trim_seconds)  # the process's freed memory back to the system
        self._starting = threading.Lock()
        self._opening = threading.Lock()

    @property
    def spark(self) -> SparkSession:
        with self._starting:  # a start begun by `start_spark` is waited for, not repeated
            if self._spark is None:
                from streamdi.spark import get_spark, jvm_started

                had_jvm = jvm_started()
                self._spark = get_spark(self.settings)
                self._own_jvm = not had_jvm and jvm_started()  # (not a session someone else in the process uses)
        return self._spark

    def forget_exited_spark(self) -> int | None:
        """After the driver JVM exited (killed, out of memory): forget the session, so that the next use of `spark`
        starts a new JVM. Returns the JVM's exit code, or None when it runs (or none was started)."""
        with self._starting:
            if self._spark is None:
                return None
            from streamdi.spark import forget_exited_jvm

            code = forget_exited_jvm()
            if code is not None:
                self._spark, self._own_jvm = None, False
                self.lake.spark = None  # the lake asks `spark` again (`spark_factory`)
            return code

    def spark_done(self) -> None:
        """The run needs Spark no more (its last stage is over): in a one-run context, stop the JVM Spark started in
        this process, in the background (the next use of `spark` waits for that and starts a new one)."""
        if self._stops_spark and self._own_jvm:
            threading.Thread(target=self._stop_spark, name="spark-stop", daemon=True).start()

    def _stop_spark(self) -> None:
        with self._starting:
            if self._spark is None or not self._own_jvm:
                return
            spark, self._spark, self._own_jvm = self._spark, None, False
            from streamdi.spark import stop_spark

            self.lake.spark = None  # the lake asks `spark` again (`spark_factory`)
            with contextlib.suppress(Exception):  # the load goes on either way; the process's exit ends the JVM
                stop_spark(spark)

    def start_spark(self) -> None:
        """Start Spark in a background thread, for a caller that knows it will need it: the JVM starts on the
        idle core while the process imports and parses. `spark` waits for that start; if it fails, `spark`
        starts again and raises the error where it is handled."""
        if self._spark is None:
            threading.Thread(target=self._start_quietly, name="spark-start", daemon=True).start()

    def _start_quietly(self) -> None:
        with contextlib.suppress(Exception):
            _ = self.spark

    @property
    def warehouse(self) -> Warehouse:
        with self._opening:  # an opening begun by `start_warehouse` is waited for, not repeated
            if self._warehouse is None:
                from streamdi.warehouse import open_warehouse

                self._warehouse = open_warehouse(self.settings)
        return self._warehouse

    def reset_warehouse(self) -> None:
        """Forget the opened warehouse: the next use opens it again (and starts the embedded server if it stopped)."""
        with self._opening:
            self._warehouse = None

    def start_warehouse(self) -> None:
        """Open the warehouse (starting the embedded PostgreSQL server if needed) in a background thread, for a
        caller that will migrate after staging and transforming: the server's start (~0.2 s, ~0.7 s with initdb on
        a new home) is then off the critical path. `warehouse` waits for it; if it fails, `warehouse` tries again
        and raises the error where it is handled."""
        if self._warehouse is None:
            threading.Thread(target=self._open_quietly, name="warehouse-start", daemon=True).start()

    def _open_quietly(self) -> None:
        with contextlib.suppress(Exception):
            _ = self.warehouse


def open_context(settings: Settings, *, one_run: bool = False) -> JobContext:
    """A context whose lake lives under `settings.lake_root`; nothing is started yet. `one_run`: the process makes
    one run and ends (`JobContext.spark_done`)."""
    return JobContext(settings, one_run=one_run)
