"""The hashed surrogate key (`jobs.scd2_arrow.hashed_surrogate_keys`, DimSecurity's `sk_securityid`) against Spark's
own `xxhash64`, the function it declares it computes: the keys a warehouse loaded by the Spark transforms of earlier
versions holds stay the keys of the same history."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from jobs.scd2_arrow import hashed_surrogate_keys

pytestmark = pytest.mark.integration


def test_hashed_keys_equal_sparks_xxhash64_with_the_sign_bit_cleared(spark):
    rng = random.Random(7)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_. éü€"
    symbols = ["", "A", "AAAAAAAA", "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGH"]  # empty, short, one word, > 32 bytes
    symbols += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    days = [date(1800, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(9999, 12, 31)]
    days += [date(1900, 1, 1) + timedelta(days=rng.randint(0, 60_000)) for _ in range(len(symbols) - 4)]
    rows = list(zip(symbols, days, strict=True))

    ours = hashed_surrogate_keys("dimsecurity", pa.array(symbols), pa.array(days, pa.date32())).to_pylist()

    frame = spark.createDataFrame(rows, "symbol string, day date").coalesce(1)
    hashed = F.xxhash64(F.lit("dimsecurity"), F.col("symbol"), F.col("day")).bitwiseAND(F.lit(0x7FFFFFFFFFFFFFFF))
    spark_keys = {(r.symbol, r.day): r.k for r in frame.select("symbol", "day", hashed.alias("k")).collect()}
    assert ours == [spark_keys[row] for row in rows]
    assert all(k >= 0 for k in ours)
    assert len(set(ours)) == len(set(rows))
