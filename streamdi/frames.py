"""The cache of snapshot DataFrames behind `streamdi.lake.Lake.read`.

`Lake.read` turns a Delta snapshot (its exact list of Parquet data files) into a Spark DataFrame. A Delta data
file never changes, so the DataFrame of a set of files stays valid as long as a snapshot has exactly those files;
building it again costs Spark a file listing and an analysis (about 60 ms) for tables that most micro-batches read
unchanged (the reference tables, Batch1's staged records). `FrameCache` keeps the most recently used of them,
keyed by (table path, files), for the SparkSession that built them.

It sits in the platform layer under `streamdi.lake` (its only user) and knows nothing of Delta: the caller hands
it the key and a function that builds the DataFrame. The same least-recently-used store (`Kept`) keeps `Lake`'s
pyarrow datasets of table versions, and (with a byte budget) the whole snapshots of its resident tables.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:  # pyspark is imported by whoever made a session
    from pyspark.sql import DataFrame, SparkSession

FRAMES_KEPT = 64  # snapshot DataFrames a cache keeps for reuse
V = TypeVar("V")


class Kept(Generic[V]):
    """The last `kept` values by key, least recently used dropped first; safe to share between threads. Used for
    snapshot DataFrames (`Lake.read`), the pyarrow datasets of table versions (`Lake._dataset`) and, with a
    `budget` on the sum of `weigh(value)`, the whole snapshots of resident tables (`Lake._whole`): a value
    heavier than the budget is returned but not kept."""

    def __init__(self, kept: int = FRAMES_KEPT, *, budget: int | None = None, weigh: Callable[[V], int] | None = None):
        self.kept = kept
        self.budget = budget
        self._weigh = weigh or (lambda _: 0)
        self._values: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value kept for `key` (now the most recently used), or None."""
        with self._lock:
            kept = self._values.get(key)
            if kept is None:
                return None
            self._values.move_to_end(key)
            return kept[0]

    def put(self, key: Hashable, value: V) -> V:
        """Keep `value` for `key` (unless it alone outweighs the budget), dropping the least recently used values
        beyond `kept` or the budget; returns `value`."""
        weight = self._weigh(value)
        with self._lock:
            if key in self._values:
                self._weight -= self._values.pop(key)[1]
            if self.budget is not None and weight > self.budget:
                return value
            self._values[key] = (value, weight)
            self._weight += weight
            while len(self._values) > self.kept or (self.budget is not None and self._weight > self.budget):
                self._weight -= self._values.popitem(last=False)[1][1]
        return value

    def get_or_build(self, key: Hashable, build: Callable[[], V], reusable: Callable[[V], bool] = lambda _: True) -> V:
        """The value kept for `key` when `reusable` accepts it, else `build()` (called without the lock), kept."""
        kept = self.get(key)
        if kept is not None and reusable(kept):
            return kept
        return self.put(key, build())

    def drop_where(self, doomed: Callable[[Hashable], bool]) -> None:
        """Drop the values whose key `doomed` accepts."""
        with self._lock:
            for key in [k for k in self._values if doomed(k)]:
                self._weight -= self._values.pop(key)[1]

    def weight_where(self, counted: Callable[[Hashable], bool]) -> int:
        """The weight of the values whose key `counted` accepts."""
        with self._lock:
            return sum(weight for key, (_, weight) in self._values.items() if counted(key))

    @property
    def weight(self) -> int:
        with self._lock:
            return self._weight

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)


class FrameCache(Kept["DataFrame"]):
    """Snapshot DataFrames, each reused only by the SparkSession that built it."""

    def frame(self, key: Hashable, spark: SparkSession, build: Callable[[], DataFrame]) -> DataFrame:
        return self.get_or_build(key, build, lambda frame: frame.sparkSession is spark)
