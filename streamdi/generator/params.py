"""Sizes and calendar of a generated data set, derived from the scale factor alone.

Counts per scale factor follow the official generator's parameters (Generator_audit.csv of DIGen 1.1.0):
about 1.4-1.5 million Batch1 source rows per SF, each incremental batch about 0.4% of that. Dates follow the
official calendar: Batch1's BatchDate is 2017-07-07, each incremental batch the next day; trades, watches and
market data start on 2012-07-07, customer management on 2007-07-07, FINWIRE covers 1967Q1..2017Q2.
"""

from __future__ import annotations

import datetime as dt
import zlib
from dataclasses import dataclass

import numpy as np

DATE_BEGIN = dt.date(1950, 1, 1)  # Date.txt
DATE_END = dt.date(2020, 12, 31)
CM_BEGIN = dt.datetime(2007, 7, 7)  # first CustomerMgmt action
HISTORY_BEGIN = dt.datetime(2012, 7, 7)  # first trade, watch and market day
FIRST_BATCH_DATE = dt.date(2017, 7, 7)  # BatchDate.txt of Batch1
FINWIRE_FIRST_QUARTER = (1967, 1)
FINWIRE_LAST_QUARTER = (2017, 2)


def epoch_seconds(value: dt.datetime | dt.date) -> int:
    if not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    return int((value - dt.datetime(1970, 1, 1)).total_seconds())


@dataclass(frozen=True)
class Params:
    """Everything the generator derives from (scale factor, seed, number of batches)."""

    scale_factor: float
    seed: int = 0
    batches: int = 3

    def __post_init__(self) -> None:
        if self.scale_factor <= 0:
            raise ValueError(f"scale factor must be positive, got {self.scale_factor}")
        if self.batches < 1:
            raise ValueError(f"at least one batch (the historical one) is needed, got {self.batches}")

    def count(self, per_sf: float, minimum: int = 1) -> int:
        """round(per_sf x SF), at least `minimum`, so fractional scale factors still give a usable data set."""
        return max(minimum, int(round(per_sf * self.scale_factor)))

    def rng(self, *names: str | int) -> np.random.Generator:
        """A generator of its own for one file or chunk: the output never depends on call order or workers."""
        keys = [zlib.crc32(str(n).encode()) for n in names]
        return np.random.default_rng(np.random.SeedSequence([self.seed, *keys]))

    def batch_date(self, batch: int) -> dt.date:
        return FIRST_BATCH_DATE + dt.timedelta(days=batch - 1)

    def window(self, batch: int) -> tuple[int, int]:
        """[start, end) in epoch seconds of the events a batch delivers (Batch1 = all history)."""
        end = epoch_seconds(self.batch_date(batch) + dt.timedelta(days=1))
        start = epoch_seconds(CM_BEGIN if batch == 1 else self.batch_date(batch))
        return start, end

    @property
    def horizon(self) -> int:
        """End (epoch seconds, exclusive) of the last generated batch."""
        return self.window(self.batches)[1]

    # sizes (per SF, from the official parameters)
    @property
    def employees(self) -> int:
        return self.count(5000, 20)

    @property
    def cm_actions(self) -> int:
        return self.count(5000, 40)

    @property
    def companies(self) -> int:
        return self.count(500, 4)

    @property
    def securities(self) -> int:
        """Securities in FINWIRE (official FWSECScaling 0.8 per 1000); all are traded."""
        return self.count(800, 3)

    @property
    def holdings(self) -> int:
        """Buy/sell pairs over the whole history (about 2 trades each, plus canceled limit orders)."""
        return self.count(61000, 10)

    @property
    def canceled(self) -> int:
        return self.count(7600, 1)

    @property
    def watches(self) -> int:
        return self.count(170000, 10)

    @property
    def prospects(self) -> int:
        return self.count(5000, 20)

    @property
    def customer_changes(self) -> int:
        """Customer.txt lines per incremental batch."""
        return self.count(5, 3)

    @property
    def account_changes(self) -> int:
        return self.count(10, 3)
