"""SCD type 2 history and surrogate keys: the conventions every dimension step keeps (the functions that keep them
work on Arrow tables in the driver, `jobs.scd2_arrow`).

The dimensions are kept by **recomputing the whole history of every natural key a micro-batch touches** from
all of that key's change records (every batch staged so far), then replacing the key's versions in the
Delta table (`jobs.scd2_arrow.version_changes`). A key's history is therefore a function of its change records in
their declared order only -- never of how the records were cut into micro-batches, of the order the micro-batches
arrived in, of the reading order or of retries -- which is what makes a dripped batch end exactly where the whole
batch ends. (Appending versions as changes arrive cannot promise that: a change that arrives late would have to
be slotted into history that was already written.)

Conventions (TPC-DI 1.1.0, 3.2 and 4.4.1):
- at most one version per natural key per day: of several changes on one day, the last one (in declared
  order) makes the day's version;
- a version's `enddate` is the next version's `effectivedate`; the open version ends on 9999-12-31 and is the
  only one with `iscurrent`;
- `batchid` is the TPC-DI batch of the change that made the version.

Surrogate keys are derived from the natural key and the version's effective date, so the same history always
gets the same keys (`jobs.scd2_arrow.surrogate_keys` for numeric natural keys: `natural * 100000 + days since
1900-01-01`; `jobs.scd2_arrow.hashed_surrogate_keys` for the others).
"""

from __future__ import annotations

import datetime as dt

END_OF_TIME = dt.date(9999, 12, 31)
EPOCH_1900 = dt.date(1900, 1, 1)
DAY_SLOTS = 100_000  # days since 1900-01-01 fit below this until the year 2173

# Column names of the change-record contract (see `jobs.scd2_arrow.build_versions`).
TS = "_ts"
BATCH = "_batch"


def present_flag(name: str) -> str:
    """Name of the optional boolean column that says whether a change record carries `name`."""
    return f"_has_{name}"
