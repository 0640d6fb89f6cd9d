"""The cache of snapshot DataFrames behind `streamdi.lake.Lake.read`.

`Lake.read` turns a Delta snapshot (its exact list of Parquet data files) into a Spark DataFrame. A Delta data
file never changes, so the DataFrame of a set of files stays valid as long as a snapshot has exactly those files;
building it again costs Spark a file listing and an analysis (about 60 ms) for tables that most micro-batches read
unchanged (the reference tables, Batch1's staged records). `FrameCache` keeps the most recently used of them,
keyed by (table path, files), for the SparkSession that built them.

It sits in the platform layer under `streamdi.lake` (its only user) and knows nothing of Delta: the caller hands
it the key and a function that builds the DataFrame.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from pyspark.sql import DataFrame, SparkSession

FRAMES_KEPT = 64  # snapshot DataFrames a cache keeps for reuse


class FrameCache:
    """The last `kept` DataFrames by key, least recently used dropped first; safe to share between threads."""

    def __init__(self, kept: int = FRAMES_KEPT) -> None:
        self.kept = kept
        self._frames: OrderedDict[Hashable, DataFrame] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_build(self, key: Hashable, spark: SparkSession, build: Callable[[], DataFrame]) -> DataFrame:
        """The DataFrame kept for `key` when `spark` built it, else `build()` (called without the lock), kept."""
        with self._lock:
            kept = self._frames.get(key)
            if kept is not None and kept.sparkSession is spark:
                self._frames.move_to_end(key)
                return kept
        frame = build()
        with self._lock:
            self._frames[key] = frame
            while len(self._frames) > self.kept:
                self._frames.popitem(last=False)
        return frame

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)
