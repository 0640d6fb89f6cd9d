"""streamdi on a real Spark cluster: a standalone master and two workers started from the pyspark wheel on loopback
(`streamdi.spark_standalone`), the driver a `streamdi load` process with `STREAMDI_SPARK_MASTER` set to the master.
The lake is a path every process shares. Batch1 and Batch2 loaded there give the same warehouse, Delta and
PostgreSQL, row for row, as the reference run on `local[2]` (tests/e2e/conftest.py), both workers ran tasks, and
the executors parsed and wrote the staged sources where the reference did it in its driver."""

from __future__ import annotations

import pytest
from cli_runs import load, snapshot

from streamdi.spark_standalone import loopback_cluster

pytestmark = [pytest.mark.e2e]


def test_a_load_on_a_two_worker_cluster_equals_the_local_load(data, reference, tmp_path):
    expected, _, _ = reference
    home = tmp_path / "home"
    with loopback_cluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster:
        state = cluster.state()
        assert [w["cores"] for w in state["workers"]] == [1, 1]
        for batch in (1, 2):
            assert load(home, data, batch, master=cluster.url, executors=True) == 0
        assert cluster.workers_that_ran_tasks() == ["worker-1", "worker-2"]
        apps = cluster.state()["completedapps"]
        # both loads ran Spark jobs: Batch2's parses its bag sources (Prospect, BatchDate) on the executors (its CDC
        # sources are totally ordered: their contract check reads the keys in order, in the driver)
        assert len(apps) == 2
    assert snapshot(home) == expected
    # the staged sources' pieces, one file each, written by the executors (`STREAMDI_EXECUTOR_PARSE_BYTES=0`)
    for table in ("trade", "dailymarket", "prospect"):
        assert list((home / "lake" / "staging" / table).glob(f"stage-{table}-v*-*.snappy.parquet")), table
