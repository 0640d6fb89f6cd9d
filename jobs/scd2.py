"""SCD type 2 history and surrogate keys, as pure DataFrame functions shared by the dimension steps.

The dimensions are kept by **recomputing the whole history of every natural key a micro-batch touches** from
all of that key's change records (every batch staged so far), then replacing the key's versions in the Delta
table (`commit_versions`). A key's history is therefore a function of its change records in their declared
order only -- never of how the records were cut into micro-batches, of the order the micro-batches arrived in,
of Spark's partitioning or of retries -- which is what makes a dripped batch end exactly where the whole batch
ends. (Appending versions as changes arrive cannot promise that: a change that arrives late would have to
be slotted into history that was already written.)

Conventions (TPC-DI 1.1.0, 3.2 and 4.4.1):
- at most one version per natural key per day: of several changes on one day, the last one (in declared
  order) makes the day's version;
- a version's `enddate` is the next version's `effectivedate`; the open version ends on 9999-12-31 and is the
  only one with `iscurrent`;
- `batchid` is the TPC-DI batch of the change that made the version.

Surrogate keys are derived from the natural key and the version's effective date, so the same history always
gets the same keys (`surrogate_key` for numeric natural keys, `hashed_surrogate_key` for the others).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from schemas.model import Table

END_OF_TIME = dt.date(9999, 12, 31)
EPOCH_1900 = dt.date(1900, 1, 1)
DAY_SLOTS = 100_000  # days since 1900-01-01 fit below this until the year 2173

# Column names of the change-record contract (see build_versions).
TS = "_ts"
BATCH = "_batch"


def surrogate_key(natural: str | Column, day: str | Column) -> Column:
    """`natural * 100000 + days since 1900-01-01` of `day`: unique per (key, day), readable, no collisions.

    For numeric natural keys below 9.2e13 (CIKs, customer, account and employee ids).
    """
    natural = F.col(natural) if isinstance(natural, str) else natural
    day = F.col(day) if isinstance(day, str) else day
    return natural.cast("bigint") * F.lit(DAY_SLOTS) + F.datediff(day, F.lit(EPOCH_1900)).cast("bigint")


def hashed_surrogate_key(tag: str, natural: Sequence[str | Column], day: str | Column) -> Column:
    """A non-negative 63-bit hash of `(tag, natural key, day)`, for natural keys that are not numbers.

    Spark's xxhash64 is a fixed function of its input (fixed seed), so the key is the same in every run.
    """
    cols = [F.col(c) if isinstance(c, str) else c for c in natural]
    day = F.col(day) if isinstance(day, str) else day
    return F.xxhash64(F.lit(tag), *cols, day).bitwiseAND(F.lit(0x7FFFFFFFFFFFFFFF))


def present_flag(name: str) -> str:
    """Name of the optional boolean column that says whether a change record carries `name`."""
    return f"_has_{name}"


def build_versions(
    changes: DataFrame,
    key: Sequence[str],
    order: Sequence[str],
    values: Sequence[str],
) -> DataFrame:
    """Versions of every key in `changes`, one per key per day.

    `changes` holds one row per change record with: the `key` columns; `_ts` (timestamp the change takes
    effect); `_batch` (TPC-DI batch); the `values` columns; optionally `_has_<value>` booleans for partial
    updates (a record without the flag set carries the value; with the flag false the value is unchanged, so
    the previous record's value is carried forward -- the way UPDCUST carries only the fields that change).
    `order` names the columns that sort a key's records in their declared order (e.g. `_batch`, `_ts`, then
    the file position); it must be total per key.

    Returns the `key` columns, the `values` (as of the day's last change), `effectivedate`, `enddate`,
    `iscurrent` and `batchid`.
    """
    key = list(key)
    order_cols = [F.col(o) for o in order]
    running = Window.partitionBy(*key).orderBy(*order_cols).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    filled = []
    for v in values:
        flag = present_flag(v)
        if flag in changes.columns:
            carried = F.last(F.when(F.col(flag), F.struct(F.col(v).alias("v"))), ignorenulls=True).over(running)
            filled.append(carried["v"].alias(v))
        else:
            filled.append(F.col(v))
    day = F.to_date(F.col(TS))
    extra = [c for c in dict.fromkeys([*order, BATCH]) if c not in key]
    states = changes.select(*key, *extra, day.alias("effectivedate"), *filled)
    # the last change of each day makes the day's version
    per_day = Window.partitionBy(*key, "effectivedate").orderBy(*[c.desc() for c in order_cols])
    last_of_day = states.withColumn("_n", F.row_number().over(per_day)).where(F.col("_n") == 1)
    chain = Window.partitionBy(*key).orderBy("effectivedate")
    end = F.lead("effectivedate").over(chain)
    return last_of_day.select(
        *key,
        *values,
        F.col("effectivedate"),
        F.coalesce(end, F.lit(END_OF_TIME)).alias("enddate"),
        end.isNull().alias("iscurrent"),
        F.col(BATCH).cast("int").alias("batchid"),
    )


def valid_at(
    facts: DataFrame,
    fact_key: str | Sequence[str],
    day: str | Column,
    dim: DataFrame,
    dim_key: str | Sequence[str],
    take: dict[str, str],
) -> DataFrame:
    """Left-join `facts` to the `dim` version valid on `day` (effectivedate <= day < enddate).

    `fact_key`/`dim_key` are the matching natural key columns; `take` maps dim columns to the names they get
    in the result (e.g. `{"sk_customerid": "sk_customerid"}`). Unmatched facts get NULLs.
    """
    fact_key = [fact_key] if isinstance(fact_key, str) else list(fact_key)
    dim_key = [dim_key] if isinstance(dim_key, str) else list(dim_key)
    day_col = F.col(day) if isinstance(day, str) else day
    d = dim.select(
        *[F.col(k).alias(f"_dk{i}") for i, k in enumerate(dim_key)],
        F.col("effectivedate").alias("_deff"),
        F.col("enddate").alias("_dend"),
        *[F.col(src).alias(dst) for src, dst in take.items()],
    )
    f = facts.withColumn("_day", day_col)
    cond = [f[fk] == d[f"_dk{i}"] for i, fk in enumerate(fact_key)]
    cond += [d["_deff"] <= f["_day"], f["_day"] < d["_dend"]]
    joined = f.join(d, cond, "left")
    return joined.drop(*[f"_dk{i}" for i in range(len(dim_key))], "_deff", "_dend", "_day")


def version_changes(
    current: DataFrame, versions: DataFrame, table: Table, natural: Sequence[str], touched: DataFrame
) -> tuple[DataFrame, DataFrame]:
    """What to commit so that the touched keys' versions in `table` become `versions`.

    `current` is the table as it is; `touched` holds the natural keys whose history was recomputed (a key
    with no version left in `versions` loses all its rows). Returns `(upserts, deletes)`: every recomputed
    version (the MERGE leaves equal rows alone), and the surrogate keys of old versions that no longer exist.
    """
    natural = list(natural)
    sk = list(table.key)
    old = current.join(touched.select(*natural).distinct(), natural, "left_semi").select(*sk)
    deletes = old.join(versions.select(*sk), sk, "left_anti")
    return versions.select(*table.column_names), deletes
