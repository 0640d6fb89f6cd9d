"""The cache of snapshot DataFrames behind `streamdi.lake.Lake.read`.

`Lake.read` turns a Delta snapshot (its exact list of Parquet data files) into a Spark DataFrame. A Delta data
file never changes, so the DataFrame of a set of files stays valid as long as a snapshot has exactly those files;
building it again costs Spark a file listing and an analysis (about 60 ms) for tables that most micro-batches read
unchanged (the reference tables, Batch1's staged records). `FrameCache` keeps the most recently used of them,
keyed by (table path, files), for the SparkSession that built them.

It sits in the platform layer under `streamdi.lake` (its only user) and knows nothing of Delta: the caller hands
it the key and a function that builds the DataFrame. The same least-recently-used store (`Kept`) keeps `Lake`'s
pyarrow datasets of table versions.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from pyspark.sql import DataFrame, SparkSession

FRAMES_KEPT = 64  # snapshot DataFrames a cache keeps for reuse
V = TypeVar("V")


class Kept(Generic[V]):
    """The last `kept` values by key, least recently used dropped first; safe to share between threads. Used for
    snapshot DataFrames (`Lake.read`) and for the pyarrow datasets of table versions (`Lake._dataset`)."""

    def __init__(self, kept: int = FRAMES_KEPT) -> None:
        self.kept = kept
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_build(self, key: Hashable, build: Callable[[], V], reusable: Callable[[V], bool] = lambda _: True) -> V:
        """The value kept for `key` when `reusable` accepts it, else `build()` (called without the lock), kept."""
        with self._lock:
            kept = self._values.get(key)
            if kept is not None and reusable(kept):
                self._values.move_to_end(key)
                return kept
        value = build()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self.kept:
                self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)


class FrameCache(Kept[DataFrame]):
    """Snapshot DataFrames, each reused only by the SparkSession that built it."""

    def frame(self, key: Hashable, spark: SparkSession, build: Callable[[], DataFrame]) -> DataFrame:
        return self.get_or_build(key, build, lambda frame: frame.sparkSession is spark)
